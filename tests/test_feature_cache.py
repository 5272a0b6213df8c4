"""Feature cache robustness: damaged caches refused and rebuilt, temporaries of killed builds removed
(builds still running kept), progress printed while building."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from run_helpers import FakeImages

from grounding import feature_cache as fcache
from grounding.encoders import load_visual_backbone
from grounding.utils.io import atomic_path


@pytest.fixture
def world(tmp_path):
    torch.manual_seed(0)
    return load_visual_backbone("tiny_cnn", weights=None), FakeImages(tmp_path), tmp_path / "cache"


def build(backbone, ds, root, **kw):
    return fcache.build_or_load(backbone, ds, root, batch_size=2, **kw)


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == fcache.__name__ and r.levelno == logging.WARNING]


def test_format_size_hand_computed():
    assert fcache.format_size(812) == "812 B"
    assert fcache.format_size(1234) == "1.2 kB"
    assert fcache.format_size(1_200_000_000) == "1.2 GB"
    assert fcache.format_size(3.4e9) == "3.4 GB"


# ------------------------------------------------------------------------------ damaged caches
def test_truncated_cache_refused_by_open_cache_and_rebuilt(world, caplog, capsys):
    backbone, ds, root = world
    path = build(backbone, ds, root).path
    fresh = np.array(fcache.open_cache(path))
    data = path / "features.npy"
    full = data.stat().st_size
    assert full == 128 + 2 * math.prod(fresh.shape)  # .npy 1.0 header (128 bytes) + float16 values
    os.truncate(data, full // 2)  # a copy or a disk that stopped half way
    expected_problem = (f"truncated: features.npy holds {fcache.format_size(full // 2)} of "
                        f"{fcache.format_size(full)} expected")
    assert fcache.cache_problem(path) == expected_problem

    # Opened directly: one error naming the folder, the problem and the fix (not numpy's mmap message).
    with pytest.raises(fcache.FeatureCacheError) as err:
        fcache.open_cache(path)
    assert str(err.value) == (f"feature cache {path} cannot be used ({expected_problem}); rerun the command to rebuild "
                              "it (a damaged cache is replaced automatically) or delete the folder.")
    with pytest.raises(fcache.FeatureCacheError, match="truncated"):
        build(backbone, ds, root, build=False)  # a non-building DDP rank refuses it too

    # Through build_or_load: one warning, then the same folder rebuilt with the same values.
    capsys.readouterr()
    caplog.set_level(logging.WARNING, logger=fcache.__name__)
    again = build(backbone, ds, root)
    assert warnings_of(caplog) == [f"feature cache {path} is damaged ({expected_problem}); removing it and rebuilding"]
    assert "building feature cache" in capsys.readouterr().err
    assert again.path == path and data.stat().st_size == full
    assert np.array_equal(np.array(again.array), fresh)
    caplog.clear()
    assert build(backbone, ds, root).path == path and warnings_of(caplog) == []  # sound now: reused quietly


def corrupt_magic(path):
    with open(path / "features.npy", "r+b") as f:
        f.write(b"\x00NOPE!")


def corrupt_header_dict(path):
    raw = (path / "features.npy").read_bytes()
    (path / "features.npy").write_bytes(raw.replace(b"'shape'", b"'shap\x01'", 1))


def header_says_float32(path):
    raw = (path / "features.npy").read_bytes()
    (path / "features.npy").write_bytes(raw.replace(b"'<f2'", b"'<f4'", 1))


def header_says_fewer_images(path):
    raw = (path / "features.npy").read_bytes()
    (path / "features.npy").write_bytes(raw.replace(b"'shape': (5,", b"'shape': (4,", 1))


def meta_garbled(path):
    (path / "meta.json").write_text('{"complete": tr')


def meta_other_key(path):
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "key": "0" * 40}))


@pytest.mark.parametrize("corrupt, problem", [
    (corrupt_magic, "features.npy header unreadable"),
    (corrupt_header_dict, "features.npy header unreadable"),
    (header_says_float32, "truncated: features.npy holds"),  # the header promises twice the bytes
    (header_says_fewer_images, "oversized: features.npy holds"),
    (meta_garbled, "meta.json unreadable"),
    (meta_other_key, "inconsistent: built for key 0000"),
])
def test_damaged_cache_rebuilt_with_a_message(world, caplog, corrupt, problem):
    backbone, ds, root = world
    path = build(backbone, ds, root).path
    fresh = np.array(fcache.open_cache(path))
    corrupt(path)
    caplog.set_level(logging.WARNING, logger=fcache.__name__)
    again = build(backbone, ds, root)
    (message,) = warnings_of(caplog)
    assert message.startswith(f"feature cache {path} is damaged ({problem}") and message.endswith("rebuilding")
    assert again.path == path and fcache.cache_problem(path) is None
    assert np.array_equal(np.array(again.array), fresh)


def test_open_cache_inconsistent_meta_names_folder(world):
    backbone, ds, root = world
    path = build(backbone, ds, root).path
    shape = list(fcache.open_cache(path).shape)
    (path / "meta.json").write_text(json.dumps({"complete": True, "shape": [4, *shape[1:]], "dtype": "float16"}))
    with pytest.raises(ValueError) as err:  # FeatureCacheError is a ValueError
        fcache.open_cache(path)
    assert str(err.value).startswith(f"feature cache {path} cannot be used (inconsistent: meta.json records shape "
                                     f"[4, {', '.join(map(str, shape[1:]))}] float16, features.npy holds {shape} float16); ")


# ------------------------------------------------------------------------------ the key: content, not mtimes
def test_key_survives_new_mtimes_and_changes_with_the_bytes(world):
    """A data folder copied afresh (new mtimes, same bytes) keeps its cache; a photo edited in place, at either end
    of a large file or anywhere in a small one, or resized, gets a new key. (A same-size edit inside a large file's
    middle alone would keep it: the price of not reading every byte of COCO at each run.)"""
    backbone, ds, _ = world
    n = fcache.FINGERPRINT_BYTES
    rng = np.random.default_rng(0)
    ds.image_paths[0].write_bytes(rng.integers(0, 256, 3 * n, dtype=np.uint8).tobytes())  # large: ends hashed
    ds.image_paths[2].write_bytes(rng.integers(0, 256, 3 * n // 2, dtype=np.uint8).tobytes())  # up to 2n: whole
    key = fcache.cache_key(backbone, ds)
    for p in ds.image_paths:
        os.utime(p, (time.time() + 3600,) * 2)
    assert fcache.cache_key(backbone, ds) == key

    def edited(path, offset, value=None):
        data = bytearray(path.read_bytes())
        original = bytes(data)
        if value is None:
            data.append(0)
        else:
            data[offset] ^= value
        path.write_bytes(bytes(data))
        changed = fcache.cache_key(backbone, ds)
        path.write_bytes(original)
        return changed

    assert edited(ds.image_paths[0], 0, 1) != key  # header
    assert edited(ds.image_paths[0], 3 * n - 1, 1) != key  # end of the scan
    assert edited(ds.image_paths[0], 0, None) != key  # size
    assert edited(ds.image_paths[1], 0, 255) != key  # a small file, hashed whole
    assert edited(ds.image_paths[2], n + 1, 1) != key  # under 2n bytes every byte counts, past the first n too
    assert fcache.cache_key(backbone, ds) == key
    assert fcache.file_fingerprint(ds.image_paths[1]) == [1, hashlib.blake2b(bytes([1]), digest_size=16).hexdigest()]


# ------------------------------------------------------------------------------ temporaries of killed builds
class Abort(Exception):
    pass


def atomic_temp_name(target) -> str:
    """The temporary name grounding.utils.io.atomic_path gives a folder being built at ``target``."""
    try:
        with atomic_path(target) as tmp:
            raise Abort
    except Abort:
        return tmp.name


def temp_folder(root, final_name, owner=None, age_s=0.0, size=1000):
    """A temporary build folder named like atomic_path's (``.<name>.<random>.tmp``) with ``size`` bytes of features."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{final_name}.", suffix=".tmp", dir=root))
    (tmp / "features.npy").write_bytes(b"\x00" * size)
    if owner is not None:
        (tmp / fcache.OWNER_FILE).write_text(json.dumps(owner))
    if age_s:
        past = time.time() - age_s
        for p in (*tmp.iterdir(), tmp):
            os.utime(p, (past, past))
    return tmp


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()  # reaped: no process has this pid now
    return proc.pid


def test_stale_temporaries_removed_live_ones_kept(world, caplog):
    backbone, ds, root = world
    root.mkdir()
    me = fcache.owner_record()
    name = "tiny_cnn-0123456789abcdef"  # any cache folder of this root, not only the one being built
    assert fcache.TEMP_NAME.match(atomic_temp_name(root / name))  # the pattern is atomic_path's
    hours = 3600.0
    stale = {
        "dead": temp_folder(root, name, {**me, "pid": (dead := dead_pid())}),
        "beyond_pid_max": temp_folder(root, name, {**me, "pid": 2**22 + 1}, size=2500),  # Linux's PID_MAX_LIMIT + 1
        "orphan": temp_folder(root, name, None, age_s=7 * hours),  # no owner file (an older build), 7 h old
        "other_host_old": temp_folder(root, name, {**me, "host": "elsewhere"}, age_s=7 * hours),
    }
    live = {
        "me": temp_folder(root, name, me),  # a concurrent build of this process: never touched
        "fresh_orphan": temp_folder(root, name, None, age_s=1 * hours),
        "other_host_fresh": temp_folder(root, name, {**me, "host": "elsewhere"}, age_s=1 * hours),
    }
    if me["pid_start"] is not None:  # Linux: a pid reused by a later process is told apart by its start time
        stale["reused_pid"] = temp_folder(root, name, {**me, "pid_start": me["pid_start"] + 1})
    unrelated = [root / ".notes", root / ".something.abcdefgh.tmp", root / "tiny_cnn-fedcba9876543210"]
    for p in unrelated:
        p.mkdir()
        os.utime(p, (time.time() - 9 * hours,) * 2)

    sizes = {k: fcache.format_size(fcache.folder_size(p)) for k, p in stale.items()}  # on disk: whole blocks
    assert fcache.folder_size(stale["beyond_pid_max"]) >= 2500 + len(json.dumps(me))

    caplog.set_level(logging.WARNING, logger=fcache.__name__)
    loader = build(backbone, ds, root)
    assert not any(p.exists() for p in stale.values())
    assert all(p.is_dir() for p in (*live.values(), *unrelated))
    messages = warnings_of(caplog)
    assert len(messages) == len(stale)  # one line per removed folder
    removed = "feature cache: removed the abandoned build folder"
    assert f"{removed} {stale['dead']} ({sizes['dead']} on disk; its build, pid {dead} is gone)" in messages
    assert f"{removed} {stale['beyond_pid_max']} ({sizes['beyond_pid_max']} on disk; its build, pid {2**22 + 1} is gone)" \
        in messages
    assert f"{removed} {stale['orphan']} ({sizes['orphan']} on disk; no owner file, untouched for 7.0 h)" in messages
    assert f"{removed} {stale['other_host_old']} ({sizes['other_host_old']} on disk; owner on host elsewhere, untouched " \
        "for 7.0 h)" in messages
    assert fcache.cache_problem(loader.path) is None and not (loader.path / fcache.OWNER_FILE).exists()


class SweepingBackbone(torch.nn.Module):
    """A backbone that, mid-build, looks at its own temporary folder and sweeps the root as a second process would."""

    name = "sweeper"

    def __init__(self, inner, root):
        super().__init__()
        self.inner, self.root, self.seen = inner, root, []

    def forward(self, x):
        temps = [p for p in self.root.iterdir() if fcache.TEMP_NAME.match(p.name)]
        self.seen.append(([json.loads((p / fcache.OWNER_FILE).read_text()) for p in temps],
                          fcache.remove_stale_temporaries(self.root)))
        return self.inner(x)


def test_running_build_owns_its_temporary_and_survives_a_sweep(world):
    backbone, ds, root = world
    sweeper = SweepingBackbone(backbone, root)
    loader = build(sweeper, ds, root)
    assert len(sweeper.seen) == 3  # 5 images in batches of 2
    for owners, removed in sweeper.seen:
        assert [(o["pid"], o["host"]) for o in owners] == [(os.getpid(), fcache.owner_record()["host"])]
        assert removed == []
    assert sorted(p.name for p in loader.path.iterdir()) == ["features.npy", "meta.json"]
    assert not any(fcache.TEMP_NAME.match(p.name) for p in root.iterdir())


# ------------------------------------------------------------------------------ progress
def test_progress_lines_while_building(world, capsys):
    backbone, ds, root = world
    capsys.readouterr()
    loader = build(backbone, ds, root)
    lines = capsys.readouterr().err.splitlines()
    size = fcache.format_size((loader.path / "features.npy").stat().st_size)
    assert lines[0] == f"building feature cache {loader.path}: 5 images with tiny_cnn on cpu"
    # batches of 2 -> 2/5 (40 %) and 4/5 (80 %) pass a new tenth; 5/5 is the end line
    assert [ln.split(",")[0] for ln in lines[1:3]] == ["  feature cache: 2/5 images (40 %)", "  feature cache: 4/5 images (80 %)"]
    assert lines[3].startswith(f"feature cache {loader.path} built: 5 images, {size} in ") and lines[3].endswith(" s")
    assert len(lines) == 4
    build(backbone, ds, root)
    assert capsys.readouterr().err == ""  # reusing a sound cache prints nothing


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_on_a_terminal_plain_lines_otherwise(tmp_path):
    plain, term = io.StringIO(), Terminal()
    for stream in (plain, term):
        progress = fcache.BuildProgress(tmp_path / "c", 20, "cnn", "cpu", stream=stream)
        for _ in range(10):
            progress.update(2)
        progress.close(4096)
    plain_lines = plain.getvalue().splitlines()
    assert [ln.split(" (")[0] for ln in plain_lines[1:-1]] == [f"  feature cache: {k}/20 images" for k in range(2, 20, 2)]
    assert plain_lines[-1].startswith(f"feature cache {tmp_path / 'c'} built: 20 images, 4.1 kB in ")
    out = term.getvalue()
    assert "feature cache:   0%|" in out and "/20 images (" not in out  # the tqdm bar instead of lines
    assert out.startswith(f"building feature cache {tmp_path / 'c'}: 20 images with cnn on cpu\n")


# ------------------------------------------------------------------------------ list and prune
DAY = 86400.0


def caches_of_three_backbones(ds, root) -> list[Path]:
    """Three sound cache folders of ``ds`` (one per tiny backbone, each seeded differently)."""
    paths = []
    for seed in range(3):
        torch.manual_seed(seed)
        paths.append(build(load_visual_backbone("tiny_cnn", weights=None), ds, root).path)
    assert len(set(paths)) == 3
    return paths


def last_used(path: Path, days_ago: float) -> None:
    t = time.time() - days_ago * DAY
    os.utime(path / "meta.json", (t, t))


def test_reuse_and_open_mark_a_cache_used(world):
    backbone, ds, root = world
    path = build(backbone, ds, root).path
    for use in (lambda: build(backbone, ds, root), lambda: fcache.open_cache(path)):
        last_used(path, 40)
        use()
        assert time.time() - (path / "meta.json").stat().st_mtime < 60
    assert fcache.cache_problem(path) is None  # marking touches the mtime only


def test_prune_removes_damaged_abandoned_and_unused_keeps_recent_and_live(world):
    _backbone, ds, root = world
    old, recent, damaged = caches_of_three_backbones(ds, root)
    last_used(old, 40)
    last_used(recent, 10)
    os.truncate(damaged / "features.npy", 1000)
    last_used(damaged, 2)
    abandoned = temp_folder(root, old.name, {**fcache.owner_record(), "pid": dead_pid()})
    running = temp_folder(root, old.name, fcache.owner_record())  # a build of this process
    everything = {old, recent, damaged, abandoned, running}

    removed, kept = fcache.prune(root, unused_days=30, dry_run=True)
    assert {e.path for e, _ in removed} == {old, damaged, abandoned}
    assert {e.path for e in kept} == {recent, running}
    assert all(p.exists() for p in everything)  # a dry run removes nothing
    reasons = {e.path: r for e, r in removed}
    assert reasons[old].startswith("unused for 40.0 days")
    assert reasons[damaged].startswith("damaged (truncated: features.npy holds 1.0 kB of ")
    assert reasons[abandoned].startswith("abandoned build (its build, pid")

    fcache.prune(root, unused_days=30)
    assert {p for p in everything if p.exists()} == {recent, running}
    assert fcache.cache_problem(recent) is None


def test_prune_max_size_removes_least_recently_used_first_never_one_in_use(world):
    _backbone, ds, root = world
    a, b, c = caches_of_three_backbones(ds, root)  # the same size each
    size = fcache.folder_size(a)
    for path, days in ((a, 3), (b, 2), (c, 1)):
        last_used(path, days)
    removed, kept = fcache.prune(root, unused_days=30, max_size=size, dry_run=True)
    assert [e.path for e, _ in removed] == [a, b]  # least recently used first, until one cache's size is left
    assert removed[0][1] == f"least recently used while the caches exceed {fcache.format_size(size)}"
    assert [e.path for e in kept] == [c]

    fcache.mark_used(a)  # used a minute ago: a job may still read it
    removed, _ = fcache.prune(root, unused_days=0, max_size=0, dry_run=True)
    assert {e.path for e, _ in removed} == {b, c}

    last_used(a, 3)
    mapped = np.load(a / "features.npy", mmap_mode="r")  # a running job maps it (this process)
    if sys.platform.startswith("linux"):
        assert a.resolve() in fcache.mapped_cache_folders()
        removed, _ = fcache.prune(root, unused_days=0, max_size=0)
        assert {e.path for e, _ in removed} == {b, c} and a.exists() and not b.exists()
    del mapped


def test_parse_size_hand_computed():
    assert fcache.parse_size("2GB") == 2_000_000_000
    assert fcache.parse_size("500 mb") == 500_000_000
    assert fcache.parse_size("1.5G") == 1_500_000_000
    assert fcache.parse_size("4096") == 4096
    with pytest.raises(ValueError, match="'2 parsecs' is not a size"):
        fcache.parse_size("2 parsecs")


def test_list_and_prune_commands(world, capsys):
    _backbone, ds, root = world
    old, recent, _third = caches_of_three_backbones(ds, root)
    last_used(old, 40)
    assert fcache.main(["list", "--root", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [ln for ln in out if ln.startswith("| tiny_cnn-")]
    assert len(rows) == 3 and rows[-1].startswith(f"| {old.name} | tiny_cnn | 5 | ")  # most recently used first
    assert f"| {fcache.format_time(time.time() - 40 * DAY)} | sound | {ds.image_paths[0]} |" in rows[-1]
    assert out[-1] == f"3 folders, {fcache.format_size(sum(fcache.folder_size(p) for p in root.iterdir()))}"

    assert fcache.main(["prune", "--root", str(root), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"would remove {old} (") and out[0].endswith("): unused for 40.0 days")
    assert out[-1].startswith("would remove 1 folders, ") and old.exists()
    assert fcache.main(["prune", "--root", str(root)]) == 0
    assert capsys.readouterr().out.startswith(f"removed {old} (") and not old.exists() and recent.exists()

    for argv, message in ((["prune", "--root", str(root), "--max-size", "2 parsecs"], "'2 parsecs' is not a size"),
                          (["prune", "--root", str(root), "--unused-days", "-1"], "-1 is negative"),
                          (["list", "--root", str(root / "nowhere")], "no such folder")):
        assert fcache.main(argv) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and message in err[0]
    assert sorted(p.name for p in root.iterdir()) == sorted([recent.name, _third.name])  # bad input removed nothing

"""A checkpoint someone sends you never runs code: a ``.ckpt`` whose pickle would create a marker file when loaded
unsafely is given to every command and reader that loads a checkpoint; each refuses it with one line naming the file
and what it needs (exit 2 for commands), and the marker never appears. ``GROUNDING_TRUST_CHECKPOINTS=1`` is the only
way to load it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_bad_input import inputs, run_entry  # noqa: F401 - the fixture, and commands run as their entry points run

from grounding.checkpoints import UnsafeCheckpointError, load_checkpoint_file, read_checkpoint


class Payload:
    """Unpickled unsafely, this opens (creates) ``marker``: a stand-in for any code a hostile pickle runs."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


@pytest.fixture()
def hostile(tmp_path):
    """(a Lightning-looking checkpoint carrying the payload, the marker it would create)."""
    marker = tmp_path / "marker"
    path = tmp_path / "hostile.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(2)}, "hyper_parameters": {"lr": 0.1}, "payload": Payload(marker),
                "pytorch-lightning_version": "2.6.6"}, path)
    assert not marker.exists()
    return path, marker


def test_the_payload_runs_when_loaded_unsafely(hostile):
    """The fixture is real: torch's unsafe load runs it (so the tests below, where it never runs, mean something)."""
    path, marker = hostile
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_the_reader_refuses_it_with_one_line(hostile, monkeypatch):
    monkeypatch.delenv("GROUNDING_TRUST_CHECKPOINTS", raising=False)
    path, marker = hostile
    with pytest.raises(UnsafeCheckpointError) as e:
        load_checkpoint_file(path, "init_from")
    message = str(e.value)
    assert str(path) in message and "open to load" in message and "GROUNDING_TRUST_CHECKPOINTS=1" in message
    assert "\n" not in message
    with pytest.raises(UnsafeCheckpointError):
        read_checkpoint(path, "stage-1")
    assert not marker.exists()


def test_only_the_switch_loads_it(hostile, monkeypatch):
    path, marker = hostile
    monkeypatch.setenv("GROUNDING_TRUST_CHECKPOINTS", "1")
    monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", raising=False)
    load_checkpoint_file(path)
    assert marker.exists()


def test_the_suites_own_checkpoints_are_plain_data(tmp_path):
    """What the suite writes loads as plain data: a Lightning checkpoint of a tiny stage, the alignment transform's
    export."""
    from semclip_helpers import tiny_baseline_ckpt

    from grounding.semclip.alignment import AlignmentTransform, load_transform, save_transform

    ckpt = tiny_baseline_ckpt(tmp_path / "vlm")
    assert "state_dict" in load_checkpoint_file(ckpt)
    out = save_transform(AlignmentTransform(8, 4, 16), tmp_path / "transform.pt", vlm="suite:x")
    assert load_transform(out)[0].net[0].in_features == 8


def _commands(i, path: str, tmp: Path):
    world, g = i["world"], "grounding"
    return [
        ("init_from", g, ["fit", "--config", str(i["stage2"]), "--model.init_args.init_from", path]),
        ("test --ckpt_path", g, ["test", "--config", str(i["stage1"]), "--ckpt_path", path,
                                 "--trainer.default_root_dir", str(tmp / "run")]),
        ("fit --ckpt_path", g, ["fit", "--config", str(i["stage1"]), "--ckpt_path", path,
                                "--trainer.default_root_dir", str(tmp / "run2")]),
        ("image_search", "grounding.vgbert.image_search", ["--ckpt", path, "--images", str(world / "flickr" / "images"),
                                                           "--query-text", "a red ball"]),
        ("semclip evaluate --transform", "grounding.semclip", ["evaluate", "--transform", path, "--world", str(world),
                                                               "--vlm", i["vlm"], "--ste", str(i["ste"]),
                                                               "--out", str(tmp / "evaluate")]),
        ("semclip export", "grounding.semclip", ["export", "--ckpt", path, "--out", str(tmp / "ste")]),
    ]


@pytest.mark.parametrize("case", ["init_from", "test --ckpt_path", "fit --ckpt_path", "image_search",
                                  "semclip evaluate --transform", "semclip export"])
def test_every_command_refuses_it(case, hostile, inputs, capsys, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.delenv("GROUNDING_TRUST_CHECKPOINTS", raising=False)
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    path, marker = hostile
    _, module, argv = next(c for c in _commands(inputs, str(path), tmp_path) if c[0] == case)
    code, err = run_entry(module, argv, capsys)
    assert code == 2, err
    assert "Traceback" not in err and str(path) in err and "GROUNDING_TRUST_CHECKPOINTS" in err, err
    assert len(err.strip().splitlines()) <= 3, err
    assert not marker.exists()


def test_every_reader_refuses_it(hostile, monkeypatch):
    """The readers behind the explorer's leaderboard rows, a run's training-image record, SemCLIP's transform and a
    sweep's parameter count: refused (the sweep's count goes without), never run."""
    from grounding.semclip.alignment import load_transform
    from grounding.sweep import learnable_parameters
    from grounding.training_images import checkpoint_entries

    monkeypatch.delenv("GROUNDING_TRUST_CHECKPOINTS", raising=False)
    path, marker = hostile
    for read in (lambda: read_checkpoint(path, "leaderboard row"), lambda: checkpoint_entries(path),
                 lambda: load_transform(path)):
        with pytest.raises(UnsafeCheckpointError):
            read()
    assert learnable_parameters(path) is None
    assert not marker.exists()


def test_a_random_file_as_the_transform_is_one_line(inputs, capsys, tmp_path):  # noqa: F811
    """Not a checkpoint at all (not a hostile one): one line saying so, exit 2."""
    garbage = tmp_path / "random.pt"
    garbage.write_bytes(bytes(range(256)) * 4)
    code, err = run_entry("grounding.semclip", ["evaluate", "--transform", str(garbage), "--world", str(inputs["world"]),
                                                "--out", str(tmp_path / "evaluate")], capsys)
    assert code == 2 and "Traceback" not in err and str(garbage) in err and "alignment transform" in err, err
    assert len(err.strip().splitlines()) <= 3, err

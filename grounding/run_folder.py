"""A run folder (``--trainer.default_root_dir``) is owned by one run.

* **One fit at a time.** A fit holds ``<root>/.lock`` (``flock``; the file names its owner: pid, host, command)
  from before any model is built until it ends. A second fit into the folder is refused while the owner runs; the
  kernel frees the lock of a killed run, and the next fit says it took the folder over.
* **No silent overwrite.** A fit into a folder that holds another run's checkpoints with a *different* config
  (``config.yaml`` differs in a value both configs set) is refused unless it resumes that run (``--ckpt_path``) or
  ``--overwrite true`` is given, which moves the earlier run to ``<root>/replaced/<time>/``. The same config again
  (``make`` rerun) proceeds.
* **One config a run.** Resuming (``--ckpt_path``) is refused when the config differs from the run's ``config.yaml``
  in what it trains (a ``model.`` or ``data.`` value): the run's later epochs would train another model than its
  first ones while its records name one config. Trainer settings (``max_epochs`` to extend a schedule, devices)
  may change; ``--overwrite true`` accepts the change on purpose, the run's records moved aside first. (The CLI
  also compares the model values with the checkpoint's own: grounding.cli.)
* **Beside, never over.** ``fit`` writes ``config.yaml``; ``test`` / ``validate`` / ``predict`` write
  ``config.<command>.yaml`` and ``metrics.<command>.json``; all atomically, on rank 0.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import sys
import time
from pathlib import Path

import yaml

from grounding.errors import UserInputError
from grounding.nets import regrouped_config
from grounding.utils.io import atomic_write_json, atomic_write_text
from grounding.utils.owner import owner_gone, owner_record, same_host

LOCK_FILE = ".lock"
FIT_CONFIG = "config.yaml"
IGNORED_KEYS = ("ckpt_path", "overwrite", "allow_eval_overlap")  # how a fit starts, not what it trains
# How a model is evaluated, not what it trains (any nesting): evaluation block sizes.
EVALUATION_ONLY_KEYS = ("eval_image_chunk", "eval_text_chunk", "eval_pair_chunk")


class RunFolderError(UserInputError):
    """A run folder that another run owns (running now, or holding a different config's checkpoints)."""


def best_checkpoint(root: str | os.PathLike) -> Path | None:
    """The run's newest ``checkpoints/best-*.ckpt`` (its monitored metric's best), or None: what ``--ckpt_path best``
    names."""
    best = sorted((Path(root) / "checkpoints").glob("best-*.ckpt"), key=lambda p: p.stat().st_mtime)
    return best[-1] if best else None


def config_file(root: str | os.PathLike, command: str) -> Path:
    return Path(root) / (FIT_CONFIG if command == "fit" else f"config.{command}.yaml")


def metrics_file(root: str | os.PathLike, command: str) -> Path:
    return Path(root) / f"metrics.{command}.json"


def flatten_config(tree, prefix: str = "") -> dict:
    """A nested config as ``{"model.init_args.lr": value, ...}``."""
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(flatten_config(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def config_differences(old: dict, new: dict) -> list[str]:
    """Keys both configs set to different values (keys only one has, e.g. an option added to the code since,
    :data:`IGNORED_KEYS` and :data:`EVALUATION_ONLY_KEYS` do not count)."""
    a, b = flatten_config(old), flatten_config(new)
    return sorted(k for k in a.keys() & b.keys() if a[k] != b[k] and k.split(".")[0] not in IGNORED_KEYS
                  and k.split(".")[-1] not in EVALUATION_ONLY_KEYS)


RUN_RECORDS = ("checkpoints", FIT_CONFIG, "fit_record.json", "config.*.yaml", "metrics.*.json")


def set_aside(root: str | os.PathLike) -> Path:
    """Move the folder's run (checkpoints and records) into ``<root>/replaced/<UTC time>/``: replaced, not lost."""
    root = Path(root)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest, n = root / "replaced" / stamp, 1
    while dest.exists():  # two runs set aside within a second
        dest, n = root / "replaced" / f"{stamp}-{n}", n + 1
    dest.mkdir(parents=True)
    for pattern in RUN_RECORDS:
        for path in root.glob(pattern):
            path.rename(dest / path.name)
    return dest


def check_evaluation_target(root: str | os.PathLike | None, ckpt_path: str | os.PathLike, command: str) -> None:
    """``test`` / ``validate`` / ``predict`` of ``ckpt_path`` writing into ``root``: refused when ``root`` holds a
    fit run the checkpoint is not part of (its ``metrics.<command>.json`` would become another model's results)."""
    if root is None:
        return
    root = Path(root)
    if not ((root / FIT_CONFIG).is_file() or any((root / "checkpoints").glob("*.ckpt"))):
        return  # a folder of results only (or a new one): the results of this checkpoint go there
    ckpt = Path(ckpt_path).resolve()
    if ckpt.is_relative_to(root.resolve()):
        return
    own = f"the checkpoint's own run folder (--trainer.default_root_dir {ckpt.parent.parent}) or " \
        if ckpt.parent.name == "checkpoints" else ""
    raise RunFolderError(
        f"{root} holds another run than {ckpt_path}: `{command}` there would replace its "
        f"{metrics_file(root, command).name} with another model's results.\nFix: give {own}a new "
        "--trainer.default_root_dir.")


def moved_checkpoint(ckpt_path: str | os.PathLike, root: str | os.PathLike, moved: Path) -> Path:
    """Where ``ckpt_path`` is after :func:`set_aside` moved ``root``'s run to ``moved`` (unchanged when it was not
    among the run's files)."""
    path, root = Path(ckpt_path).resolve(), Path(root).resolve()
    try:
        relative = path.relative_to(root)
    except ValueError:
        return Path(ckpt_path)
    return moved / relative if (moved / relative).exists() else Path(ckpt_path)


def check_writable_folder(root: str | os.PathLike) -> Path:
    """``root`` as a folder this process can write to, created when missing; else a :class:`RunFolderError`
    naming it: a file in the way (the folder or one of its parents), a parent that cannot be created, a read-only
    file system or missing permissions. Checked before any model is built, so nothing is trained in vain."""
    path = Path(root).expanduser()
    for folder in (path, *path.parents):
        if folder.exists() and not folder.is_dir():
            raise RunFolderError(f"Output folder {path}: {folder} is a file, not a folder; choose another "
                                 "--trainer.default_root_dir or move the file.")
    fix = "choose a writable --trainer.default_root_dir"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise RunFolderError(f"Output folder {path} cannot be written ({e.strerror or e}); {fix}.") from None
    return path


# What a run trains: a resume may not change these (config_differences' keys, by their first part).
TRAINED_SECTIONS = ("model", "data")


def check_fit_target(root: str | os.PathLike, new_config: dict, resuming: bool, overwrite: bool) -> Path | None:
    """Refuse a fit into a folder holding another config's checkpoints (see the module docstring); with
    ``overwrite`` the earlier run is set aside (:func:`set_aside`) instead. A resume is refused when the config
    differs from the run's in what it trains (:data:`TRAINED_SECTIONS`), unless ``overwrite``: then the run's
    records are set aside too (the resumed run writes its own). Returns where the earlier run went, or None."""
    root = Path(root)
    old_file = root / FIT_CONFIG
    if resuming:
        return _check_resume(root, new_config, overwrite)
    if not any((root / "checkpoints").glob("*.ckpt")):
        return None
    try:
        old = yaml.safe_load(old_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        old = None
    # a missing or unreadable record cannot show the run is the same one: refused like a different config
    if not isinstance(old, dict):
        why = f"{old_file} is {'unreadable' if old_file.exists() else 'missing'}"
    else:
        diff = config_differences(regrouped_config(old), new_config)
        if not diff:
            return None
        why = f"{old_file} differs in " + ", ".join(diff[:4]) + (f" and {len(diff) - 4} more" if len(diff) > 4 else "")
    if overwrite:
        moved = set_aside(root)
        print(f"--overwrite: {root} held another run ({why}); moved it to {moved}", file=sys.stderr)
        return moved
    raise RunFolderError(f"{root} holds the checkpoints of another run ({why}). Fix: give a new "
                         "--trainer.default_root_dir, resume that run with --ckpt_path last, or pass --overwrite true "
                         "to replace it.")


def _check_resume(root: Path, new_config: dict, overwrite: bool) -> Path | None:
    old_file = root / FIT_CONFIG
    try:
        old = yaml.safe_load(old_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None  # a checkpoint from elsewhere, or a run without its record: nothing to compare with
    if not isinstance(old, dict):
        return None
    # (a run recorded before some options moved into groups: its options compared in their groups)
    diff = [k for k in config_differences(regrouped_config(old), new_config) if k.split(".")[0] in TRAINED_SECTIONS]
    if not diff:
        return None
    what = ", ".join(diff[:4]) + (f" and {len(diff) - 4} more" if len(diff) > 4 else "")
    if overwrite:
        moved = set_aside(root)
        print(f"--overwrite: resuming the run of {old_file} under a config that differs in {what}; its records "
              f"(config, checkpoints) moved to {moved}", file=sys.stderr)
        return moved
    raise RunFolderError(f"Resuming the run of {old_file} with a config that differs in {what}: its later epochs would "
                         "train another model than its first. Fix: resume with the run's own config, fit into a new "
                         "--trainer.default_root_dir, or pass --overwrite true to resume under the new values on purpose.")


class RunLock:
    """``<root>/.lock``, held with ``flock`` by this process until :meth:`release` (or exit): the kernel frees it
    when the process dies, so a killed run never blocks the folder; the file's JSON (pid, host, command) names
    the owner in the refusal, and a record left by a run that is gone is reported when taken over."""

    def __init__(self, root: str | os.PathLike):
        self.path = Path(root) / LOCK_FILE
        self.fd: int | None = None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunFolderError(self._refusal()) from None
            try:  # the file may have been released and unlinked between open and flock: lock the current one
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self._report_previous(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({**owner_record(), "command": " ".join(sys.argv)}).encode(), 0)
        self.fd = fd
        atexit.register(self.release)
        return self

    def _owner(self, fd: int | None = None) -> dict | None:
        try:
            text = os.pread(fd, 1 << 16, 0) if fd is not None else self.path.read_bytes()
            owner = json.loads(text)
        except (OSError, ValueError):
            return None
        return owner if isinstance(owner, dict) else None

    def _refusal(self) -> str:
        owner = self._owner() or {}
        command = " ".join(str(owner.get("command", "?")).split())  # an inline --config YAML: one line, cut short
        command = command if len(command) <= 160 else command[:160] + "…"
        who = f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}: {command}"
        return (f"{self.path.parent} is in use by another run ({who}). Fix: wait for it to finish, or give this "
                "run another --trainer.default_root_dir.")

    def _report_previous(self, fd: int) -> None:
        owner = self._owner(fd)
        if owner and same_host(owner) and owner.get("pid") != os.getpid():
            gone = owner_gone(owner) or "it no longer holds the folder"
            print(f"{self.path}: the run that held it is gone ({gone}); taking the folder over", file=sys.stderr)

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            self.path.unlink(missing_ok=True)  # before the unlock: a waiter that locked this inode retries
            os.close(fd)


def write_run_config(root: str | os.PathLike, command: str, text: str) -> Path:
    path = config_file(root, command)
    atomic_write_text(path, text)
    return path


def write_run_metrics(root: str | os.PathLike, command: str, metrics: dict) -> Path:
    path = metrics_file(root, command)
    values = {k: (v.item() if hasattr(v, "item") else v) for k, v in sorted(metrics.items())}
    atomic_write_json(path, values, indent=2)
    return path

"""A run folder (``--trainer.default_root_dir``) is owned by one run.

* **One fit at a time.** A fit takes ``<root>/.lock`` (its owner: pid, host, start time, command) before any
  model is built and gives it back at exit. A second fit into the folder is refused while the owner runs; a lock
  whose owner is gone (same host, pid no longer running: a killed run) is replaced, with a line saying so.
* **No silent overwrite.** A fit into a folder that holds another run's checkpoints with a *different* config
  (``config.yaml`` differs in a value both configs set) is refused unless it resumes that run (``--ckpt_path``) or
  ``--overwrite`` is given. The same config again (``make`` rerun) proceeds.
* **Beside, never over.** ``fit`` writes ``config.yaml``; ``test`` / ``validate`` / ``predict`` write
  ``config.<command>.yaml`` and ``metrics.<command>.json``; all atomically, on rank 0.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path

import yaml

from grounding.errors import UserInputError
from grounding.utils.io import atomic_write_json, atomic_write_text
from grounding.utils.owner import owner_gone, owner_record, same_host

LOCK_FILE = ".lock"
FIT_CONFIG = "config.yaml"
IGNORED_KEYS = ("ckpt_path", "overwrite")  # how a fit starts, not what it trains


class RunFolderError(UserInputError):
    """A run folder that another run owns (running now, or holding a different config's checkpoints)."""


def config_file(root: str | os.PathLike, command: str) -> Path:
    return Path(root) / (FIT_CONFIG if command == "fit" else f"config.{command}.yaml")


def metrics_file(root: str | os.PathLike, command: str) -> Path:
    return Path(root) / f"metrics.{command}.json"


def _flatten(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def config_differences(old: dict, new: dict) -> list[str]:
    """Keys both configs set to different values (keys only one has, e.g. an option added to the code since, and
    :data:`IGNORED_KEYS` do not count)."""
    a, b = _flatten(old), _flatten(new)
    return sorted(k for k in a.keys() & b.keys() if a[k] != b[k] and k.split(".")[0] not in IGNORED_KEYS)


def check_fit_target(root: str | os.PathLike, new_config: dict, resuming: bool, overwrite: bool) -> None:
    """Refuse a fit into a folder holding another config's checkpoints (see the module docstring)."""
    root = Path(root)
    old_file = root / FIT_CONFIG
    if resuming or overwrite or not old_file.is_file() or not any((root / "checkpoints").glob("*.ckpt")):
        return
    try:
        old = yaml.safe_load(old_file.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        old = {}
    diff = config_differences(old, new_config) if isinstance(old, dict) else ["(unreadable config.yaml)"]
    if diff:
        shown = ", ".join(diff[:4]) + (f" and {len(diff) - 4} more" if len(diff) > 4 else "")
        raise RunFolderError(f"{root} holds the checkpoints of a run with another config ({old_file} differs in "
                             f"{shown}). Fix: give a new --trainer.default_root_dir, resume that run with "
                             "--ckpt_path last, or pass --overwrite to replace it.")


class RunLock:
    """``<root>/.lock`` held by this process until :meth:`release` (or exit)."""

    def __init__(self, root: str | os.PathLike):
        self.path = Path(root) / LOCK_FILE
        self.held = False

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {**owner_record(), "command": " ".join(sys.argv)}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            self.held = True
            atexit.register(self.release)
            return self
        raise RunFolderError(f"{self.path.parent}: could not take {self.path}; another run took it at the same time")

    def _take_over_if_stale(self) -> None:
        try:
            owner = json.loads(self.path.read_text())
        except FileNotFoundError:
            return  # released meanwhile: try again
        except (OSError, ValueError):
            owner = None
        if same_host(owner):
            gone = owner_gone(owner)
            if gone is None:
                raise RunFolderError(
                    f"{self.path.parent} is in use by another run (pid {owner['pid']}: {owner.get('command', '?')}). "
                    "Fix: wait for it to finish, or give this run another --trainer.default_root_dir.")
            print(f"{self.path}: the run that held it is gone ({gone}); taking the folder over", file=sys.stderr)
        elif isinstance(owner, dict):
            raise RunFolderError(
                f"{self.path.parent} is locked by a run on host {owner.get('host')} (pid {owner.get('pid')}). Fix: wait "
                f"for it, or, if that run is gone, delete {self.path}.")
        else:
            print(f"{self.path}: unreadable lock file (a run killed while writing it); replacing it", file=sys.stderr)
        self.path.unlink(missing_ok=True)

    def release(self) -> None:
        if self.held:
            self.held = False
            self.path.unlink(missing_ok=True)


def write_run_config(root: str | os.PathLike, command: str, text: str) -> Path:
    path = config_file(root, command)
    atomic_write_text(path, text)
    return path


def write_run_metrics(root: str | os.PathLike, command: str, metrics: dict) -> Path:
    path = metrics_file(root, command)
    values = {k: (v.item() if hasattr(v, "item") else v) for k, v in sorted(metrics.items())}
    atomic_write_json(path, values, indent=2)
    return path

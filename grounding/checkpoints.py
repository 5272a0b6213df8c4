"""Reading the suite's checkpoints: a Lightning ``.ckpt`` (or a bare state dict) as weights plus
hyperparameters, and copying prefixed weights into a model's submodules with strict, explained checks.

Every stage that starts from another stage's checkpoint (``init_from``) and the SemCLIP VLM adapter
read checkpoints through here.

A checkpoint is data, never code: every file a user might have received is read by :func:`load_checkpoint_file`,
``torch.load(weights_only=True)`` (tensors, containers, numbers, strings: what the suite writes). A file whose pickle
names anything else (a class to build, a function to call: how a hostile ``.ckpt`` runs code) is refused with one
line naming the file and what it needs; ``GROUNDING_TRUST_CHECKPOINTS=1`` is the only way to load it anyway.
"""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from pathlib import Path

import torch

from grounding.encoders import MissingWeightsError
from grounding.nets import class_of, net_hparams


class CheckpointError(MissingWeightsError, FileNotFoundError):
    """A checkpoint named by ``init_from`` is missing, unreadable or does not fit the model."""


TRUST_ENV = "GROUNDING_TRUST_CHECKPOINTS"


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint whose pickle would build objects or call functions beyond plain data (possibly running code)."""


def trusted() -> bool:
    """Does the user load checkpoints that need more than plain data (``GROUNDING_TRUST_CHECKPOINTS=1``)?"""
    return os.environ.get(TRUST_ENV, "").strip().lower() in ("1", "true", "yes")


def load_checkpoint_file(path: str | Path, what: str = "checkpoint", mmap: bool = False):
    """``torch.load`` of a file a user might have received, on the CPU, as plain data only (``weights_only=True``).

    A file that needs anything else raises :class:`UnsafeCheckpointError` (one line: the file, the global its pickle
    names, the switch) unless ``GROUNDING_TRUST_CHECKPOINTS=1``; then it is loaded whole, and Lightning's own loads of
    the run are allowed the same (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``). Other failures propagate."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        if "Weights only load failed" not in str(e):
            raise  # not a pickle torch can read at all (a truncated or foreign file): the caller says so
        if not trusted():
            found = re.search(r"GLOBAL ([\w.]+)", str(e))
            needs = found.group(1) if found else "an object beyond tensors and plain values"
            raise UnsafeCheckpointError(
                f"{what} {path} needs {needs} to load, and loading it could run code: the suite loads only tensors and "
                f"plain values; if you trust where the file came from, set {TRUST_ENV}=1") from None
        os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"  # Lightning's own load of the same file
        return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)


def require_checkpoint_file(path: str | Path, what: str, fix: str) -> Path:
    """``path`` is a complete ``torch.save`` archive (a zip whose directory, written last, is intact), checked
    without loading it: a missing, truncated or foreign file raises :class:`CheckpointError` naming it and ``fix``."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CheckpointError(f"{what} {path}: no such checkpoint. Fix: {fix}.")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"{what} {path} is not a complete PyTorch checkpoint (truncated by a killed copy or "
                              f"run, or another kind of file). Fix: {fix}.")
    return path


def checkpoint_class(path: str | Path) -> str | None:
    """The LightningModule class a checkpoint records (``hyper_parameters._class_path``, written by the CLI)."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - an unreadable or unsafe file is reported where it is loaded
        return None
    hparams = ckpt.get("hyper_parameters") if isinstance(ckpt, dict) else None
    return hparams.get("_class_path") if isinstance(hparams, dict) else None


def require_checkpoint_of(path: str | Path, cls: type, what: str, fix: str) -> Path:
    """:func:`require_checkpoint_file`, and the class the checkpoint records is ``cls`` (or a subclass): another
    model's checkpoint raises :class:`CheckpointError` naming both classes and ``fix``."""
    path = require_checkpoint_file(path, what, fix)
    recorded = checkpoint_class(path)
    if recorded is not None:
        found = class_of(recorded)
        if not (found is not None and issubclass(found, cls)):
            raise CheckpointError(f"{what} {path} is a checkpoint of {recorded}, not of {cls.__name__}. Fix: {fix}.")
    return path


def check_stage_checkpoint(path: str | Path, what: str, prefixes: tuple[str, ...], option: str = "init_from") -> None:
    """Before any model is built: ``path`` (given as ``option``) holds weights under each of ``prefixes`` (it is a
    ``what`` checkpoint). Memory-mapped: only the checkpoint's index is read, not its tensors."""
    path = Path(path).expanduser()
    try:
        state = load_checkpoint_file(path, f"{option} {what} checkpoint", mmap=True)
    except UnsafeCheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's to fix
        raise CheckpointError(f"Cannot read {what} checkpoint {path}: {e}") from e
    state = state.get("state_dict", state) if isinstance(state, dict) else {}
    absent = [p for p in prefixes if not any(str(k).startswith(p) for k in state)]
    if absent:
        raise CheckpointError(f"{path} is not a {what} checkpoint: it has no weights under {', '.join(absent)}. "
                              f"Fix: set {option} to a {what} run's checkpoint (outputs/<run>/checkpoints/*.ckpt).")


def read_checkpoint(path: str | Path, what: str) -> dict:
    """A Lightning checkpoint (or a bare state dict) as {"state_dict", "hyper_parameters"}."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CheckpointError(f"{what} checkpoint {path} not found. Train that stage first (see `make stage2` in "
                              "the README) or set init_from to its .ckpt file (outputs/<run>/checkpoints/last.ckpt).")
    try:
        ckpt = load_checkpoint_file(path, f"{what} checkpoint")
    except UnsafeCheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's to fix
        raise CheckpointError(f"Cannot read {what} checkpoint {path}: {e}") from e
    if isinstance(ckpt, dict) and "state_dict" in ckpt:
        return {"state_dict": ckpt["state_dict"], "hyper_parameters": dict(ckpt.get("hyper_parameters") or {})}
    if isinstance(ckpt, dict) and all(isinstance(v, torch.Tensor) for v in ckpt.values()):
        return {"state_dict": ckpt, "hyper_parameters": {}}
    raise CheckpointError(f"{path} is not a Lightning checkpoint or state dict ({what}).")


def load_submodules(target: torch.nn.Module, ckpt: dict, prefixes: dict[str, str], path: str | Path,
                    what: str, matching_hparams: dict | None = None) -> None:
    """Copy ``ckpt`` weights under each source prefix into ``target``'s submodule named by the value.

    Strict about the target's keys (every parameter/buffer of the named submodules must be in the
    checkpoint with the same shape); other checkpoint keys (e.g. stage-1 projection heads) are ignored.
    """
    state, hp = ckpt["state_dict"], net_hparams(ckpt["hyper_parameters"])
    for key, value in (matching_hparams or {}).items():
        if key in hp and hp[key] != value:
            raise CheckpointError(f"{what} checkpoint {path} was trained with {key}={hp[key]!r} but this model has "
                                  f"{key}={value!r}; set the config's {key} to {hp[key]!r}.")
    for src_prefix, dst_name in prefixes.items():
        module = target.get_submodule(dst_name)
        own = module.state_dict()
        found = {k[len(src_prefix):]: v for k, v in state.items() if k.startswith(src_prefix)}
        missing = sorted(set(own) - set(found))
        if missing:
            raise CheckpointError(
                f"{what} checkpoint {path} lacks {len(missing)} weight(s) of {dst_name!r} under prefix {src_prefix!r} "
                f"(e.g. {missing[:4]}). Is it a checkpoint of the right stage, trained with the same text_encoder / "
                "backbone / visual_heads?")
        wrong = [k for k in own if tuple(own[k].shape) != tuple(found[k].shape)]
        if wrong:
            raise CheckpointError(f"{what} checkpoint {path}: shape mismatch for {dst_name}.{wrong[0]} "
                                  f"({tuple(found[wrong[0]].shape)} vs {tuple(own[wrong[0]].shape)}); use the same "
                                  "text_encoder / backbone / widths as the run that wrote it.")
        module.load_state_dict({k: found[k] for k in own}, strict=True)


__all__ = ["CheckpointError", "UnsafeCheckpointError", "load_checkpoint_file", "read_checkpoint", "load_submodules"]

"""Which images a checkpoint was trained on, and the check that no stage is evaluated on them later.

A stage built from another stage's checkpoint (``init_from``: VG-BERT stage 2 from stage 1, the search heads
from stage 2) must be evaluated on images that no stage of its chain trained on. Every training checkpoint
therefore records its training images (:data:`RECORD_KEY`): its own fit's (``depth`` 0) and, inherited, those
of every checkpoint it was built from (``depth`` 1, 2, ...). Before a fit, and before a ``test`` / ``validate``,
:class:`TrainingImages` compares the evaluation split's images with the entries of depth >= 1 (the stage's own
train / evaluation split is its DataModule's business) and raises :class:`EvalOverlapError` (one line, exit 2)
naming the checkpoint, the split, the overlap and the fix. ``--allow_eval_overlap true`` (the model attribute
``allow_eval_overlap``) turns the error into a warning. A checkpoint written before this record warns once.

**Canonical image keys.** The same photo appears in several datasets; an image is identified by one or more
int64 keys, ``namespace << 56 | id`` (0 = no key):

* ``coco:<id>``: a COCO image id (2014 and 2017 share them; Karpathy's ``cocoid``); Visual Genome's ``coco_id``;
* ``flickr:<id>``: a Flickr photo id: Flickr30K's ``<id>.jpg``, Flickr8k's ``<id>_<secret>.jpg``, Visual Genome's
  ``flickr_id``;
* ``vg:<id>``: a Visual Genome image id;
* ``file:<name>``: otherwise the image's file name (a 56-bit hash of it; the embedded world's Flickr copies).

A DataModule gives its split's keys with ``image_keys(split)``: an int64 array, (N,) or (N, C) with one row per
image of the split (a Visual Genome image: its vg, coco and flickr keys). Two images are the same when any of
their keys are equal. A record holds each fit's sorted unique keys (COCO train2017: 118K x 8 bytes).
"""

from __future__ import annotations

import hashlib
import re
import warnings
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch
from lightning.pytorch import Callback

from grounding.checkpoints import CheckpointError, UnsafeCheckpointError, load_checkpoint_file
from grounding.errors import UserInputError

RECORD_KEY = "training_images"
RECORD_FORMAT = 1
NAMESPACES = {"coco": 1, "flickr": 2, "vg": 3, "file": 4}
NAMES = {v: k for k, v in NAMESPACES.items()}
ID_BITS = 56
ID_MASK = (1 << ID_BITS) - 1
MAX_DEPTH = 16  # a chain of checkpoints longer than this is a cycle
EVAL_SPLITS = {"fit": ("val", "test"), "validate": ("val",), "test": ("test",)}
FIX = ("evaluate on images that checkpoint did not train on: set data.init_args.exclude_eval_images: "
       "[<that checkpoint>] (COCO, Flickr, Visual Genome: its val/test images then leave out every image of its "
       "record), or a split file whose val/test avoid them (Visual Genome: split.split_file); or pass "
       "--allow_eval_overlap true to evaluate on them knowingly")


class EvalOverlapError(UserInputError, ValueError):
    """A stage's evaluation images include training images of a checkpoint it was built from."""


# --------------------------------------------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------------------------------------------
def image_keys(namespace: str, ids) -> np.ndarray:
    """Keys of ``ids`` (ints; None, 0 or negative = no key -> 0) in ``namespace`` (coco, flickr, vg)."""
    ids = np.asarray([0 if i is None else i for i in ids] if isinstance(ids, list) else ids, dtype=np.int64)
    return np.where(ids > 0, (np.int64(NAMESPACES[namespace]) << ID_BITS) | (ids & ID_MASK), 0).astype(np.int64)


def image_key(namespace: str, ident) -> int:
    """One key (0 when ``ident`` is None or not a positive integer)."""
    try:
        ident = int(ident)
    except (TypeError, ValueError):
        return 0
    return (NAMESPACES[namespace] << ID_BITS) | (ident & ID_MASK) if ident > 0 else 0


def file_key(name: str) -> int:
    """The key of an image known only by its file name (a 56-bit hash of the name, its folder left out)."""
    digest = hashlib.blake2b(Path(str(name)).name.encode("utf-8"), digest_size=7).digest()
    return (NAMESPACES["file"] << ID_BITS) | int.from_bytes(digest, "big")


_FLICKR_NAME = re.compile(r"^(\d+)(?:_[0-9a-zA-Z]+)?\.[A-Za-z]+$")


def flickr_file_key(name: str) -> int:
    """A Flickr file's key: ``flickr:<photo id>`` for ``<id>.jpg`` / ``<id>_<secret>.jpg``, else :func:`file_key`."""
    base = Path(str(name)).name
    match = _FLICKR_NAME.match(base)
    return image_key("flickr", match.group(1)) if match else file_key(base)


def describe_key(key: int, name: str | None = None) -> str:
    """``coco:397133``; a file key as ``file:<name>`` when the name is given (else its hash)."""
    key = int(key)
    namespace = NAMES.get(key >> ID_BITS, "?")
    if namespace == "file":
        return f"file:{name}" if name else f"file:#{key & ID_MASK:014x}"
    return f"{namespace}:{key & ID_MASK}"


def parse_key(text: str) -> int:
    """The key a line of an image list names: ``coco:397133``, ``flickr:1000092795``, ``vg:2417997``, ``file:<name>``."""
    namespace, sep, ident = str(text).strip().partition(":")
    if not sep or namespace not in NAMESPACES:
        raise ValueError(f"{text!r} is not an image key (coco:<id>, flickr:<id>, vg:<id> or file:<name>)")
    if namespace == "file":
        return file_key(ident)
    key = image_key(namespace, ident)
    if not key:
        raise ValueError(f"{text!r}: the id must be a positive integer")
    return key


def key_set(keys) -> np.ndarray:
    """The sorted unique non-zero keys of a key array of any shape."""
    flat = np.asarray(keys, dtype=np.int64).reshape(-1)
    return np.unique(flat[flat != 0])


def as_rows(keys, n: int | None = None) -> np.ndarray:
    """A split's keys as (N, C)."""
    keys = np.asarray(keys, dtype=np.int64)
    return keys.reshape(len(keys) if n is None else n, -1) if keys.size else keys.reshape(len(keys), 0)


def overlapping(keys, trained: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per image of ``keys`` ((N,) or (N, C)): whether any of its keys is in ``trained`` (sorted unique), and the
    first such key (0 where none). Vectorised: one sort-based ``isin``."""
    rows = as_rows(keys)
    hit = np.isin(rows, trained) & (rows != 0)
    first = np.where(hit.any(1), rows[np.arange(len(rows)), hit.argmax(1)] if rows.shape[1] else 0, 0)
    return hit.any(1), first


# --------------------------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------------------------
def datamodule_keys(datamodule, split: str):
    """``datamodule.image_keys(split)`` as an int64 array; None when the DataModule does not say (no images, or
    not one of the suite's)."""
    get = getattr(datamodule, "image_keys", None)
    if datamodule is None or not callable(get):
        return None
    keys = get(split)
    return None if keys is None else np.asarray(keys, dtype=np.int64)


def own_entry(datamodule, run: str | None) -> dict | None:
    """This fit's entry: the training split's keys (None when the DataModule has no ``image_keys``)."""
    if datamodule is None or not callable(getattr(datamodule, "image_keys", None)):
        return {"depth": 0, "checkpoint": None, "run": run, "dataset": type(datamodule).__name__ if datamodule else None,
                "root": None, "images": None, "keys": None}
    keys = datamodule_keys(datamodule, "train")
    return {"depth": 0, "checkpoint": None, "run": run,
            "dataset": str(getattr(datamodule, "dataset_name", None) or type(datamodule).__name__),
            "root": str(getattr(datamodule, "root", "") or ""), "images": None if keys is None else len(keys),
            "keys": None if keys is None else key_set(keys)}


def _digest(entry: dict) -> tuple:
    keys = entry.get("keys")
    return (entry.get("dataset"), entry.get("root"), entry.get("checkpoint"),
            None if keys is None else hashlib.sha1(np.ascontiguousarray(keys).tobytes()).hexdigest())


def merge(entries: Iterable[dict]) -> list[dict]:
    """Entries without repeats (the same images of the same stage), the shallowest kept."""
    out, seen = [], set()
    for entry in sorted(entries, key=lambda e: int(e.get("depth", 0))):
        digest = _digest(entry)
        if digest not in seen:
            seen.add(digest)
            out.append(entry)
    return out


def to_checkpoint(entries: Sequence[dict]) -> dict:
    """The record as stored in a checkpoint: plain types and int64 tensors (loads with ``weights_only=True``)."""
    return {"format": RECORD_FORMAT, "entries": [
        {**{k: v for k, v in e.items() if k != "keys"},
         "keys": None if e.get("keys") is None else torch.from_numpy(np.ascontiguousarray(e["keys"], dtype=np.int64))}
        for e in entries]}


def from_checkpoint(record, path: str | None = None, shift: int = 0) -> list[dict]:
    """A stored record's entries (keys as numpy), ``shift`` deeper; its own entry names ``path``."""
    entries = []
    for e in (record or {}).get("entries") or []:
        keys = e.get("keys")
        keys = None if keys is None else np.asarray(keys.numpy() if isinstance(keys, torch.Tensor) else keys, np.int64)
        depth = int(e.get("depth", 0))
        entries.append({**e, "keys": keys, "depth": depth + shift,
                        "checkpoint": e.get("checkpoint") or (str(path) if path is not None and depth == 0 else None)})
    return entries


def _load(path: Path) -> dict:
    try:
        return load_checkpoint_file(path, "checkpoint", mmap=True)
    except UnsafeCheckpointError:
        raise
    except Exception:  # noqa: BLE001 - an old (non-zip) file cannot be memory-mapped: read it whole
        try:
            return load_checkpoint_file(path, "checkpoint")
        except UnsafeCheckpointError:
            raise
        except Exception as e:  # noqa: BLE001 - any unreadable file is the user's to fix
            raise CheckpointError(f"Cannot read checkpoint {path}: {e}") from e


def checkpoint_entries(path: str | Path, depth: int = 1, _seen: tuple = ()) -> list[dict]:
    """The entries a stage built from the checkpoint at ``path`` inherits: the checkpoint's own fit at ``depth``
    and its inherited ones deeper. A checkpoint without a record (written before it existed) gives an entry
    without keys (checks warn about it) and, when its hyperparameters name an ``init_from`` (or ``*_init_from``), that chain."""
    path = Path(path).expanduser()
    if not path.is_file() or depth > MAX_DEPTH or str(path.resolve()) in _seen:
        return []
    ckpt = _load(path)
    ckpt = ckpt if isinstance(ckpt, dict) else {}
    record = ckpt.get(RECORD_KEY)
    if isinstance(record, dict) and record.get("entries") is not None:
        return from_checkpoint(record, str(path), shift=depth)
    entries = [{"depth": depth, "checkpoint": str(path), "run": None, "dataset": None, "root": None, "images": None,
                "keys": None}]
    for parent in init_checkpoints(ckpt.get("hyper_parameters") or {}):
        entries += checkpoint_entries(parent, depth + 1, (*_seen, str(path.resolve())))
    return entries


def checkpoint_training_keys(path: str | Path) -> np.ndarray:
    """Every image key the checkpoint at ``path`` and the checkpoints it was built from trained on (sorted)."""
    entries = checkpoint_entries(path, depth=0)
    if not entries:
        raise CheckpointError(f"{path}: no such checkpoint")
    for e in entries:
        if e.get("keys") is None:
            _warn_once(f"{e.get('checkpoint') or path} holds no record of its training images (written before they "
                       "were recorded): none of them can be left out. Retrain it to record them.")
    return key_set(np.concatenate([e["keys"] for e in entries if e.get("keys") is not None] or [np.zeros(0, np.int64)]))


def init_checkpoints(options) -> list[str]:
    """The checkpoints that a stage's options (hyperparameters, or a config's ``init_args``) start it from: every
    non-empty string under ``init_from`` or ``*_init_from`` (``init_from``, stage 1's ``visual_init_from``)."""
    return [v for k, v in options.items() if (k == "init_from" or str(k).endswith("_init_from")) and isinstance(v, str) and v]


def built_from(pl_module) -> list[str]:
    """The checkpoints a module was built from: its ``built_from_checkpoints()``, else :func:`init_checkpoints` of
    its hyperparameters."""
    method = getattr(pl_module, "built_from_checkpoints", None)
    if callable(method):
        return [str(p) for p in method() if p]
    return init_checkpoints(getattr(pl_module, "hparams", None) or {})


# --------------------------------------------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------------------------------------------
_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, stacklevel=3)


def _split_paths(datamodule, split: str) -> list | None:
    dataset = getattr(datamodule, f"{split}_dataset", None) if datamodule is not None else None
    return getattr(dataset, "image_paths", None)


def check_evaluation(entries: Sequence[dict], datamodule, splits: Sequence[str], allow: bool = False,
                     what: str = "this run") -> None:
    """Raise :class:`EvalOverlapError` when an image of ``splits`` of ``datamodule`` is among the training images
    of an entry of depth >= 1 (a checkpoint ``what`` was built from, or one before it); ``allow``: warn instead.
    An entry without keys (an old checkpoint) warns once."""
    earlier = [e for e in entries if int(e.get("depth", 0)) >= 1]
    if not earlier:
        return
    for e in earlier:
        if e.get("keys") is None:
            _warn_once(f"{e.get('checkpoint') or e.get('run') or 'a checkpoint'} holds no record of its training images "
                       f"(written before they were recorded, or trained without a suite DataModule): whether {what}'s "
                       "evaluation images overlap them is not checked. Retrain it to record them.")
    known = [e for e in earlier if e.get("keys") is not None and len(e["keys"])]
    if not known:
        return
    problems = []
    for split in splits:
        keys = datamodule_keys(datamodule, split)
        if keys is None or not len(keys):
            continue
        rows = as_rows(keys)
        for e in known:
            hit, first = overlapping(rows, e["keys"])
            count = int(hit.sum())
            if count:
                problems.append((split, e, count, len(rows), rows, hit, first))
    if not problems:
        return
    split, e, count, n, rows, hit, first = problems[0]
    paths = _split_paths(datamodule, split)
    examples = []
    for i in np.flatnonzero(hit)[:3].tolist():
        name = Path(str(paths[i])).name if paths is not None and i < len(paths) else None
        own = describe_key(rows[i, 0], name)
        matched = describe_key(first[i], name)
        examples.append(own if own == matched else f"{own} = {matched}")
    stage = e.get("checkpoint") or e.get("run") or "an earlier checkpoint"
    source = " at ".join(str(x) for x in (e.get("dataset"), e.get("root")) if x)
    source = f"{source}, {len(e['keys'])} training images" if source else f"{len(e['keys'])} training images"
    more = (f" (and {len(problems) - 1} more split/checkpoint overlap(s): "
            + "; ".join(f"{p[0]} vs {p[1].get('checkpoint') or p[1].get('run')}: {p[2]}" for p in problems[1:4]) + ")"
            if len(problems) > 1 else "")
    via = "a checkpoint it is built from" if int(e.get("depth", 1)) == 1 else "a checkpoint earlier in its init_from chain"
    message = (f"{count} of the {n} {split!r} images of {what} are training images of {stage}, {via} ({source}): "
               f"e.g. {', '.join(examples)}{more}. Fix: {FIX}.")
    if allow:
        _warn_once(f"--allow_eval_overlap: {message}")
        return
    raise EvalOverlapError(message)


class TrainingImages(Callback):
    """Records the fit's training images (and the inherited records of the checkpoints the module was built from)
    in every checkpoint under :data:`RECORD_KEY`, and checks every evaluation against the earlier stages' images:
    a fit's val/test splits at ``setup`` (before any feature cache or training step), a ``test`` / ``validate``
    of a checkpoint when it is restored (or at the loop's start when no record came with it). The module's
    ``allow_eval_overlap`` turns the error into a warning. The record stays on the module (``training_images``),
    so a ``trainer.test`` after a ``trainer.fit`` in the same process checks against it."""

    def __init__(self):
        self.entries: list[dict] | None = None
        self.checked = False

    @staticmethod
    def _what(trainer) -> str:
        return f"the run in {trainer.default_root_dir}" if trainer.default_root_dir else "this run"

    def _check(self, trainer, pl_module, splits: Sequence[str]) -> None:
        self.checked = True
        check_evaluation(self.entries or [], trainer.datamodule, splits,
                         bool(getattr(pl_module, "allow_eval_overlap", False)), self._what(trainer))

    def setup(self, trainer, pl_module, stage: str) -> None:
        stage = getattr(stage, "value", stage)
        self.checked = False
        if stage == "fit":
            own = own_entry(trainer.datamodule, str(trainer.default_root_dir or ""))
            self.entries = merge([own, *self._chain(pl_module)])
            pl_module.training_images = self.entries
            self._check(trainer, pl_module, EVAL_SPLITS["fit"])
        else:  # a fit's record in this process, else the checkpoint's when one is restored (after setup)
            entries = getattr(pl_module, "training_images", None)
            self.entries = None if entries is None else list(entries)

    def on_load_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        fn = getattr(trainer.state.fn, "value", trainer.state.fn)
        record = checkpoint.get(RECORD_KEY)
        if fn == "fit":  # a resume: the earlier segments' record joins this fit's
            if isinstance(record, dict):
                self.entries = merge([*(self.entries or []), *from_checkpoint(record)])  # its own fit: this one
                pl_module.training_images = self.entries
                self._check(trainer, pl_module, EVAL_SPLITS["fit"])
            return
        self._restore_for_evaluation(trainer, pl_module, record)

    def _restore_for_evaluation(self, trainer, pl_module, record) -> None:
        fn = getattr(trainer.state.fn, "value", trainer.state.fn)
        if fn not in EVAL_SPLITS:
            return
        if isinstance(record, dict):
            self.entries = from_checkpoint(record, trainer.ckpt_path)
        else:  # an old checkpoint: its chain through its init_from, when it names one
            self.entries = self._chain(pl_module)
        pl_module.training_images = self.entries
        self._check(trainer, pl_module, EVAL_SPLITS[fn])

    @staticmethod
    def _chain(pl_module) -> list[dict]:
        return [e for path in built_from(pl_module) for e in checkpoint_entries(path)]

    def _evaluation_start(self, trainer, pl_module) -> None:
        if self.checked or trainer.sanity_checking:
            return
        fn = getattr(trainer.state.fn, "value", trainer.state.fn)
        if fn not in ("test", "validate"):
            return
        if trainer.ckpt_path and Path(str(trainer.ckpt_path)).is_file():  # restored without Lightning's callback state
            self._restore_for_evaluation(trainer, pl_module, _load(Path(str(trainer.ckpt_path))).get(RECORD_KEY))
            return
        if self.entries is None:  # a module never fit in this process: the checkpoints it is built from
            self.entries = self._chain(pl_module)
        self._check(trainer, pl_module, EVAL_SPLITS[fn])

    def on_test_start(self, trainer, pl_module) -> None:
        self._evaluation_start(trainer, pl_module)

    def on_validation_start(self, trainer, pl_module) -> None:
        self._evaluation_start(trainer, pl_module)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if self.entries is not None:
            checkpoint[RECORD_KEY] = to_checkpoint(self.entries)


__all__ = ["EvalOverlapError", "TrainingImages", "RECORD_KEY", "check_evaluation", "checkpoint_entries", "init_checkpoints",
           "checkpoint_training_keys", "describe_key", "file_key", "flickr_file_key", "image_key", "image_keys",
           "key_set", "overlapping", "parse_key"]

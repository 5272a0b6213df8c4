"""Frozen-backbone feature cache.

The visual stream's CNN is frozen and the caption transforms are deterministic (Resize +
CenterCrop), so each image's feature map is the same every epoch: compute it once, store it, and
feed the trainable layers from disk. Stage-1 training then skips the backbone forward (the bulk
of the FLOPs with VGG16) and the JPEG decoding.

Layout: ``<cache_dir()>/features/<backbone>-<key>/{features.npy, meta.json}`` where ``features.npy``
is an (n_images, C, h, w) float16 array read through ``numpy.memmap`` and ``key`` hashes the
backbone name and weights (a hash of its state dict), the dataset's transform and first
transformed image, and the image list (paths, sizes and a hash of each file's ends,
:func:`file_fingerprint`; not mtimes, so a copied data folder keeps its caches). The folder is
written under a temporary name and renamed into place only when complete
(``grounding.utils.io.atomic_path``), so
a crashed build never leaves a cache that a later run would use.

Robustness: a build writes ``owner.json`` (pid, host, process start time) into its temporary folder;
:func:`build_or_load` removes the temporary folders of killed builds in the cache root (owner gone
from this host, or no owner file and untouched for :data:`ORPHAN_AGE_S`) and keeps those of builds
still running. A cache folder is trusted only after :func:`cache_problem` has checked its
``features.npy`` header, its size against the header, and both against ``meta.json``; a damaged
one is removed and rebuilt with a warning, and :func:`open_cache` refuses it with the folder and
the fix. Builds print a start line, progress (a bar on a terminal, a line per tenth otherwise) and
an end line with the time and size to stderr.

Integration (contracts B): a caption dataset loads pixels through ``load_image(index)``;
:func:`attach` replaces that method on the dataset instance with a picklable
:class:`CachedFeatureLoader`, so batches' ``images`` become (B, C, h, w) feature maps, which
:class:`grounding.vgbert.streams.VisualStream` accepts directly. In training runs the
:class:`FeatureCache` callback does this: a LightningModule names its frozen CNN by
``frozen_backbone()``, a DataModule lists its image datasets by ``image_datasets()``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import re
import shutil
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import Callback
from tqdm import tqdm

from grounding.errors import UserInputError
from grounding.paths import cache_dir
from grounding.utils.io import atomic_path, sha1_of_json, state_dict_sha1
from grounding.utils.owner import owner_gone, owner_record, same_host

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
OWNER_FILE = "owner.json"
# A temporary build folder without a readable owner file from this host (a build from before owner files,
# or one on another machine sharing the folder) is abandoned once nothing in it changed for this long: a
# running build rewrites features.npy with every batch.
ORPHAN_AGE_S = 6 * 3600
# grounding.utils.io.atomic_path's temporary name for a cache folder ``<backbone>-<16 hex>``:
# ``.<folder name>.<mkstemp's random letters>.tmp`` beside it.
TEMP_NAME = re.compile(r"^\.(?P<final>.+-[0-9a-f]{16})\.[a-z0-9_]+\.tmp$")


class FeatureCacheError(UserInputError, ValueError):
    """A feature-cache folder that cannot be trusted; the message names the folder, the problem and the fix."""


# Bytes hashed at each end of an image file for the cache key. Content, not mtimes: a copy of the data (new mtimes,
# as when a data folder is copied for each session or machine) keeps its cache, while an edited photo changes its
# size or the bytes at one end (a re-encoded JPEG's header tables and the end of its scan). Files up to twice this
# are hashed whole (3 % of Flickr8k's 224-px photos, which average 15 KB); reading 8 KiB a photo keys Flickr8k's
# 8,091 in ~2 s on loaded cores, and COCO's 123k photos cost ~1 GB of reads, not their 19 GB.
FINGERPRINT_BYTES = 4096


def file_fingerprint(path: Path) -> list:
    """[size, blake2b of the first and last :data:`FINGERPRINT_BYTES` (the whole file when it is small)]."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        digest = hashlib.blake2b(f.read(FINGERPRINT_BYTES), digest_size=16)
        if size > 2 * FINGERPRINT_BYTES:
            f.seek(size - FINGERPRINT_BYTES)
        digest.update(f.read())
    return [size, digest.hexdigest()]


def image_list_fingerprint(paths) -> list:
    out = []
    for p in paths:
        p = Path(p)
        try:
            out.append([str(p.resolve()), *file_fingerprint(p)])
        except OSError:
            out.append([str(p), None, None])
    return out


def pixel_loader(dataset):
    """``dataset``'s pixel ``load_image``, also while :func:`attach` has replaced it by cached maps."""
    return getattr(dataset, "_pixel_load_image", dataset.load_image)


def cache_key(backbone: torch.nn.Module, dataset, load_image=None) -> str:
    """Hash of everything that determines the features: backbone + weights, transform, image list."""
    load_image = load_image or pixel_loader(dataset)
    first = load_image(0) if len(dataset.image_paths) else torch.zeros(0)
    return sha1_of_json({
        "version": FORMAT_VERSION,
        "backbone": getattr(backbone, "name", type(backbone).__name__),
        "weights": state_dict_sha1(backbone),
        "transform": repr(getattr(dataset, "transform", None)),
        "dataset": type(dataset).__qualname__,
        "first_image": hashlib.sha1(first.float().numpy().tobytes()).hexdigest(),
        "images": image_list_fingerprint(dataset.image_paths),
    })


class CachedFeatureLoader:
    """Picklable ``load_image`` replacement: index -> cached feature map (C,h,w) float16 tensor."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._array = None

    def __getstate__(self):
        return {"path": self.path, "_array": None}  # workers reopen the memmap lazily

    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            self._array = open_cache(self.path)
        return self._array

    def __call__(self, index: int) -> torch.Tensor:
        return torch.from_numpy(np.array(self.array[int(index)]))

    def lookup(self, indices: torch.Tensor) -> torch.Tensor:
        idx = indices.detach().cpu().numpy()
        return torch.from_numpy(np.ascontiguousarray(self.array[idx]))


def format_size(n_bytes: float) -> str:
    """``n_bytes`` for people: "812 B", "1.2 GB" (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n_bytes < 1000 or unit == "TB":
            return f"{n_bytes:.0f} {unit}" if unit == "B" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1000
    return ""  # unreachable


def npy_header(path: str | os.PathLike) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, dtype and data offset of the ``.npy`` file ``path``, from its header alone (ValueError if unreadable)."""
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version not in readers:
            raise ValueError(f".npy format version {version} (the cache writes 1.0 or 2.0)")
        try:
            shape, _fortran, dtype = readers[version](f)
        except (SyntaxError, TypeError) as e:  # numpy versions differ in what a garbled header dict raises
            raise ValueError(f"cannot parse the header: {e}") from e
        return tuple(int(d) for d in shape), np.dtype(dtype), f.tell()


def cache_problem(path: str | os.PathLike, key: str | None = None) -> str | None:
    """What makes the cache folder ``path`` untrustworthy, or None when it is sound.

    Checks, from file sizes and headers only (never the features): both files present; ``meta.json``
    readable and marked complete; the ``features.npy`` header readable; the file exactly as long as
    its header says (header + n_images x C x h x w x 2 bytes); shape, dtype and number of images as
    ``meta.json`` records them; and, given ``key``, that the folder was built for that key.
    """
    path = Path(path)
    meta_file, data_file = path / "meta.json", path / "features.npy"
    if not path.is_dir():
        return "not a folder"
    missing = [f.name for f in (meta_file, data_file) if not f.is_file()]
    if missing:
        return f"incomplete: no {' and no '.join(missing)}"
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError) as e:
        return f"meta.json unreadable ({e})"
    if not isinstance(meta, dict) or not meta.get("complete"):
        return "meta.json does not mark the cache complete"
    try:
        shape, dtype, offset = npy_header(data_file)
    except (OSError, ValueError) as e:
        return f"features.npy header unreadable ({' '.join(str(e).split())})"
    expected, size = offset + math.prod(shape) * dtype.itemsize, data_file.stat().st_size
    if size < expected:
        return f"truncated: features.npy holds {format_size(size)} of {format_size(expected)} expected"
    if size > expected:
        return f"oversized: features.npy holds {format_size(size)}, more than the {format_size(expected)} its header describes"
    meta_dtype = meta.get("dtype", "float16")
    if (list(shape) != meta.get("shape") or str(dtype) != meta_dtype or dtype != np.float16
            or meta.get("n_images", shape[0]) != shape[0]):
        return (f"inconsistent: meta.json records shape {meta.get('shape')} {meta_dtype}, features.npy holds "
                f"{list(shape)} {dtype}")
    if key is not None and meta.get("key") != key:
        return f"inconsistent: built for key {meta.get('key')}, not {key}"
    return None


def open_cache(path: str | os.PathLike) -> np.ndarray:
    """The memmapped features of a complete cache folder; a clear error for anything else (:func:`cache_problem`)."""
    path = Path(path)
    meta_file, data_file = path / "meta.json", path / "features.npy"
    if not meta_file.is_file() or not data_file.is_file():
        raise FileNotFoundError(f"{path} is not a complete feature cache (expected meta.json and features.npy); "
                                "delete it and rerun to rebuild.")
    problem = cache_problem(path)
    if problem:
        raise FeatureCacheError(f"feature cache {path} cannot be used ({problem}); rerun the command to rebuild it "
                                "(a damaged cache is replaced automatically) or delete the folder.")
    mark_used(path)
    return np.load(data_file, mmap_mode="r")


def mark_used(path: str | os.PathLike) -> None:
    """Record that the cache folder ``path`` was used now (``meta.json``'s mtime: what :func:`prune` and
    ``list`` read as "last used"); a read-only cache stays unmarked."""
    try:
        os.utime(Path(path) / "meta.json")
    except OSError:
        pass


# ------------------------------------------------------------------------------ temporaries of killed builds
def newest_mtime(folder: Path) -> float:
    times = [folder.stat().st_mtime]
    for entry in folder.iterdir():
        try:
            times.append(entry.stat().st_mtime)
        except OSError:
            pass
    return max(times)


def stale_reason(tmp: str | os.PathLike, now: float | None = None) -> str | None:
    """Why the temporary build folder ``tmp`` is abandoned, or None while its build may still be running.

    With an owner file from this host: abandoned when that pid is gone (or now names another process).
    Otherwise (no or unreadable owner file, or another host): when untouched for :data:`ORPHAN_AGE_S`.
    """
    tmp = Path(tmp)
    try:
        owner = json.loads((tmp / OWNER_FILE).read_text())
    except (OSError, ValueError):
        owner = None
    if same_host(owner):
        gone = owner_gone(owner)
        return f"its build, {gone}" if gone else None
    try:
        age = (time.time() if now is None else now) - newest_mtime(tmp)
    except OSError:
        return None  # vanished meanwhile (its build finished or another sweep removed it)
    if age < ORPHAN_AGE_S:
        return None
    who = f"owner on host {owner.get('host')}" if isinstance(owner, dict) and owner.get("host") else "no owner file"
    return f"{who}, untouched for {age / 3600:.1f} h"


def folder_size(folder: Path) -> int:
    """Bytes ``folder``'s files occupy on disk (what deleting it frees: a killed build's features.npy is a
    sparse file of the full size, only partly written)."""
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            total += st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size
    return total


def remove_stale_temporaries(root: str | os.PathLike) -> list[Path]:
    """Delete the abandoned temporary folders of feature-cache builds in ``root`` (builds killed before their
    final rename; :func:`stale_reason`), keeping those of builds that may still run. One warning per folder."""
    root = Path(root)
    try:
        entries = sorted(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    removed = []
    for tmp in entries:
        if not TEMP_NAME.match(tmp.name) or tmp.is_symlink() or not tmp.is_dir():
            continue
        reason = stale_reason(tmp)
        if reason is None:
            continue
        size = folder_size(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        if tmp.exists():
            log.warning("feature cache: could not remove the abandoned build folder %s (%s); delete it by hand", tmp,
                        format_size(size))
            continue
        log.warning("feature cache: removed the abandoned build folder %s (%s on disk; %s)", tmp, format_size(size),
                    reason)
        removed.append(tmp)
    return removed


# ------------------------------------------------------------------------------ building
class BuildProgress:
    """A build's progress on stderr: a start line, then a tqdm bar when stderr is a terminal or else a plain
    line at each further tenth of the images (batch logs keep every line), and an end line with time and size."""

    def __init__(self, path: Path, n: int, backbone_name: str, device, stream=None):
        self.path, self.n, self.done, self.next_tenth = path, n, 0, 1
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.monotonic()
        self.line(f"building feature cache {path}: {n} images with {backbone_name} on {device}")
        isatty = getattr(self.stream, "isatty", lambda: False)()
        self.bar = tqdm(total=n, unit="img", desc="feature cache", file=self.stream, leave=False) if isatty else None

    def line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def update(self, k: int) -> None:
        self.done += k
        if self.bar is not None:
            self.bar.update(k)
            return
        tenth = self.done * 10 // max(self.n, 1)
        if tenth >= self.next_tenth and self.done < self.n:  # the end line reports 100 %
            elapsed = time.monotonic() - self.started
            left = elapsed * (self.n - self.done) / self.done
            self.line(f"  feature cache: {self.done}/{self.n} images ({100 * self.done // self.n} %), "
                      f"{elapsed:.0f} s so far, about {left:.0f} s left")
            self.next_tenth = tenth + 1

    def close(self, size: int | None = None) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if size is not None:
            self.line(f"feature cache {self.path} built: {self.n} images, {format_size(size)} in "
                      f"{time.monotonic() - self.started:.1f} s")


def remove_cache_folder(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path)


class _Pixels(torch.utils.data.Dataset):
    def __init__(self, load_image, n):
        self.load_image, self.n = load_image, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.load_image(i)


@torch.no_grad()
def build_or_load(backbone: torch.nn.Module, dataset, root: str | os.PathLike | None = None, batch_size: int = 32,
                  device: torch.device | str = "cpu", num_workers: int = 0, build: bool = True) -> CachedFeatureLoader:
    """The cache of ``dataset``'s images under ``backbone``: reused when its key matches and it is sound, else built.

    ``dataset`` needs ``image_paths`` and a pixel ``load_image(index)`` (contracts B). With
    ``build=False`` a missing cache raises FileNotFoundError and a damaged one FeatureCacheError
    (non-zero DDP ranks wait for rank 0). With ``build=True`` the abandoned temporary folders of killed
    builds in the cache root are removed first, and a damaged cache folder is removed and rebuilt, each
    with a warning naming the folder; building prints its progress to stderr (:class:`BuildProgress`).
    """
    load_image = pixel_loader(dataset)
    key = cache_key(backbone, dataset, load_image)
    root = Path(root) if root is not None else cache_dir() / "features"
    backbone_name = getattr(backbone, "name", None)
    path = root / f"{(backbone_name or 'backbone').replace(':', '_')}-{key[:16]}"
    if build:
        remove_stale_temporaries(root)
    if path.exists() or path.is_symlink():
        problem = cache_problem(path, key)
        if problem is None:
            mark_used(path)
            return CachedFeatureLoader(path)
        if not build:
            raise FeatureCacheError(f"feature cache {path} cannot be used ({problem}); the rank that builds it "
                                    "(rank 0) should have replaced it: delete the folder and rerun.")
        log.warning("feature cache %s is damaged (%s); removing it and rebuilding", path, problem)
        remove_cache_folder(path)
    if not build:
        raise FileNotFoundError(f"feature cache {path} does not exist yet")
    n = len(dataset.image_paths)
    was_training = backbone.training
    backbone.eval()
    original_device = next(iter(backbone.parameters()), torch.zeros(0)).device
    backbone.to(device)
    loader = torch.utils.data.DataLoader(_Pixels(load_image, n), batch_size=batch_size, num_workers=num_workers)
    progress = BuildProgress(path, n, backbone_name or type(backbone).__name__, device)
    # The build leaves the global RNGs as it found them (a DataLoader draws a seed), so a run's numbers do
    # not depend on whether its cache was already there.
    devices = [device] if torch.device(device).type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), atomic_path(path) as tmp:
            tmp.mkdir(parents=True)
            # Who builds, so that a later run can tell this folder, if the build is killed, from a running build.
            (tmp / OWNER_FILE).write_text(json.dumps(owner_record()))
            array = None
            start = 0
            for images in loader:
                feats = backbone(images.to(device)).to(torch.float16).cpu().numpy()
                if array is None:
                    array = np.lib.format.open_memmap(tmp / "features.npy", mode="w+", dtype=np.float16,
                                                      shape=(n, *feats.shape[1:]))
                array[start:start + len(feats)] = feats
                start += len(feats)
                progress.update(len(feats))
            if array is None or start != n:
                raise RuntimeError(f"feature cache build for {n} images produced {start}")
            array.flush()
            del array
            (tmp / "meta.json").write_text(json.dumps({
                "complete": True, "shape": [n, *feats.shape[1:]], "dtype": "float16", "key": key,
                "backbone": backbone_name, "n_images": n,
                "first_path": str(dataset.image_paths[0]) if n else None}))
            (tmp / OWNER_FILE).unlink()
        progress.close((path / "features.npy").stat().st_size)
    finally:
        progress.close()
        backbone.to(original_device)
        backbone.train(was_training)
    return CachedFeatureLoader(path)


def attach(dataset, loader: CachedFeatureLoader) -> None:
    """Make ``dataset`` yield cached feature maps instead of pixels (instance-level override)."""
    if not hasattr(dataset, "_pixel_load_image"):
        dataset._pixel_load_image = dataset.load_image
    dataset.load_image = loader


def detach(dataset) -> None:
    if hasattr(dataset, "_pixel_load_image"):
        dataset.load_image = dataset._pixel_load_image
        del dataset._pixel_load_image


LOADER_HOOKS = ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader")
# The splits each loader hook reads (a DataModule's ``datasets`` keys): a `test` run caches the test photos only, not
# the training set it never reads.
LOADER_SPLITS = {"train_dataloader": ("train",), "val_dataloader": ("val",), "test_dataloader": ("test",),
                 "predict_dataloader": ("predict", "test")}


class FeatureCache(Callback):
    """Feeds a stage cached frozen-backbone feature maps instead of pixels (rank 0 builds, others wait).

    The cache is keyed by the backbone's weights, so it is attached only once the run's weights are in
    place: after the module's ``setup`` (which loads ``init_from``) and after Lightning restores a
    ``ckpt_path`` (resume, ``test --ckpt_path``). Lightning 2.x restores checkpoints after ``setup`` and
    creates the first evaluation iterator (prefetching a batch, starting DataLoader workers) before
    ``on_test_start``, so neither hook is early and late enough for every stage. The first point that
    is, for fit and evaluation alike, is the DataModule's ``*_dataloader`` hook: :meth:`setup` wraps
    those hooks of the DataModule instance to attach the cache on their first call, and
    :meth:`teardown` unwraps them.

    The LightningModule gives its frozen CNN by ``frozen_backbone()``; the DataModule its image
    datasets (``image_paths`` + ``load_image``) by ``image_datasets()``.
    """

    def __init__(self, cache_dir: str | None = None):
        self.cache_dir = cache_dir
        self._originals: dict[str, object] = {}
        self._attached: set[int] = set()

    def setup(self, trainer, pl_module, stage: str) -> None:
        dm = trainer.datamodule
        if dm is None or not hasattr(dm, "image_datasets") or not hasattr(pl_module, "frozen_backbone"):
            warnings.warn("feature_cache: needs a DataModule with image_datasets() and a LightningModule with "
                          "frozen_backbone(); running the frozen backbone on every batch instead.", stacklevel=2)
            return
        for hook in LOADER_HOOKS:
            if hook not in self._originals:
                self._originals[hook] = getattr(dm, hook)
                setattr(dm, hook, self._wrap(trainer, pl_module, self._originals[hook], LOADER_SPLITS[hook]))

    def teardown(self, trainer, pl_module, stage: str) -> None:
        dm = trainer.datamodule
        for hook in self._originals:
            if dm is not None and hook in vars(dm):
                delattr(dm, hook)
        self._originals.clear()

    def _wrap(self, trainer, pl_module, original, splits):
        @functools.wraps(original)
        def loader_hook(*args, **kwargs):
            self.attach(trainer, pl_module, splits)
            return original(*args, **kwargs)
        return loader_hook

    def attach(self, trainer, pl_module, splits: tuple[str, ...] | None = None) -> None:
        """Swap the DataModule's image datasets of ``splits`` to cached maps of the module's current backbone: all of
        them when ``splits`` is None or the DataModule keeps no ``datasets`` by split (a split never read stays
        pixels, and is never cached)."""
        backbone = pl_module.frozen_backbone()
        datamodule = trainer.datamodule
        fingerprint = state_dict_sha1(backbone)
        datasets = datamodule.image_datasets()
        by_split = getattr(datamodule, "datasets", None)
        if splits is not None and isinstance(by_split, dict):
            wanted = {id(by_split[s]) for s in splits if s in by_split}
            datasets = [ds for ds in datasets if id(ds) in wanted]
        for ds in datasets:
            if (id(ds), fingerprint) in self._attached:
                continue
            if trainer.is_global_zero:
                loader = build_or_load(backbone, ds, self.cache_dir, device=trainer.strategy.root_device,
                                       num_workers=int(getattr(datamodule, "num_workers", 0) or 0))
            trainer.strategy.barrier("feature_cache")
            if not trainer.is_global_zero:
                loader = build_or_load(backbone, ds, self.cache_dir, build=False)
            attach(ds, loader)
            self._attached.add((id(ds), fingerprint))


# ------------------------------------------------------------------------------ inventory and pruning
# A cache used this recently may still be read by a running job (DataLoader workers reopen it every epoch):
# prune keeps it whatever its size or age.
RECENT_USE_S = 3600
SIZE_UNITS = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9, "T": 1e12, "TB": 1e12}


class CacheEntry:
    """One folder of the cache root as ``list`` shows it and :func:`prune` weighs it."""

    def __init__(self, path: Path):
        self.path = path
        self.temporary = bool(TEMP_NAME.match(path.name))
        self.problem = None if self.temporary else cache_problem(path)
        self.size = folder_size(path)
        try:
            meta = json.loads((path / "meta.json").read_text())
        except (OSError, ValueError):
            meta = {}
        self.meta = meta if isinstance(meta, dict) else {}
        self.last_used = self._mtime("meta.json") or newest_mtime(path)
        self.built = self._mtime("features.npy") or self.last_used

    def _mtime(self, name: str) -> float | None:
        try:
            return (self.path / name).stat().st_mtime
        except OSError:
            return None

    @property
    def status(self) -> str:
        if self.temporary:
            return "build in progress or killed"
        return "sound" if self.problem is None else f"damaged: {self.problem}"


def cache_entries(root: str | os.PathLike | None = None) -> list[CacheEntry]:
    """Every folder under the cache root (default ``<cache_dir()>/features``), most recently used first."""
    root = Path(root) if root is not None else cache_dir() / "features"
    try:
        folders = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink()]
    except (FileNotFoundError, NotADirectoryError):
        return []
    entries = []
    for folder in folders:
        try:
            entries.append(CacheEntry(folder))
        except OSError:  # removed meanwhile
            continue
    return sorted(entries, key=lambda e: -e.last_used)


def mapped_cache_folders() -> set[Path]:
    """Cache folders whose ``features.npy`` a running process has memory-mapped now (Linux ``/proc/*/maps``;
    an empty set elsewhere): prune never removes those."""
    folders = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.endswith("/features.npy"):
                folders.add(Path(line.split(None, 5)[-1]).parent)
    return folders


def parse_size(text: str) -> int:
    """"2GB", "500 MB", "1.5G" -> bytes (powers of 1000, like :func:`format_size`)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).upper() if match else None
    if unit not in SIZE_UNITS:
        raise ValueError(f"{text!r} is not a size; expected a number with an optional unit, e.g. 2GB or 500MB")
    return int(float(match.group(1)) * SIZE_UNITS[unit])


def prune(root: str | os.PathLike | None = None, unused_days: float = 30.0, max_size: int | None = None,
          dry_run: bool = False, now: float | None = None) -> tuple[list[tuple[CacheEntry, str]], list[CacheEntry]]:
    """Remove the cache folders nobody needs: damaged ones, temporaries of killed builds (:func:`stale_reason`),
    those unused for ``unused_days``, then, least recently used first, as many as it takes to bring the rest under
    ``max_size`` bytes. A folder used in the last :data:`RECENT_USE_S` or mapped by a running process is kept.
    Returns (removed entries with the reason, kept entries); ``dry_run`` removes nothing."""
    now = time.time() if now is None else now
    mapped = {p.resolve() for p in mapped_cache_folders()}
    removed, kept = [], []
    for entry in cache_entries(root):
        in_use = now - entry.last_used < RECENT_USE_S or entry.path.resolve() in mapped
        reason = None
        if entry.temporary:
            reason = stale_reason(entry.path, now)
            reason = f"abandoned build ({reason})" if reason else None
        elif in_use:
            reason = None
        elif entry.problem is not None:
            reason = f"damaged ({entry.problem})"
        elif now - entry.last_used > unused_days * 86400:
            reason = f"unused for {(now - entry.last_used) / 86400:.1f} days"
        if reason:
            removed.append((entry, reason))
        else:
            kept.append(entry)
    if max_size is not None:
        total = sum(e.size for e in kept)
        for entry in sorted(kept, key=lambda e: e.last_used):  # least recently used first
            if total <= max_size:
                break
            if entry.temporary or now - entry.last_used < RECENT_USE_S or entry.path.resolve() in mapped:
                continue
            removed.append((entry, f"least recently used while the caches exceed {format_size(max_size)}"))
            kept.remove(entry)
            total -= entry.size
    if not dry_run:
        for entry, _reason in removed:
            shutil.rmtree(entry.path, ignore_errors=True)
    return removed, kept


def format_time(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def list_table(entries: list[CacheEntry]) -> str:
    """The ``list`` command's Markdown table, with a total line."""
    lines = ["| folder | backbone | images | feature map | size | built | last used | status | first photo |",
             "|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        shape = e.meta.get("shape") or []
        lines.append(f"| {e.path.name} | {e.meta.get('backbone', '–')} | {e.meta.get('n_images', '–')} | "
                     f"{'×'.join(map(str, shape[1:])) or '–'} | {format_size(e.size)} | {format_time(e.built)} | "
                     f"{format_time(e.last_used)} | {e.status} | {e.meta.get('first_path') or '–'} |")
    lines.append(f"\n{len(entries)} folders, {format_size(sum(e.size for e in entries))}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m grounding.feature_cache list|prune``: see what the frozen-backbone caches hold, free the disk."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m grounding.feature_cache", allow_abbrev=False,
                                description="List or prune the frozen-backbone feature caches "
                                            "($GROUNDING_CACHE/features, default .cache/features).")
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_text in (("list", "every cache folder: backbone, images, size, when built and last used"),
                            ("prune", "remove damaged caches, killed builds, caches unused for --unused-days, and "
                                      "least recently used ones beyond --max-size")):
        cmd = sub.add_parser(name, help=help_text, allow_abbrev=False)
        cmd.add_argument("--root", help="the cache root (default: the suite's features folder)")
    prune_cmd = sub.choices["prune"]
    prune_cmd.add_argument("--unused-days", type=float, default=30.0, metavar="D",
                           help="remove caches not used for D days (default 30)")
    prune_cmd.add_argument("--max-size", metavar="SIZE", help="then remove least recently used caches until the rest "
                           "fit in SIZE (e.g. 2GB)")
    prune_cmd.add_argument("--dry-run", action="store_true", help="print what would be removed, remove nothing")
    args = p.parse_args(argv)
    root = Path(args.root) if args.root else cache_dir() / "features"
    if args.root and not root.is_dir():
        print(f"python -m grounding.feature_cache: error: --root {root}: no such folder; expected a feature-cache "
              "root (default .cache/features)", file=sys.stderr)
        return 2
    if args.command == "list":
        print(list_table(cache_entries(root)))
        return 0
    try:
        max_size = parse_size(args.max_size) if args.max_size is not None else None
        if args.unused_days < 0:
            raise ValueError(f"{args.unused_days:g} is negative; expected a number of days ≥ 0")
    except ValueError as e:
        print(f"python -m grounding.feature_cache prune: error: {e}", file=sys.stderr)
        return 2
    removed, kept = prune(root, args.unused_days, max_size, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for entry, reason in removed:
        print(f"{verb} {entry.path} ({format_size(entry.size)}): {reason}")
    print(f"{verb} {len(removed)} folders, {format_size(sum(e.size for e, _ in removed))}; kept {len(kept)}, "
          f"{format_size(sum(e.size for e in kept))} in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

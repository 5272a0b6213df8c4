"""Frozen-backbone feature cache.

The visual stream's CNN is frozen and the caption transforms are deterministic (Resize +
CenterCrop), so each image's feature map is the same every epoch: compute it once, store it, and
feed the trainable layers from disk. Stage-1 training then skips the backbone forward (the bulk
of the FLOPs with VGG16) and the JPEG decoding.

Layout: ``<cache_dir()>/features/<backbone>-<key>/{features.npy, meta.json}`` where ``features.npy``
is an (n_images, C, h, w) float16 array read through ``numpy.memmap`` and ``key`` hashes the
backbone name and weights (a hash of its state dict), the dataset's transform and first
transformed image, and the image list (paths, sizes, mtimes). The folder is written under a
temporary name and renamed into place only when complete (``grounding.utils.io.atomic_path``), so
a crashed build never leaves a cache that a later run would use.

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
import os
import warnings
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch import Callback

from grounding.paths import cache_dir
from grounding.utils.io import atomic_path, sha1_of_json, state_dict_sha1

FORMAT_VERSION = 1


def image_list_fingerprint(paths) -> list:
    out = []
    for p in paths:
        p = Path(p)
        try:
            st = p.stat()
            out.append([str(p.resolve()), st.st_size, st.st_mtime_ns])
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


def open_cache(path: str | os.PathLike) -> np.ndarray:
    """The memmapped features of a complete cache folder; a clear error for anything else."""
    path = Path(path)
    meta_file, data_file = path / "meta.json", path / "features.npy"
    if not meta_file.is_file() or not data_file.is_file():
        raise FileNotFoundError(f"{path} is not a complete feature cache (expected meta.json and features.npy); "
                                "delete it and rerun to rebuild.")
    meta = json.loads(meta_file.read_text())
    array = np.load(data_file, mmap_mode="r")
    if not meta.get("complete") or list(array.shape) != meta["shape"] or array.dtype != np.float16:
        raise ValueError(f"Feature cache {path} is inconsistent (meta {meta.get('shape')} vs array "
                         f"{list(array.shape)} {array.dtype}); delete the folder to rebuild it.")
    return array


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
    """The cache of ``dataset``'s images under ``backbone``: reused when its key matches, else built.

    ``dataset`` needs ``image_paths`` and a pixel ``load_image(index)`` (contracts B). With
    ``build=False`` a missing cache raises FileNotFoundError (non-zero DDP ranks wait for rank 0).
    """
    load_image = pixel_loader(dataset)
    key = cache_key(backbone, dataset, load_image)
    root = Path(root) if root is not None else cache_dir() / "features"
    path = root / f"{getattr(backbone, 'name', 'backbone').replace(':', '_')}-{key[:16]}"
    if (path / "meta.json").is_file():
        open_cache(path)  # validates
        return CachedFeatureLoader(path)
    if not build:
        raise FileNotFoundError(f"feature cache {path} does not exist yet")
    n = len(dataset.image_paths)
    was_training = backbone.training
    backbone.eval()
    original_device = next(iter(backbone.parameters()), torch.zeros(0)).device
    backbone.to(device)
    loader = torch.utils.data.DataLoader(_Pixels(load_image, n), batch_size=batch_size, num_workers=num_workers)
    # The build leaves the global RNGs as it found them (a DataLoader draws a seed), so a run's numbers do
    # not depend on whether its cache was already there.
    devices = [device] if torch.device(device).type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), atomic_path(path) as tmp:
            tmp.mkdir(parents=True)
            array = None
            start = 0
            for images in loader:
                feats = backbone(images.to(device)).to(torch.float16).cpu().numpy()
                if array is None:
                    array = np.lib.format.open_memmap(tmp / "features.npy", mode="w+", dtype=np.float16,
                                                      shape=(n, *feats.shape[1:]))
                array[start:start + len(feats)] = feats
                start += len(feats)
            if array is None or start != n:
                raise RuntimeError(f"feature cache build for {n} images produced {start}")
            array.flush()
            del array
            (tmp / "meta.json").write_text(json.dumps({
                "complete": True, "shape": [n, *feats.shape[1:]], "dtype": "float16", "key": key,
                "backbone": getattr(backbone, "name", None), "n_images": n,
                "first_path": str(dataset.image_paths[0]) if n else None}))
    finally:
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
                setattr(dm, hook, self._wrap(trainer, pl_module, self._originals[hook]))

    def teardown(self, trainer, pl_module, stage: str) -> None:
        dm = trainer.datamodule
        for hook in self._originals:
            if dm is not None and hook in vars(dm):
                delattr(dm, hook)
        self._originals.clear()

    def _wrap(self, trainer, pl_module, original):
        @functools.wraps(original)
        def loader_hook(*args, **kwargs):
            self.attach(trainer, pl_module)
            return original(*args, **kwargs)
        return loader_hook

    def attach(self, trainer, pl_module) -> None:
        """Swap every image dataset of the DataModule to cached maps of the module's current backbone."""
        backbone = pl_module.frozen_backbone()
        datamodule = trainer.datamodule
        fingerprint = state_dict_sha1(backbone)
        for ds in datamodule.image_datasets():
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

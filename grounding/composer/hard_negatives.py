"""COMPOSER's hard-negative pool for ℓ_match (§3.3): D_i⁻ "using the strategy of Lu et al. (2019)", i.e.
ViLBERT's retrieval fine-tuning, whose hard negative of a positive (x, y) is (x, a caption of one of x's
100 nearest training images). The pool holds, for every training image, its P nearest other training
images (P = ``hard_negative_pool.pool_size``, paper 100) by the cosine of an image embedding.

Embedding sources (the paper names none; ViLBERT's comes from its own retrieval model):

* ``cnn`` (default): the frozen CNN backbone's feature map mean-pooled over the grid, read from the
  feature cache when it holds the maps, else one pass of the backbone over the training images;
* ``regions``: the mean of the image's detector region features (``region_files``);
* ``file``: ``hard_negative_pool: {embeddings: FILE.npz}`` written by any retrieval model, with ``names`` (the
  image file names, N strings; directories are ignored) and ``embeddings`` (N×d floats, any d, any
  norm). ``python -m grounding.semclip hard-negative-embeddings`` writes one from a suite checkpoint
  (or any VLM spec SemCLIP reads).

The pool is cached as ``<cache_dir()>/composer/hard_negatives/<key>.npz`` (``neighbours`` N×P int64,
``key``), keyed by the embedding source's fingerprint, the image list and P; written to a temporary
name and renamed into place, validated on load (key, shape, range, no self-neighbour) and rebuilt
when anything is off.
"""

from __future__ import annotations

import logging
import os
import zipfile
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from data_modules.file_checks import MalformedDataError, MissingDataError
from grounding.feature_cache import CachedFeatureLoader, cache_key, pixel_loader
from grounding.paths import cache_dir, resolve_path
from grounding.utils.io import atomic_path, sha1_of_file, sha1_of_json

log = logging.getLogger(__name__)

HARD_NEGATIVE_MODES = ("batch", "random", "pool")
CACHE_VERSION = 1
EMBEDDINGS_FORMAT = "an .npz with `names` (image file names, N strings) and `embeddings` (N×d floats)"


# ------------------------------------------------------------------------------------------ the math
def nearest_neighbours(embeddings: torch.Tensor, k: int, chunk: int = 256, device: torch.device | str = "cpu") -> torch.Tensor:
    """(N, min(k, N−1)) indices of every row's k most cosine-similar other rows, most similar first,
    equal similarities in index order. One (chunk, N) similarity block at a time on ``device``: O(N·chunk)
    memory, a top-k (not a sort) per block."""
    if embeddings.ndim != 2:
        raise ValueError(f"embeddings must be (N, d); got shape {tuple(embeddings.shape)}")
    if not torch.isfinite(embeddings).all():
        raise ValueError("embeddings hold NaN or infinite values; the hard-negative pool needs finite image embeddings")
    x = F.normalize(embeddings.float().to(device), dim=-1)
    n = len(x)
    k = max(min(int(k), n - 1), 0)
    out = torch.empty(n, k, dtype=torch.long)
    if k == 0:
        return out
    for start in range(0, n, chunk):  # blocks of rows: one matrix product and one top-k each
        stop = min(start + chunk, n)
        sim = x[start:stop] @ x.T
        rows = torch.arange(stop - start, device=x.device)
        sim[rows, rows + start] = float("-inf")  # never an image's own neighbour
        out[start:stop] = _top_k_lowest_index_ties(sim, k).cpu()
    return out


def _top_k_lowest_index_ties(sim: torch.Tensor, k: int) -> torch.Tensor:
    """Column indices of each row's k largest values, largest first, ties broken by the lower index (torch.topk
    leaves ties unordered): all values above the k-th, then the first columns equal to it."""
    threshold = torch.topk(sim, k, dim=1).values[:, -1:]
    chosen = sim >= threshold
    crowded = torch.nonzero(chosen.sum(1) > k).squeeze(1)  # rows with more columns equal to the k-th value than fit
    if len(crowded):
        s, t = sim[crowded], threshold[crowded]
        tie = s == t
        chosen[crowded] = (s > t) | (tie & (torch.cumsum(tie, 1) <= k - (s > t).sum(1, keepdim=True)))
    columns = torch.nonzero(chosen)[:, 1].view(len(sim), k)  # ascending column order within each row
    order = torch.sort(torch.gather(sim, 1, columns), dim=1, descending=True, stable=True).indices
    return torch.gather(columns, 1, order)


# ------------------------------------------------------------------------------------------ the cache
def pool_key(source, names: Sequence[str], size: int) -> str:
    """Fingerprint of a pool: the embedding source's, the image list (in order) and P."""
    return sha1_of_json({"version": CACHE_VERSION, "source": source, "names": [str(n) for n in names], "size": int(size)})


def pool_path(key: str, root: str | os.PathLike | None = None) -> Path:
    root = Path(root) if root is not None else cache_dir() / "composer" / "hard_negatives"
    return root / f"{key[:16]}.npz"


def read_pool(path: str | os.PathLike, key: str, n: int, k: int) -> np.ndarray | None:
    """The cached neighbours at ``path`` when they are a valid pool for ``key`` (N=n, P=k), else None (logged)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            stored, neighbours = str(z["key"]), np.asarray(z["neighbours"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        log.warning("hard-negative pool %s is unreadable (%s); rebuilding it", path, e)
        return None
    problem = None
    if stored != key:
        problem = f"its key {stored[:16]}… is not {key[:16]}…"
    elif neighbours.shape != (n, k) or not np.issubdtype(neighbours.dtype, np.integer):
        problem = f"neighbours {neighbours.shape} {neighbours.dtype}, expected ({n}, {k}) integers"
    elif neighbours.size and (neighbours.min() < 0 or neighbours.max() >= n
                              or (neighbours == np.arange(n)[:, None]).any()):
        problem = "neighbour indices out of range or an image listed as its own neighbour"
    if problem:
        log.warning("hard-negative pool %s is stale or damaged (%s); rebuilding it", path, problem)
        return None
    return neighbours.astype(np.int64)


def cached_pool(key: str, n: int, size: int, embed: Callable[[], torch.Tensor], root: str | os.PathLike | None = None,
                build: bool = True, chunk: int = 256, device: torch.device | str = "cpu") -> np.ndarray:
    """The (n, min(size, n−1)) pool of ``key``: read from the cache when valid, else ``embed()`` (N×d),
    :func:`nearest_neighbours`, written atomically. ``build=False``: a missing pool raises
    FileNotFoundError (DDP ranks other than 0 wait for rank 0's)."""
    path, k = pool_path(key, root), max(min(int(size), n - 1), 0)
    if path.is_file():
        pool = read_pool(path, key, n, k)
        if pool is not None:
            return pool
    if not build:
        raise FileNotFoundError(f"hard-negative pool {path} does not exist yet")
    embeddings = embed()
    if len(embeddings) != n:
        raise ValueError(f"the hard-negative embedding source gave {len(embeddings)} rows for {n} images")
    pool = nearest_neighbours(embeddings, size, chunk, device).numpy()
    with atomic_path(path, suffix=".npz") as tmp, open(tmp, "wb") as f:
        np.savez(f, key=np.array(key), neighbours=pool)
    log.info("hard-negative pool: %d images x %d neighbours written to %s", n, k, path)
    return pool


# ------------------------------------------------------------------------------------------ embedding sources
def read_embeddings_file(path: str | os.PathLike, names: Sequence[str]) -> torch.Tensor:
    """The rows of ``names`` (image file names) in an embeddings file (see the module doc)."""
    path = resolve_path(path)
    fix = f"write {EMBEDDINGS_FORMAT} (python -m grounding.semclip hard-negative-embeddings)"
    if not path.is_file():
        raise MissingDataError(f"hard_negative_pool.embeddings {path} does not exist; {fix}.")
    try:
        with np.load(path, allow_pickle=False) as z:
            stored, embeddings = [Path(str(s)).name for s in z["names"]], np.asarray(z["embeddings"], dtype=np.float32)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise MalformedDataError(f"hard_negative_pool.embeddings {path} is not {EMBEDDINGS_FORMAT} ({e}); {fix}.") from e
    if embeddings.ndim != 2 or len(embeddings) != len(stored):
        raise MalformedDataError(f"hard_negative_pool.embeddings {path}: embeddings {embeddings.shape} for {len(stored)} names, "
                                 f"expected (N, d) with one row a name; {fix}.")
    row = {name: i for i, name in enumerate(stored)}
    if len(row) != len(stored):
        raise MalformedDataError(f"hard_negative_pool.embeddings {path} names an image twice; {fix}.")
    missing = [n for n in names if n not in row]
    if missing:
        raise MalformedDataError(f"hard_negative_pool.embeddings {path} lacks {len(missing)} of the {len(names)} training "
                                 f"images (e.g. {missing[0]}); embed every training image.")
    return torch.from_numpy(embeddings[[row[n] for n in names]])


def region_embeddings(regions, image_paths: Sequence[Path]) -> torch.Tensor:
    """Mean detector-region feature of every image (``regions``: a :class:`data_modules.regions.RegionStore`)."""
    # one read a file, once per pool build (not a training hot path)
    return torch.from_numpy(np.stack([regions.load(p)[0].mean(0) for p in image_paths]).astype(np.float32))


class _Pixels(torch.utils.data.Dataset):
    def __init__(self, load_image, indices: np.ndarray):
        self.load_image, self.indices = load_image, indices

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        return self.load_image(int(self.indices[i]))


@torch.no_grad()
def backbone_embeddings(backbone: torch.nn.Module, dataset, indices: np.ndarray, batch_size: int = 64,
                        num_workers: int = 0, chunk: int = 256) -> torch.Tensor:
    """The frozen CNN's map of images ``indices`` of ``dataset``, mean-pooled over the grid (N, C): from
    the feature cache's maps when it is attached to ``dataset``, else one backbone pass over the pixels
    (on the backbone's device, eval mode, the global RNGs left as found)."""
    indices = np.asarray(indices, dtype=np.int64)
    if isinstance(dataset.load_image, CachedFeatureLoader):
        maps = dataset.load_image.array
        return torch.cat([torch.from_numpy(np.asarray(maps[indices[s:s + chunk]], dtype=np.float32)).mean((2, 3))
                          for s in range(0, len(indices), chunk)]) if len(indices) else torch.zeros(0, maps.shape[1])
    load_image = pixel_loader(dataset)
    device = next(iter(backbone.parameters()), torch.zeros(0)).device
    loader = torch.utils.data.DataLoader(_Pixels(load_image, indices), batch_size=batch_size, num_workers=num_workers)
    was_training = backbone.training
    backbone.eval()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            out = [backbone(images.to(device)).float().mean((2, 3)).cpu() for images in loader]
    finally:
        backbone.train(was_training)
    return torch.cat(out)


# ------------------------------------------------------------------------------------------ the training pool
def training_pool(dataset, images: np.ndarray, size: int, embeddings_file: str | None = None, regions=None,
                  backbone: torch.nn.Module | None = None, batch_size: int = 64, num_workers: int = 0,
                  root: str | os.PathLike | None = None, build: bool = True, device: torch.device | str = "cpu") -> np.ndarray:
    """(len(dataset), min(size, len(images)−1)) dataset indices: row i the nearest of ``images`` to
    image i (i in ``images``, never i itself); rows of other images are −1.

    The source: ``embeddings_file`` if given, else ``regions`` (mean detector feature) if given, else the
    frozen ``backbone`` (see :func:`backbone_embeddings`); the neighbours are computed on ``device``."""
    images = np.asarray(images, dtype=np.int64)
    if len(images) < 2:
        raise ValueError(f"a hard-negative pool needs at least 2 training images with a decomposed caption; got {len(images)}")
    paths = [dataset.image_paths[int(i)] for i in images]
    names = [p.name for p in paths]
    if embeddings_file:
        file = resolve_path(embeddings_file)
        source = {"kind": "file", "path": str(file.resolve()),
                  "sha1": sha1_of_file(file) if file.is_file() else None}

        def embed():
            return read_embeddings_file(file, names)
    elif regions is not None:
        root_path = Path(regions.root).resolve()
        # a TSV's own size and time; a folder's per-file ones (a file rewritten in place leaves the folder's alone)
        files = [root_path] if root_path.is_file() else sorted(root_path.glob("*.npz"))
        source = {"kind": "regions", "root": str(root_path),
                  "files": sha1_of_json([(f.name, (st := f.stat()).st_size, st.st_mtime_ns) for f in files])}

        def embed():
            return region_embeddings(regions, paths)
    elif backbone is not None:
        source = {"kind": "cnn", "features": cache_key(backbone, dataset)}

        def embed():
            return backbone_embeddings(backbone, dataset, images, batch_size, num_workers)
    else:
        raise ValueError("hard_negatives: pool embeds the training images with the model's frozen CNN, which this "
                         "DataModule cannot reach outside a Trainer; give hard_negative_pool.embeddings (an .npz) instead")
    local = cached_pool(pool_key(source, names, size), len(images), size, embed, root, build, device=device)
    pool = np.full((len(dataset.image_paths), local.shape[1]), -1, dtype=np.int64)
    pool[images] = images[local]
    return pool


def hard_draws(pool_size: int, max_captions: int) -> int:
    """K, the number of hard draws per positive: P × 840 (840 = lcm(1..8), so ``(key div P) mod n`` is exactly
    uniform for up to 8 captions an image), fewer when n·K would pass 2²⁴ (the float32 resolution of the
    sampler's draw)."""
    return pool_size * max(1, min(840, (1 << 24) // max(pool_size * max(max_captions, 1), 1)))


def draw_hard_captions(pool: np.ndarray, caption_ptr: np.ndarray, caption_ids: np.ndarray, image: np.ndarray,
                       key: np.ndarray) -> np.ndarray:
    """A caption of a pool neighbour of every ``image``: neighbour slot ``key mod P``, then caption
    ``(key div P) mod (its caption count)`` of the CSR (``caption_ptr``, ``caption_ids``: an image's
    decomposed captions). ``key`` is a uniform draw per positive (the sampler's, seeded per epoch)."""
    p = pool.shape[1]
    neighbour = pool[image, key % p]
    count = caption_ptr[neighbour + 1] - caption_ptr[neighbour]
    return caption_ids[caption_ptr[neighbour] + (key // p) % count]

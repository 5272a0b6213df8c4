"""Caption sets of Flickr token files, Karpathy JSON and COCO captions JSON.

All three give a :class:`CaptionSet`: images (file names, optional split) and their captions in
file order. The files are parsed by :mod:`data_modules.formats` (torch-free), so the CRG tools run
on caption files alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from data_modules.formats import (
    CaptionRecords,
    read_caption_file,
    read_coco_json,
    read_flickr_token_pairs,
    read_text,
)
from data_modules.formats import read_karpathy_json as read_karpathy_records
from grounding.errors import UserInputError


class CaptionFileError(UserInputError, ValueError):
    """A caption file is not in any supported layout; the message names file and fix."""


KARPATHY_REQUIRED = ("filename", "sentences")  # COMPOSER's own MCD files carry a split; other layouts need none

# C30K (§5.1): "a subset training data C30K, which contains the same amount of images as the F30K" training
# split (29,000 images, the Karpathy / Faghri et al. 2017 split), drawn here from the Karpathy COCO training
# split the paper's full-COCO models use, train + restval (113,287 images), with a fixed seed.
C30K_IMAGES = 29_000
C30K_SPLITS = ("train", "restval")
C30K_SEED = 0
# §5.1 / App. B: an evaluation split holds 1,000 images and 5,000 text queries (5 captions per image).
MCD_CAPTIONS_PER_IMAGE = 5


@dataclass
class CaptionSet:
    """Captions grouped by image. ``caption_image[j]`` is the image row of caption ``j``."""

    image_names: list[str]
    captions: list[str]
    caption_image: np.ndarray
    splits: list[str] | None = None
    image_ids: list[int] | None = None   # dataset's own ids (cocoid / imgid) when known
    source: str = ""
    dataset: str = ""
    meta: dict = field(default_factory=dict)
    rows: np.ndarray | None = None       # caption rows in the file read (kept through subset())

    def __post_init__(self):
        if self.rows is None:
            self.rows = np.arange(len(self.captions), dtype=np.int64)

    @property
    def n_images(self) -> int:
        return len(self.image_names)

    def __len__(self) -> int:
        return len(self.captions)

    def captions_of(self, image: int) -> list[str]:
        return [self.captions[j] for j in np.flatnonzero(self.caption_image == image)]

    def subset(self, images: Sequence[int] | np.ndarray) -> "CaptionSet":
        """Keep the given image rows (in that order) and all their captions."""
        images = np.asarray(images, dtype=np.int64)
        remap = np.full(self.n_images, -1, dtype=np.int64)
        remap[images] = np.arange(len(images))
        order = np.argsort(remap[self.caption_image], kind="stable")
        order = order[remap[self.caption_image][order] >= 0]
        return CaptionSet(
            image_names=[self.image_names[i] for i in images],
            captions=[self.captions[j] for j in order],
            caption_image=remap[self.caption_image[order]],
            splits=[self.splits[i] for i in images] if self.splits is not None else None,
            image_ids=[self.image_ids[i] for i in images] if self.image_ids is not None else None,
            source=self.source, dataset=self.dataset, meta=dict(self.meta), rows=self.rows[order])

    def sample_images(self, n: int, seed: int = 0) -> "CaptionSet":
        """A seeded random subset of ``n`` images (kept in file order) with all their captions."""
        if not 0 < n <= self.n_images:
            raise CaptionFileError(f"{self.source}: cannot sample {n:,} images from the {self.n_images:,} selected")
        return self.subset(np.sort(np.random.default_rng(seed).choice(self.n_images, size=n, replace=False)))

    def first_captions(self, n: int) -> "CaptionSet":
        """Each image's first ``n`` captions in file order (COCO images have 6-7; a split holds 5)."""
        if n < 1:
            raise ValueError(f"captions per image must be >= 1, got {n}")
        order = np.argsort(self.caption_image, kind="stable")
        first = np.searchsorted(self.caption_image[order], self.caption_image[order], side="left")
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order)) - first  # j's position among its image's captions
        keep = np.flatnonzero(rank < n)
        return CaptionSet(self.image_names, [self.captions[j] for j in keep], self.caption_image[keep], self.splits,
                          self.image_ids, self.source, self.dataset, dict(self.meta), self.rows[keep])

    def filter_splits(self, splits: Iterable[str] | None) -> "CaptionSet":
        if not splits:
            return self
        wanted = set(splits)
        if self.splits is None:
            raise CaptionFileError(f"{self.source}: has no split information, cannot select splits {sorted(wanted)}; "
                                   "pass a Karpathy JSON or an image list (--*-images) instead")
        return self.subset([i for i, s in enumerate(self.splits) if s in wanted])

    def filter_images(self, names: Iterable[str]) -> "CaptionSet":
        wanted = set(names)
        return self.subset([i for i, n in enumerate(self.image_names) if n in wanted])


def _from_pairs(pairs: list[tuple[str, str]], source: str, dataset: str, splits: dict[str, str] | None = None,
                ids: dict[str, int] | None = None) -> CaptionSet:
    names: dict[str, int] = {}
    caption_image = np.empty(len(pairs), dtype=np.int64)
    for j, (name, _) in enumerate(pairs):
        caption_image[j] = names.setdefault(name, len(names))
    image_names = list(names)
    return CaptionSet(image_names, [c for _, c in pairs], caption_image,
                      [splits.get(n, "") for n in image_names] if splits else None,
                      [ids[n] for n in image_names] if ids else None, source, dataset)


def _flickr_dataset(path: Path) -> str:
    lower = path.name.lower()
    return "flickr8k" if "8k" in lower else "flickr30k" if ("30k" in lower or lower.startswith("results_2013")) else "flickr"


def read_flickr_tokens(path: str | Path) -> CaptionSet:
    """``image.jpg#i<TAB>caption`` lines (Flickr8k ``Flickr8k.token.txt``, Flickr30K ``results_20130124.token``)."""
    path = Path(path)
    return _from_pairs(read_flickr_token_pairs(path, CaptionFileError), str(path), _flickr_dataset(path))


def _karpathy_set(rec: CaptionRecords) -> CaptionSet:
    pairs, splits, ids = [], {}, {}
    for im in rec.images:
        name = im.key
        splits[name] = "" if im.split is None else im.split
        ids[name] = int(im.image_id if im.image_id is not None else im.imgid if im.imgid is not None else len(ids))
        pairs.extend((name, c) for c in im.captions)
    return _from_pairs(pairs, str(rec.path), rec.dataset, splits, ids)


def _coco_set(rec: CaptionRecords) -> CaptionSet:
    """Images by COCO id, each image's captions by annotation id (the order of the annotation list aside)."""
    file_of = {im.image_id: im.file_name for im in rec.images}
    image_of = [rec.images[row].image_id for row, _ in rec.pairs]
    order = sorted(range(len(rec.pairs)), key=lambda j: (image_of[j], rec.caption_ids[j]))
    pairs = [(file_of[image_of[j]], rec.pairs[j][1].strip()) for j in order]
    ids = {file_of[i]: int(i) for i in file_of}
    return _from_pairs(pairs, str(rec.path), "coco", None, ids)


def read_karpathy_json(path: str | Path, obj: dict | None = None) -> CaptionSet:
    """Karpathy split file (``dataset_coco.json`` / ``dataset_flickr30k.json``)."""
    return _karpathy_set(read_karpathy_records(path, CaptionFileError, obj=obj, required=KARPATHY_REQUIRED))


def read_coco_captions(path: str | Path, obj: dict | None = None) -> CaptionSet:
    """Official COCO ``captions_*.json`` (``images`` with ``id``/``file_name``, ``annotations`` with ``image_id``/``caption``)."""
    return _coco_set(read_coco_json(path, CaptionFileError, obj=obj))


def _flickr_set(rec: CaptionRecords) -> CaptionSet:
    return _from_pairs(rec.key_pairs(), str(rec.path), _flickr_dataset(rec.path))


_SETS: dict[str, Callable[[CaptionRecords], CaptionSet]] = {"karpathy": _karpathy_set, "coco": _coco_set,
                                                            "flickr_token": _flickr_set}


def c30k(captions: CaptionSet, seed: int = C30K_SEED, n_images: int | None = None) -> CaptionSet:
    """C30K (§5.1): ``n_images`` (default :data:`C30K_IMAGES`, 29,000) images drawn with ``seed`` from the
    Karpathy COCO train + restval images of ``captions`` (``dataset_coco.json`` read whole or restricted to
    those splits), kept in file order with all their captions."""
    if captions.splits is None:
        raise CaptionFileError(f"{captions.source}: C30K is drawn from the Karpathy COCO training split "
                               f"({' + '.join(C30K_SPLITS)}); give dataset_coco.json (Karpathy JSON with splits)")
    n_images = C30K_IMAGES if n_images is None else n_images
    pool = captions.filter_splits(C30K_SPLITS)
    if pool.n_images < n_images:
        raise CaptionFileError(f"{captions.source}: only {pool.n_images:,} images in splits {'+'.join(C30K_SPLITS)}, "
                               f"C30K needs {n_images:,}")
    return pool.sample_images(n_images, seed)


def read_captions(path: str | Path, splits: Sequence[str] | None = None,
                  images_list: str | Path | Sequence[str | Path] | None = None) -> CaptionSet:
    """Read any supported caption file, optionally keeping only some Karpathy splits or the
    images named (one a line) in ``images_list`` (e.g. ``Flickr_8k.trainImages.txt``)."""
    path = Path(path)
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise CaptionFileError(f"caption file {path} {what}; give a Flickr token file, a Karpathy JSON or a COCO "
                               "captions JSON (e.g. data/world/flickr/Flickr8k.token.txt)")
    # any non-JSON file is a Flickr token file here (a malformed line is an error, not a plain-text caption)
    rec = read_caption_file(path, CaptionFileError, plain_text=False, karpathy_keys=KARPATHY_REQUIRED)
    cs = _SETS[rec.format](rec)
    cs = cs.filter_splits(splits)
    if images_list is not None:
        lists = [images_list] if isinstance(images_list, (str, Path)) else list(images_list)
        names = []
        for lst in lists:
            if not Path(lst).is_file():
                what = "is a folder, not a file" if Path(lst).is_dir() else "does not exist"
                raise CaptionFileError(f"image list {lst} {what} (expected a file of image file names, one a line, "
                                       "e.g. Flickr_8k.trainImages.txt)")
            text = read_text(lst, CaptionFileError, expected="UTF-8 text, one image file name a line")
            names += [ln.strip() for ln in text.splitlines() if ln.strip()]
        cs = cs.filter_images(names)
    if len(cs) == 0:
        raise CaptionFileError(f"{path}: no captions left after selecting splits={splits} images_list={images_list}")
    return cs

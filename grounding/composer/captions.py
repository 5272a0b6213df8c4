"""Caption-set readers: Flickr token files, Karpathy JSON and COCO captions JSON.

All three give a :class:`CaptionSet`: images (file names, optional split) and their captions in
file order. Kept independent of ``data_modules`` so the CRG tools run on caption files alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from data_modules.formats import read_flickr_token_pairs


class CaptionFileError(ValueError):
    """A caption file is not in any supported layout; the message names file and fix."""


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


def read_flickr_tokens(path: str | Path) -> CaptionSet:
    """``image.jpg#i<TAB>caption`` lines (Flickr8k ``Flickr8k.token.txt``, Flickr30K ``results_20130124.token``)."""
    path = Path(path)
    pairs = read_flickr_token_pairs(path, CaptionFileError)
    lower = path.name.lower()
    dataset = "flickr8k" if "8k" in lower else "flickr30k" if ("30k" in lower or lower.startswith("results_2013")) else "flickr"
    return _from_pairs(pairs, str(path), dataset)


def read_karpathy_json(path: str | Path, obj: dict | None = None) -> CaptionSet:
    """Karpathy split file (``dataset_coco.json`` / ``dataset_flickr30k.json``)."""
    path = Path(path)
    obj = obj if obj is not None else json.loads(path.read_text(encoding="utf-8"))
    pairs, splits, ids = [], {}, {}
    for img in obj["images"]:
        name = str(Path(img.get("filepath", "")) / img["filename"]) if img.get("filepath") else img["filename"]
        splits[name] = img.get("split", "")
        ids[name] = int(img.get("cocoid", img.get("imgid", len(ids))))
        for s in img["sentences"]:
            pairs.append((name, s.get("raw") or " ".join(s["tokens"])))
    cs = _from_pairs(pairs, str(path), obj.get("dataset", ""), splits, ids)
    return cs


def read_coco_captions(path: str | Path, obj: dict | None = None) -> CaptionSet:
    """Official COCO ``captions_*.json`` (``images`` with ``id``/``file_name``, ``annotations`` with ``image_id``/``caption``)."""
    path = Path(path)
    obj = obj if obj is not None else json.loads(path.read_text(encoding="utf-8"))
    file_of = {im["id"]: im["file_name"] for im in obj["images"]}
    anns = sorted(obj["annotations"], key=lambda a: (a["image_id"], a.get("id", 0)))
    missing = [a["image_id"] for a in anns if a["image_id"] not in file_of]
    if missing:
        raise CaptionFileError(f"{path}: annotations refer to image ids absent from 'images' (e.g. {missing[0]})")
    pairs = [(file_of[a["image_id"]], a["caption"].strip()) for a in anns]
    ids = {file_of[i]: int(i) for i in file_of}
    return _from_pairs(pairs, str(path), "coco", None, ids)


def read_captions(path: str | Path, splits: Sequence[str] | None = None,
                  images_list: str | Path | Sequence[str | Path] | None = None) -> CaptionSet:
    """Read any supported caption file, optionally keeping only some Karpathy splits or the
    images named (one a line) in ``images_list`` (e.g. ``Flickr_8k.trainImages.txt``)."""
    path = Path(path)
    if not path.is_file():
        raise CaptionFileError(f"caption file {path} does not exist")
    if path.suffix == ".json":
        try:
            obj = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise CaptionFileError(f"{path}: not valid JSON ({e})") from e
        if isinstance(obj, dict) and "images" in obj and obj["images"] and "sentences" in obj["images"][0]:
            cs = read_karpathy_json(path, obj)
        elif isinstance(obj, dict) and "annotations" in obj and "images" in obj:
            cs = read_coco_captions(path, obj)
        else:
            raise CaptionFileError(f"{path}: expected a Karpathy split JSON ({{'images': [{{'sentences': ...}}]}}) "
                                   "or a COCO captions JSON ({'images': [...], 'annotations': [...]})")
    else:
        cs = read_flickr_tokens(path)
    cs = cs.filter_splits(splits)
    if images_list is not None:
        lists = [images_list] if isinstance(images_list, (str, Path)) else list(images_list)
        names = []
        for lst in lists:
            if not Path(lst).is_file():
                raise CaptionFileError(f"image list {lst} does not exist (expected one image file name a line)")
            names += [ln.strip() for ln in Path(lst).read_text().splitlines() if ln.strip()]
        cs = cs.filter_images(names)
    if len(cs) == 0:
        raise CaptionFileError(f"{path}: no captions left after selecting splits={splits} images_list={images_list}")
    return cs

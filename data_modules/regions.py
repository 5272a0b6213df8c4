"""Precomputed detector regions (Bottom-Up Attention Faster R-CNN, as COMPOSER and ViLBERT use them).

Two layouts, the ones users have:

* a folder of ``<image stem>.npz`` files, each with ``features`` (N, D), ``boxes`` (N, 4: x1, y1, x2, y2 in
  pixels), ``image_h`` and ``image_w``;
* the bottom-up-attention TSV (``image_id, image_w, image_h, num_boxes, boxes, features``; boxes and
  features base64 float32), one image a line — indexed once by byte offset, read per image.

Boxes come back normalised to [0, 1] by the image size (the 5-d location of the paper is built from them).
An image is found by its file stem, or by the number its stem ends with (COCO's
``COCO_val2014_000000391895`` -> 391895, Flickr's ``1000092795``). A missing or malformed entry is
reported with its path.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import numpy as np

from .file_checks import MalformedDataError, MissingDataError
from .formats import load_json

TSV_FIELDS = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
NPZ_KEYS = ("features", "boxes", "image_h", "image_w")
HINT = ("region files: a folder of <image stem>.npz (features N×D, boxes N×4 in pixels, image_h, image_w) or a "
        "bottom-up-attention .tsv (image_id, image_w, image_h, num_boxes, boxes, features; base64 float32)")


def _normalise(boxes: np.ndarray, w: float, h: float, where: str, hint: str = HINT) -> np.ndarray:
    if w <= 0 or h <= 0:
        raise MalformedDataError(f"{where}: image size {w}x{h} is not positive. Expected {hint}.")
    return np.clip(boxes.astype(np.float32) / np.array([w, h, w, h], dtype=np.float32), 0.0, 1.0)


def crop_boxes(boxes: np.ndarray, width: float, height: float, resize_size: int, image_size: int) -> np.ndarray:
    """Pixel boxes (N, 4: x1, y1, x2, y2) of a ``width`` x ``height`` image as the suite's image transform sees
    them (short side resized to ``resize_size``, then a centre crop of ``image_size``; torchvision's rounding),
    normalised to the crop and clipped to it; boxes left with no area are dropped."""
    scale = resize_size / min(width, height)
    new_w = resize_size if width <= height else int(resize_size * width / height)
    new_h = resize_size if height <= width else int(resize_size * height / width)
    left, top = int(round((new_w - image_size) / 2.0)), int(round((new_h - image_size) / 2.0))
    xyxy = boxes.astype(np.float32) * np.float32(scale) - np.array([left, top, left, top], dtype=np.float32)
    xyxy = np.clip(xyxy / np.float32(image_size), 0.0, 1.0)
    return xyxy[(xyxy[:, 2] > xyxy[:, 0]) & (xyxy[:, 3] > xyxy[:, 1])]


def read_npz_regions(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(features (N, D) float32, boxes (N, 4) normalised) of one image's ``.npz``."""
    path = Path(path)
    if not path.is_file():
        raise MissingDataError(f"region file {path} does not exist. Expected {HINT}.")
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in NPZ_KEYS if k not in z]
            if missing:
                raise MalformedDataError(f"region file {path} lacks {', '.join(missing)}. Expected {HINT}.")
            features, boxes = z["features"].astype(np.float32), z["boxes"]
            h, w = float(z["image_h"]), float(z["image_w"])
    except (OSError, ValueError) as e:
        raise MalformedDataError(f"region file {path} is not a readable .npz ({e}). Expected {HINT}.") from e
    if features.ndim != 2 or boxes.shape != (len(features), 4):
        raise MalformedDataError(f"region file {path}: features {features.shape} and boxes {boxes.shape} do not pair "
                                 f"up as (N, D) and (N, 4). Expected {HINT}.")
    return features, _normalise(boxes, w, h, str(path))


def image_keys(image_path: str | Path) -> list[str]:
    """Names an image's regions may be filed under: its stem, then the number the stem ends with."""
    stem = Path(image_path).stem
    digits = re.search(r"(\d+)$", stem)
    return [stem] + ([str(int(digits.group(1)))] if digits else [])


class RegionStore:
    """Regions of every image of a dataset from a folder of ``.npz`` files or one TSV (see module doc)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._offsets: dict[str, int] | None = None
        if not self.root.exists():
            raise MissingDataError(f"region files {self.root} do not exist. Expected {HINT}.")
        if self.root.is_file():
            self._index_tsv()

    def _index_tsv(self) -> None:
        self._offsets = {}
        with open(self.root, "rb") as f:
            offset = 0
            for line in f:
                key = line.split(b"\t", 1)[0].decode("utf-8", "replace").strip()
                if key and key != "image_id":
                    self._offsets[key] = offset
                offset += len(line)

    def load(self, image_path: str | Path) -> tuple[np.ndarray, np.ndarray]:
        keys = image_keys(image_path)
        if self._offsets is None:
            for key in keys:
                if (self.root / f"{key}.npz").is_file():
                    return read_npz_regions(self.root / f"{key}.npz")
            raise MissingDataError(f"no region file for image {image_path} in {self.root} (looked for "
                                   f"{', '.join(k + '.npz' for k in keys)}). Expected {HINT}.")
        for key in keys:
            if key in self._offsets:
                return self._read_tsv_line(key)
        raise MissingDataError(f"image {image_path} (ids {', '.join(keys)}) is not in the region TSV {self.root}. "
                               f"Expected {HINT}.")

    def _read_tsv_line(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        with open(self.root, "rb") as f:
            f.seek(self._offsets[key])
            fields = f.readline().decode("utf-8").rstrip("\r\n").split("\t")
        where = f"{self.root} (image_id {key})"
        if len(fields) != len(TSV_FIELDS):
            raise MalformedDataError(f"{where}: {len(fields)} tab-separated fields, expected {len(TSV_FIELDS)} "
                                     f"({', '.join(TSV_FIELDS)}).")
        try:
            w, h, n = float(fields[1]), float(fields[2]), int(fields[3])
            boxes = np.frombuffer(base64.b64decode(fields[4]), dtype=np.float32).reshape(n, 4)
            features = np.frombuffer(base64.b64decode(fields[5]), dtype=np.float32).reshape(n, -1)
        except (ValueError, TypeError) as e:
            raise MalformedDataError(f"{where}: boxes/features are not base64 float32 of num_boxes rows ({e}). "
                                     f"Expected {HINT}.") from e
        return features.copy(), _normalise(boxes, w, h, where)



BOX_HINT = ("object boxes: Visual Genome's objects.json (a list of {image_id, objects: [{x, y, w, h, ...}]}, pixels) "
            "with image_data.json (a list of {image_id, width, height}) in the same folder, as VG v1.4 and the "
            "embedded world (`make world`: data/world/visual_genome/) ship them")


class BoxStore:
    """Object boxes of every image from Visual Genome's ``objects.json`` (+ ``image_data.json`` for the image
    sizes), for COMPOSER's ``region_source: boxes`` (RoI-aligned backbone features over these boxes).

    An image is found as :class:`RegionStore` finds it (file stem, or the number the stem ends with = VG's
    ``image_id``). Boxes come back normalised to [0, 1], at most ``max_boxes`` in file order (paper: up to
    100 regions): of the whole image, or with ``resize_size`` and ``image_size`` of the image as the suite's
    transform crops it (:func:`crop_boxes`; boxes outside the crop dropped). An image without (remaining)
    objects gets the whole-image box, so every image has a region.
    """

    def __init__(self, objects_path: str | Path, max_boxes: int = 100, resize_size: int | None = None,
                 image_size: int | None = None):
        self.path = Path(objects_path)
        self.crop = (resize_size, image_size) if resize_size and image_size else None
        if not self.path.is_file():
            raise MissingDataError(f"object boxes {self.path} do not exist. Expected {BOX_HINT}.")
        if max_boxes < 1:
            raise ValueError(f"max_boxes must be at least 1; got {max_boxes}")
        sizes_path = self.path.with_name("image_data.json")
        if not sizes_path.is_file():
            raise MissingDataError(f"{sizes_path} (image sizes for {self.path.name}) does not exist. Expected {BOX_HINT}.")
        try:
            sizes = {int(e["image_id"]): (float(e["width"]), float(e["height"]))
                     for e in load_json(sizes_path, MalformedDataError, BOX_HINT, "Visual Genome", "image_data.json")}
        except (KeyError, TypeError, ValueError) as e:
            raise MalformedDataError(f"{sizes_path}: an entry lacks image_id/width/height ({e!r}). Expected {BOX_HINT}.") from e
        self.boxes: dict[str, np.ndarray] = {}
        for entry in load_json(self.path, MalformedDataError, BOX_HINT, "Visual Genome", "objects.json"):
            try:
                image_id = int(entry["image_id"])
                xywh = np.array([[o["x"], o["y"], o["w"], o["h"]] for o in entry["objects"][:max_boxes]],
                                dtype=np.float32).reshape(-1, 4)
            except (KeyError, TypeError, ValueError) as e:
                raise MalformedDataError(f"{self.path}: an entry lacks image_id or an object's x/y/w/h ({e!r}). "
                                         f"Expected {BOX_HINT}.") from e
            if image_id not in sizes:
                raise MalformedDataError(f"{self.path}: image_id {image_id} has no size in {sizes_path}. Expected {BOX_HINT}.")
            xyxy = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], 1)
            w, h = sizes[image_id]
            if w <= 0 or h <= 0:
                raise MalformedDataError(f"{sizes_path}: image_id {image_id} has size {w}x{h}. Expected {BOX_HINT}.")
            self.boxes[str(image_id)] = (crop_boxes(xyxy, w, h, *self.crop) if self.crop
                                         else _normalise(xyxy, w, h, str(self.path), BOX_HINT))

    def load(self, image_path: str | Path) -> np.ndarray:
        """(N, 4) normalised boxes of one image."""
        for key in image_keys(image_path):
            if key in self.boxes:
                boxes = self.boxes[key]
                return boxes if len(boxes) else np.array([[0.0, 0.0, 1.0, 1.0]], dtype=np.float32)
        raise MissingDataError(f"image {image_path} (ids {', '.join(image_keys(image_path))}) has no entry in "
                               f"{self.path}. Expected {BOX_HINT}.")

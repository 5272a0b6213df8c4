"""Karpathy split files (dataset_coco.json / dataset_flickr30k.json / dataset_flickr8k.json), read by
``data_modules.formats``.
"""

from __future__ import annotations

from pathlib import Path

from .captions import SPLITS
from .file_checks import MalformedDataError
from .formats import CaptionImage, karpathy_caption, read_karpathy_json


def karpathy_entries(path: Path, dataset: str, hint: str) -> list[CaptionImage]:
    """The validated images of a Karpathy split file (``file_name``, ``filepath``, ``split``,
    ``image_id`` = cocoid, ``captions``)."""
    return read_karpathy_json(path, MalformedDataError, hint, dataset).images


def karpathy_sentences(entry: CaptionImage | dict) -> list[str]:
    """The captions of one image (a :class:`CaptionImage` or a raw Karpathy JSON entry)."""
    if isinstance(entry, CaptionImage):
        return list(entry.captions)
    return [karpathy_caption(s) for s in entry["sentences"]]


def karpathy_split(entry: CaptionImage | dict, use_restval: bool = True) -> str | None:
    """Karpathy's split name mapped to ours: restval -> train (if wanted); anything else dropped."""
    split = entry.split if isinstance(entry, CaptionImage) else entry["split"]
    if split == "restval":
        return "train" if use_restval else None
    return split if split in SPLITS else None


"""MS COCO captions: the official 2017 (or 2014) annotation files, or Karpathy's dataset_coco.json.

Splits:
* ``layout: official`` without a Karpathy file: train = train2017 images, val = test = val2017 images
  (VG-BERT's setting: 118,287 training images, retrieval on the 5,000 val2017 images).
* ``layout: official`` with ``karpathy_file``: captions and files from the official annotations,
  split membership from Karpathy's file by COCO id (restval -> train when ``use_restval``).
* ``layout: karpathy``: everything from dataset_coco.json; images at ``root/<filepath>/<filename>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from grounding.training_images import image_key

from .base import CaptionDataModule
from .captions import CaptionSplit
from .file_checks import WORLD_HINT, MalformedDataError, malformed, require_file, resolve
from .formats import COCO_SCHEMA, CaptionImage, read_coco_json
from .karpathy import karpathy_entries, karpathy_sentences, karpathy_split
from .options import CaptionLoaderOptions, ImageTransform, SplitSubsets

COCO_LAYOUT = """\
  <root>/annotations/captions_train2017.json   official COCO captions ("images" + "annotations")
  <root>/annotations/captions_val2017.json
  <root>/train2017/<file_name>.jpg
  <root>/val2017/<file_name>.jpg
  <root>/dataset_coco.json                     optional Karpathy split file (layout: karpathy, or karpathy_file)"""

OFFICIAL_SCHEMA = COCO_SCHEMA
COCO_HINT = ("point root at your COCO folder containing annotations/captions_train2017.json and the image "
             f"folders, or {WORLD_HINT} (root: data/world/coco)")


class CocoCaptionsDataModule(CaptionDataModule):
    """COCO captions (see the module docstring for the split rules).

    Args beyond the shared ones: ``layout`` ("official" | "karpathy"); ``karpathy_file`` (relative to
    root; default dataset_coco.json for the karpathy layout); ``use_restval`` (Karpathy's restval
    images join train: the 113,287-image training set); ``train_set`` / ``val_set``: the official
    set names (train2017 / val2017, or train2014 / val2014); ``exclude_eval_images`` (checkpoints or image lists
    whose images leave val/test, see :class:`~data_modules.base.CaptionDataModule`). Images are keyed by their
    COCO id (``coco:<id>``, grounding.training_images).
    """

    dataset_name = "COCO captions"
    layout = COCO_LAYOUT
    hint = COCO_HINT

    def __init__(self, root: str = "data/world/coco", layout: Literal["official", "karpathy"] = "official",
                 karpathy_file: str | None = None, use_restval: bool = True, train_set: str = "train2017",
                 val_set: str = "val2017", text_encoder: str = "minilm", max_length: int = 32,
                 batch_size: int = 32, eval_batch_size: int | None = None,
                 transform: ImageTransform = ImageTransform(), loader: CaptionLoaderOptions = CaptionLoaderOptions(),
                 seed: int = 0, subsets: SplitSubsets = SplitSubsets(),
                 exclude_eval_images: list[str] | str | None = None):
        super().__init__(root, text_encoder, max_length, batch_size, eval_batch_size, transform, loader, seed, subsets,
                         exclude_eval_images)
        if layout not in ("official", "karpathy"):
            raise ValueError(f"CocoCaptionsDataModule: layout must be 'official' or 'karpathy', not {layout!r}")
        self.coco_layout = layout
        self.karpathy_file = karpathy_file
        self.use_restval = use_restval
        self.train_set = train_set
        self.val_set = val_set

    # -- readers -------------------------------------------------------------------------------
    def _official(self, root: Path, image_set: str) -> dict[int, tuple[Path, list[str]]]:
        """COCO id -> (image path, captions) from annotations/captions_<set>.json, in file order."""
        path = require_file(root / "annotations" / f"captions_{image_set}.json", self.dataset_name, COCO_LAYOUT,
                            COCO_HINT)
        records = read_coco_json(path, MalformedDataError, COCO_HINT, self.dataset_name)
        # an id listed twice keeps its first position and its last entry (the one its captions went to)
        return {im.image_id: (root / image_set / im.file_name, im.captions) for im in records.images}

    def _karpathy(self, root: Path) -> tuple[list[CaptionImage], Path]:
        name = self.karpathy_file or "dataset_coco.json"
        path = require_file(resolve(root, name), self.dataset_name, COCO_LAYOUT,
                            f"set karpathy_file to your dataset_coco.json (Karpathy's COCO split), or {COCO_HINT}")
        return karpathy_entries(path, self.dataset_name, COCO_HINT), path

    def input_files(self, root: Path) -> list[tuple[Path, str]]:
        if self.coco_layout == "karpathy":
            return [(resolve(root, self.karpathy_file or "dataset_coco.json"),
                     f"set karpathy_file to your dataset_coco.json (Karpathy's COCO split), or {COCO_HINT}")]
        return [(root / "annotations" / f"captions_{s}.json", COCO_HINT) for s in dict.fromkeys((self.train_set, self.val_set))]

    def read_splits(self, root: Path) -> dict[str, CaptionSplit]:
        splits = {s: CaptionSplit() for s in ("train", "val", "test")}
        if self.coco_layout == "karpathy":
            entries, _ = self._karpathy(root)
            for e in entries:
                split = karpathy_split(e, self.use_restval)
                if split is not None:
                    splits[split].add(root / e.filepath / e.file_name, karpathy_sentences(e), image_key("coco", e.image_id))
            return splits

        train = self._official(root, self.train_set)
        val = self._official(root, self.val_set)
        if self.karpathy_file is None:
            for coco_id, (path, caps) in train.items():
                splits["train"].add(path, caps, image_key("coco", coco_id))
            for coco_id, (path, caps) in val.items():  # val2017 serves validation and test
                splits["val"].add(path, caps, image_key("coco", coco_id))
                splits["test"].add(path, caps, image_key("coco", coco_id))
            return splits

        pooled = {**train, **val}
        entries, kpath = self._karpathy(root)
        unknown = []
        for i, e in enumerate(entries):
            if e.image_id is None:
                raise malformed(kpath, self.dataset_name, f'lacks "cocoid" at images[{i}] (needed to join it with '
                                f'the official annotations)', "Karpathy's dataset_coco.json", COCO_HINT)
            split = karpathy_split(e, self.use_restval)
            if split is None:
                continue
            if e.image_id not in pooled:
                unknown.append(e.image_id)
                continue
            path, caps = pooled[e.image_id]
            splits[split].add(path, caps, image_key("coco", e.image_id))
        if unknown:
            raise malformed(kpath, self.dataset_name,
                            f"names {len(unknown)} COCO id(s) absent from captions_{self.train_set}.json and "
                            f"captions_{self.val_set}.json (e.g. {unknown[:5]})",
                            "every cocoid of the Karpathy file present in the official annotations",
                            "use the official annotations matching the Karpathy file (2014 and 2017 hold the same "
                            "123,287 images), or layout: karpathy")
        return splits

    def missing_image_hint(self, root: Path) -> str:
        extra = ""
        if self.coco_layout == "karpathy":
            extra = (" Karpathy's dataset_coco.json names 2014 files (train2014/COCO_train2014_*.jpg); with 2017 "
                     "image folders use layout: official with karpathy_file: dataset_coco.json instead.")
        return f"put the COCO images under {root} as the layout says:\n{COCO_LAYOUT}\n{extra}"

"""Image classification folders (ImageNet's layout) for VG-BERT's stage 0, the visual stream's classification
pretraining (paper App. A.1; the official ``visual_stream_pretraining.py`` reads the same tree with torchvision's
``ImageFolder``)::

    <root>/train/<class>/*.JPEG     one folder per class (ImageNet: the WordNet id, n01440764 ...)
    <root>/val/<class>/*.JPEG       classes named as in train (a subset of them)
    <root>/test/<class>/*.JPEG      optional; ``test`` falls back to val (ImageNet reports val)

The classes are train's subfolders, sorted (torchvision's order): :attr:`ImageFolderDataModule.class_names`, which
the CLI links into the model (its ``class_names`` and the network's ``num_classes``). Batches are
``{"images": (B, 3, H, W), "labels": (B,)}``; with the feature cache, ``images`` are frozen-backbone maps.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch.utils.data import Dataset

from .base import GroundingDataModule
from .file_checks import MalformedDataError, MissingDataError, require_root
from .images import ImageDataset
from .options import ImageTransform, LoaderOptions

LAYOUT = """  <root>/train/<class>/<image>.JPEG   (one folder per class; ImageNet: n01440764/ ...)
  <root>/val/<class>/<image>.JPEG     (classes named as in train)
  <root>/test/<class>/<image>.JPEG    (optional; else val is tested)"""
HINT = ("point root at an ImageNet-style folder (ILSVRC2012: train/ and val/ sorted into class folders), or cut the "
        "embedded world's object boxes into one: python -m data_modules.object_crops (make stage0 does it)")
# torchvision.datasets.folder.IMG_EXTENSIONS
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def list_class_images(folder: Path) -> dict[str, list[Path]]:
    """Class subfolder name -> its image files (sorted), for the class folders of ``folder`` (sorted)."""
    out = {}
    with os.scandir(folder) as entries:
        classes = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    for cls in classes:
        with os.scandir(folder / cls) as entries:
            out[cls] = sorted(Path(e.path) for e in entries
                              if e.is_file() and e.name.lower().endswith(IMAGE_EXTENSIONS))
    return out


class ImageFolderDataset(ImageDataset):
    """One split: image files and their class ids; an item is ``{"image", "label"}``."""

    def __init__(self, image_paths: Sequence[Path], labels: Sequence[int], transform: Callable):
        super().__init__(image_paths, transform)
        self.labels = torch.as_tensor(list(labels), dtype=torch.long)

    def __getitem__(self, index: int) -> dict:
        return {"image": self.load_image(int(index)), "label": self.labels[int(index)]}


def classification_collate(items: list[dict]) -> dict[str, torch.Tensor]:
    return {"images": torch.stack([it["image"] for it in items]), "labels": torch.stack([it["label"] for it in items])}


class ImageFolderDataModule(GroundingDataModule):
    """ImageNet-style class folders (see the module docstring).

    ``augment``: training crops as the official script (``RandomResizedCrop(image_size)`` + horizontal flip);
    off: every split gets the evaluation transform (Resize ``resize_size`` + CenterCrop ``image_size``), which
    lets the frozen-backbone feature cache hold the training split too (with ``augment`` it caches val / test
    only). ``transform``'s ``image_size``, ``mean`` and ``std`` follow the model's network (linked by the CLI).
    """

    dataset_name = "ImageFolder"

    def __init__(self, root: str, batch_size: int = 32, eval_batch_size: int | None = None,
                 transform: ImageTransform = ImageTransform(), loader: LoaderOptions = LoaderOptions(), seed: int = 0,
                 augment: bool = False):
        super().__init__(root, batch_size=batch_size, eval_batch_size=eval_batch_size, transform=transform,
                         loader=loader, seed=seed)
        self.augment = augment
        self._listing: dict[str, dict[str, list[Path]]] = {}

    # -- the folders ------------------------------------------------------------------------------
    def _split_folder(self, split: str) -> Path | None:
        folder = self.root_path / split
        if folder.is_dir():
            return folder
        if split == "test":
            return self._split_folder("val")
        if split == "train":
            require_root(self.root_path, self.dataset_name, LAYOUT, HINT)
        raise MissingDataError(f"{self.dataset_name} at {self.root_path}: no {split}/ folder of class folders.\n"
                               f"Expected layout:\n{LAYOUT}\nFix: {HINT}.")

    def _listed(self, split: str) -> dict[str, list[Path]]:
        """The split's class folders and images, checked: no empty class folder, no class unknown to train."""
        folder = self._split_folder(split)
        if str(folder) in self._listing:
            return self._listing[str(folder)]
        listing = list_class_images(folder)
        if not listing:
            raise MalformedDataError(f"{self.dataset_name}: {folder} holds no class folders.\nExpected layout:\n"
                                     f"{LAYOUT}\nFix: {HINT}.")
        empty = [cls for cls, files in listing.items() if not files]
        if empty:
            raise MalformedDataError(
                f"{self.dataset_name}: class folder {folder / empty[0]} holds no image ({', '.join(IMAGE_EXTENSIONS)})"
                + (f", nor do {len(empty) - 1} other class folder(s)" if len(empty) > 1 else "")
                + ".\nFix: put that class's images there or remove the folder (every class needs examples).")
        if folder.name != "train":
            unknown = sorted(set(listing) - set(self.class_names))
            if unknown:
                raise MalformedDataError(
                    f"{self.dataset_name}: {folder} has class folder(s) that train/ lacks: {', '.join(unknown[:5])}"
                    + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
                    + f". The classifier's classes are train/'s {len(self.class_names)} folders.\nFix: name the "
                    f"{folder.name} folders as train's (ImageNet: the WordNet ids, val sorted into class folders) or "
                    "remove those classes.")
        self._listing[str(folder)] = listing
        return listing

    @property
    def class_names(self) -> list[str]:
        """The classes: train's subfolders, sorted (the label of an image is its class's index here)."""
        return list(self._listed("train"))

    def check_inputs(self) -> None:
        """Root, train/ and val/ exist, no class folder is empty and val's / test's classes are train's:
        ``python -m grounding`` asks before building any model."""
        for split in ("train", "val", "test"):
            self._listed(split)

    # -- datasets -----------------------------------------------------------------------------------
    @property
    def train_transform(self) -> Callable:
        if not self.augment:
            return self.transform
        from torchvision import transforms

        return transforms.Compose([transforms.RandomResizedCrop(self.image_size), transforms.RandomHorizontalFlip(),
                                   transforms.ToTensor(), transforms.Normalize(list(self.mean), list(self.std))])

    def _build_datasets(self) -> dict[str, Dataset]:
        index = {cls: i for i, cls in enumerate(self.class_names)}
        out: dict[str, Dataset] = {}
        built: dict[str, Dataset] = {}
        for split in ("train", "val", "test"):
            folder = str(self._split_folder(split))
            if folder not in built:  # test = val when there is no test/: one dataset (and one feature cache)
                listing = self._listed(split)
                paths = [p for files in listing.values() for p in files]
                labels = [index[cls] for cls, files in listing.items() for _ in files]
                transform = self.train_transform if split == "train" else self.transform
                built[folder] = ImageFolderDataset(paths, labels, transform)
            out[split] = built[folder]
        return out

    def image_datasets(self) -> list[Dataset]:
        """The splits the feature cache may hold: those with a deterministic transform (not augmented train)."""
        return [ds for ds in super().image_datasets() if not (self.augment and ds is self.datasets["train"])]

    def _collate(self, train: bool) -> Callable:
        return classification_collate


__all__ = ["ImageFolderDataModule", "ImageFolderDataset", "classification_collate", "list_class_images"]

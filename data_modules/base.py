"""The base LightningDataModules: the shared tokenizer / transform / loader settings, and the caption DataModule
that format readers (coco.py, flickr.py) fill.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset, Sampler

from grounding.encoders import load_tokenizer
from grounding.nets import regroup_init
from grounding.paths import resolve_path
from grounding.training_images import checkpoint_training_keys, file_key, key_set, overlapping, parse_key

from .captions import SPLITS, CaptionDataset, CaptionRoundsSampler, CaptionSplit, EpochSampler, ResumableLoader
from .collate import CaptionEvalCollate, CaptionTrainCollate
from .file_checks import WORLD_HINT, MalformedDataError, MissingDataError, check_images_exist, require_file, require_root
from .images import build_transform
from .options import SUBSET_RENAMES, CaptionLoaderOptions, ImageTransform, LoaderOptions, SplitSubsets

log = logging.getLogger(__name__)


class GroundingDataModule(LightningDataModule):
    """Shared knobs: the tokenizer (``text_encoder``, ``max_length``), the batch sizes, ``transform`` (an
    :class:`~data_modules.options.ImageTransform`: sizes and normalisation) and ``loader`` (a
    :class:`~data_modules.options.LoaderOptions`: workers, pinned memory, ``drop_last``), ``seed`` (the training
    order's, and each subclass's seeded draws). The groups' fields are also attributes (``self.image_size``,
    ``self.num_workers``). Subclasses build ``self.datasets`` (split -> Dataset) in ``_build_datasets`` and give
    collate functions in ``_collate``."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        regroup_init(cls)  # a group given as a mapping, or a field given flat (a run recorded before the groups)

    def __init__(self, root: str, text_encoder: str = "minilm", max_length: int = 32, batch_size: int = 32,
                 eval_batch_size: int | None = None, transform: ImageTransform = ImageTransform(),
                 loader: LoaderOptions = LoaderOptions(), seed: int = 0):
        super().__init__()
        self.root = root
        self.text_encoder = text_encoder
        self.max_length = max_length
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.transform_options, self.loader_options = transform, loader
        self.image_size, self.resize_size = transform.image_size, transform.resize_size
        self.mean, self.std = tuple(transform.mean), tuple(transform.std)
        self.num_workers, self.pin_memory, self.drop_last = loader.num_workers, loader.pin_memory, loader.drop_last
        self.seed = seed
        self.datasets: dict[str, Dataset] | None = None
        self._tokenizer = None

    # -- pieces --------------------------------------------------------------------------------
    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.text_encoder)
        return self._tokenizer

    @property
    def transform(self) -> Callable:
        """The images' torchvision transform, built from the ``transform`` option group."""
        return build_transform(self.image_size, self.resize_size, self.mean, self.std)

    @property
    def root_path(self) -> Path:
        """``root``; a relative root missing from the working directory is tried under the repo root
        (configs give data paths relative to the repository)."""
        return resolve_path(self.root)

    def setup(self, stage: str | None = None) -> None:
        if self.datasets is None:  # parse once, whatever the number of stages
            self.datasets = self._build_datasets()
            for split, ds in self.datasets.items():
                log.info("%s %s: %d images", type(self).__name__, split, len(ds))

    def _build_datasets(self) -> dict[str, Dataset]:
        raise NotImplementedError

    dataset_name = "data"
    exclude_eval_images: Sequence[str] = ()  # set by the subclasses that take the option (set_excluded_eval_images)

    def set_excluded_eval_images(self, items: Sequence[str] | str | os.PathLike | None) -> None:
        """``exclude_eval_images`` as a list: one path, a list of them, or None."""
        self.exclude_eval_images = [items] if isinstance(items, (str, os.PathLike)) else list(items or [])

    def check_not_all_excluded(self, hit: np.ndarray, split: str, root: Path) -> None:
        """Stop when ``exclude_eval_images`` leaves a split empty (``hit``: per image, listed)."""
        if hit.any() and hit.all():
            raise MalformedDataError(f"{self.dataset_name} at {root}: exclude_eval_images leaves no {split!r} image (all "
                                     f"{int(hit.sum())} are listed). Fix: evaluate on other images, or shorten "
                                     "exclude_eval_images.")

    def excluded_eval_keys(self) -> np.ndarray:
        """The keys ``exclude_eval_images`` names (checkpoint records and image lists), sorted unique."""
        found = []
        for item in self.exclude_eval_images:
            path = resolve_path(item)
            if not path.is_file():
                raise MissingDataError(f"{self.dataset_name}: exclude_eval_images names {path}, which does not exist. "
                                       "Fix: give a checkpoint (.ckpt) or a list of image keys (coco:<id> a line).")
            if path.suffix == ".ckpt":
                found.append(checkpoint_training_keys(path))
                continue
            try:
                lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
            except UnicodeDecodeError:
                raise MalformedDataError(f"{self.dataset_name}: exclude_eval_images file {path} is not a text list of "
                                         "image keys. Fix: give a Lightning checkpoint ending in .ckpt, or one image "
                                         "key a line (coco:<id>, flickr:<id>, vg:<id>, file:<name>).") from None
            try:
                found.append(np.array([parse_key(ln) for ln in lines if ln and not ln.startswith("#")], dtype=np.int64))
            except ValueError as e:
                raise MalformedDataError(f"{self.dataset_name}: exclude_eval_images file {path}: {e}. Fix: one image "
                                         "key a line (coco:<id>, flickr:<id>, vg:<id>, file:<name>).") from None
        return key_set(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)

    def _collate(self, train: bool) -> Callable:
        raise NotImplementedError

    def _train_sampler(self, dataset: Dataset) -> Sampler:
        return EpochSampler(len(dataset), shuffle=True, seed=self.seed)

    def _dataset(self, split: str) -> Dataset:
        if self.datasets is None:
            self.setup()
        return self.datasets[split]

    @property
    def train_dataset(self):
        return self._dataset("train")

    @property
    def val_dataset(self):
        return self._dataset("val")

    @property
    def test_dataset(self):
        return self._dataset("test")

    def image_keys(self, split: str) -> np.ndarray | None:
        """The canonical keys of the split's images (grounding.training_images), (N,) or (N, C) int64, row i =
        image i of the split's dataset; the fit's training images are recorded in its checkpoints from these.
        Here: by file name (readers that know an image's dataset id override it); None without image paths."""
        paths = getattr(self._dataset(split), "image_paths", None)
        return None if paths is None else np.array([file_key(Path(p).name) for p in paths], dtype=np.int64)

    def image_datasets(self) -> list[Dataset]:
        """The split datasets that load images by index (``image_paths`` + ``load_image``), each once:
        what :class:`grounding.feature_cache.FeatureCache` swaps to cached backbone maps."""
        if self.datasets is None:
            self.setup()
        unique = {id(ds): ds for ds in self.datasets.values() if hasattr(ds, "image_paths") and len(ds)}  # empty: nothing to cache
        return list(unique.values())

    # -- loaders -------------------------------------------------------------------------------
    def _loader(self, dataset: Dataset, train: bool) -> DataLoader:
        workers = self.num_workers
        if workers > 0:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # collate tokenizes in forked workers
        # training: a loader that a fit resumes mid-epoch (its position is in every checkpoint)
        return (ResumableLoader if train else DataLoader)(
            dataset, batch_size=self.batch_size if train else self.eval_batch_size,
            sampler=self._train_sampler(dataset) if train else None, shuffle=False,
            num_workers=workers, persistent_workers=workers > 0, pin_memory=self.pin_memory,
            collate_fn=self._collate(train), drop_last=self.drop_last and train,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_dataset, train=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_dataset, train=False)


class CaptionDataModule(GroundingDataModule):
    """Image-caption DataModules (COCO, Flickr): subclasses implement ``read_splits`` returning a
    :class:`CaptionSplit` per split name; images are checked on disk up front.

    ``subsets`` (a :class:`~data_modules.options.SplitSubsets`): a seeded random sample of N training images
    (``train``; COMPOSER's C30K is 29,000 COCO images), the first N validation / test images (``val`` / ``test``; the
    COCO 1K test is the first 1,000). ``exclude_eval_images``: checkpoints (``.ckpt``: every image their record says
    they and the checkpoints they were built from trained on) or image lists (one key a line: ``coco:397133``,
    ``flickr:<id>``, ``vg:<id>``, ``file:<name>``) whose images leave the val and test splits (before the subsets), so
    a stage built from an earlier one is evaluated on held-out images (grounding.training_images). ``loader`` (a
    :class:`~data_modules.options.CaptionLoaderOptions`) adds ``captions_per_epoch``: ``one`` (a seeded draw of one
    caption per image an epoch) or ``all`` (every caption of every training image once an epoch, in rounds:
    :class:`~data_modules.captions.CaptionRoundsSampler`).
    """

    dataset_name = "captions"
    layout = ""
    hint = WORLD_HINT
    required_splits: tuple[str, ...] = SPLITS  # splits that must have images (a test-only reader: ("test",))
    # the subset options that changed their names as they moved into ``subsets`` (grounding.nets.moved_options)
    renamed_options = SUBSET_RENAMES

    def __init__(self, root: str, text_encoder: str = "minilm", max_length: int = 32, batch_size: int = 32,
                 eval_batch_size: int | None = None, transform: ImageTransform = ImageTransform(),
                 loader: CaptionLoaderOptions = CaptionLoaderOptions(), seed: int = 0,
                 subsets: SplitSubsets = SplitSubsets(), exclude_eval_images: list[str] | str | None = None):
        super().__init__(root, text_encoder, max_length, batch_size, eval_batch_size, transform, loader, seed)
        self.captions_per_epoch = loader.captions_per_epoch
        self.subsets = subsets
        self.train_subset, self.val_subset, self.test_subset = subsets.train, subsets.val, subsets.test
        self.set_excluded_eval_images(exclude_eval_images)
        self.split_keys: dict[str, np.ndarray] = {}

    def read_splits(self, root: Path) -> dict[str, CaptionSplit]:
        raise NotImplementedError

    def check_inputs(self) -> None:
        """The root and the files its layout needs exist, and the caption files parse (a bad byte or line is
        reported with its file and line): ``python -m grounding`` asks before building any model, which takes
        far longer than this one extra read of the caption files."""
        root = require_root(self.root_path, self.dataset_name, self.layout, self.hint)
        for path, hint in self.input_files(root):
            require_file(path, self.dataset_name, self.layout, hint)
        self.read_splits(root)

    def input_files(self, root: Path) -> list[tuple[Path, str]]:
        """(file, how to fix its absence) that :meth:`read_splits` will need."""
        return []

    def _build_datasets(self) -> dict[str, CaptionDataset]:
        root = require_root(self.root_path, self.dataset_name, self.layout, self.hint)
        splits = self.read_splits(root)
        for name in self.required_splits:
            if len(splits.get(name, ())) == 0:
                raise MalformedDataError(
                    f"{self.dataset_name} at {root}: the {name!r} split has no captioned images.\n"
                    f"Expected layout:\n{self.layout}\nFix: check the split assignment in the annotation files.")
        excluded = self.excluded_eval_keys()
        if len(excluded):
            for name in ("val", "test"):
                hit, _ = overlapping(splits[name].image_keys(), excluded)
                self.check_not_all_excluded(hit, name, root)
                splits[name] = splits[name].subset(np.flatnonzero(~hit).tolist())
                log.info("%s %s: %d image(s) left out (exclude_eval_images)", type(self).__name__, name, int(hit.sum()))
        if self.train_subset is not None and self.train_subset < len(splits["train"]):
            rng = np.random.default_rng(self.seed)
            keep = np.sort(rng.choice(len(splits["train"]), size=self.train_subset, replace=False))
            splits["train"] = splits["train"].subset(keep.tolist())
        if self.test_subset is not None:
            splits["test"] = splits["test"].subset(range(min(self.test_subset, len(splits["test"]))))
        if self.val_subset is not None:
            splits["val"] = splits["val"].subset(range(min(self.val_subset, len(splits["val"]))))
        check_images_exist((p for s in SPLITS for p in splits[s].image_paths), self.dataset_name,
                           self.missing_image_hint(root))
        self.split_keys = {name: splits[name].image_keys() for name in SPLITS}
        transform = self.transform
        return {name: CaptionDataset(splits[name].image_paths, splits[name].captions, transform, train=name == "train")
                for name in SPLITS}

    def image_keys(self, split: str) -> np.ndarray:
        """The split's keys as its reader gave them (``coco:<id>``, ``flickr:<id>``; else by file name)."""
        if self.datasets is None:
            self.setup()
        return self.split_keys[split]

    def missing_image_hint(self, root: Path) -> str:
        return f"put the images where the layout says (root {root}):\n{self.layout}"

    def _collate(self, train: bool):
        cls = CaptionTrainCollate if train else CaptionEvalCollate
        return cls(self.tokenizer, self.max_length)

    def _train_sampler(self, dataset: CaptionDataset) -> Sampler:
        if self.captions_per_epoch == "all":
            return CaptionRoundsSampler(np.array(dataset.num_captions), range(len(dataset)), seed=self.seed)
        return EpochSampler(len(dataset), shuffle=True, seed=self.seed, num_choices=dataset.num_captions)


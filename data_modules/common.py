"""Pieces every DataModule shares: errors, file checks, image loading, the caption dataset,
its seeded sampler, collate functions and the base LightningDataModules.

Format readers (coco.py, flickr.py, visual_genome.py) only turn their files into per-split records;
everything about tensors, tokenization and batching lives here.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset, Sampler

from grounding.encoders import IMAGENET_MEAN, IMAGENET_STD, load_tokenizer
from grounding.errors import UserInputError
from grounding.paths import resolve_path
from grounding.training_images import checkpoint_training_keys, file_key, key_set, overlapping, parse_key

from . import formats
from .formats import KARPATHY_SCHEMA as KARPATHY_SCHEMA  # re-exported: its home before formats.py
from .formats import CaptionImage, karpathy_caption, read_karpathy_json

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
WORLD_HINT = "run `python -m data_modules.synthetic --out data/world` for a small generated copy in every layout"


# --------------------------------------------------------------------------------------------
# Errors: every one names the file, what was expected and how to fix it.
# --------------------------------------------------------------------------------------------
class DataError(UserInputError):
    """Base class of the suite's data errors (message-only, so DataLoader workers re-raise them intact)."""


class MissingDataError(DataError, FileNotFoundError):
    """A root folder, annotation file or image is not where the layout says it should be."""


class MalformedDataError(DataError, ValueError):
    """An annotation file exists but does not parse or lacks the expected keys."""


class CorruptImageError(DataError, OSError):
    """An image file exists but cannot be decoded."""


def resolve(root: Path, name: str | os.PathLike) -> Path:
    """``name`` relative to ``root`` unless it is absolute (or starts with ~)."""
    p = Path(os.path.expanduser(str(name)))
    return p if p.is_absolute() else root / p


def require_root(root: str | os.PathLike, dataset: str, layout: str, hint: str) -> Path:
    root = Path(os.path.expanduser(str(root)))
    if not root.is_dir():
        raise MissingDataError(
            f"{dataset} root {root} does not exist (or is not a folder).\nExpected layout:\n{layout}\n"
            f"Fix: {hint}."
        )
    return root


def require_file(path: Path, dataset: str, layout: str, hint: str) -> Path:
    if not path.is_file():
        raise MissingDataError(
            f"{dataset}: required file {path} is missing.\nExpected layout:\n{layout}\nFix: {hint}."
        )
    return path


def read_json(path: Path, dataset: str, schema: str, hint: str) -> Any:
    """Parse a JSON file once; a syntax error names the file, line, column and the expected schema."""
    return formats.load_json(path, MalformedDataError, hint, dataset, schema)


_WS = re.compile(r"[ \t\n\r]*")


def iter_json_array(path: Path, dataset: str, schema: str, hint: str, chunk_chars: int = 1 << 22) -> Iterator[Any]:
    """Yield the elements of a file holding one top-level JSON array, one at a time.

    Memory is one element plus a chunk, not the whole parsed file (Visual Genome's
    relationships.json is ~700 MB of JSON, several GB as Python objects). Elements are decoded by
    the C scanner of ``json``; errors name the file, line and column like :func:`read_json`.
    """
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf, pos, eof = "", 0, False
        lines_before, col_before = 0, 0  # position of buf[0] in the file

        def refill():
            nonlocal buf, pos, eof, lines_before, col_before
            done = buf[:pos]
            n = done.count("\n")
            lines_before += n
            col_before = len(done) - done.rfind("\n") - 1 if n else col_before + len(done)
            chunk = f.read(chunk_chars)
            eof = len(chunk) < chunk_chars
            buf, pos = buf[pos:] + chunk, 0

        def where(p: int) -> str:
            n = buf.count("\n", 0, p)
            col = p - buf.rfind("\n", 0, p) if n else col_before + p + 1
            return f"line {lines_before + n + 1}, column {col}"

        def error(problem: str, p: int) -> MalformedDataError:
            return MalformedDataError(
                f"{dataset}: {path} is not valid JSON ({problem} at {where(p)}).\nExpected: {schema}\n"
                f"Fix: {hint} (the file may be truncated: download it again).")

        def peek() -> str:
            nonlocal pos
            while True:
                pos = _WS.match(buf, pos).end()
                if pos < len(buf):
                    return buf[pos]
                if eof:
                    return ""
                refill()

        try:
            refill()
            first = peek()
            if first != "[":
                kind = {"{": "an object", "": "nothing"}.get(first, f"{first!r}")
                raise MalformedDataError(f"{dataset}: {path} holds {kind} where a JSON list of per-image entries "
                                         f"was expected.\nExpected: {schema}\nFix: {hint}.")
            pos += 1
            if peek() == "]":
                return
            while True:
                while True:
                    try:
                        value, end = decoder.raw_decode(buf, pos)
                        if end < len(buf) or eof:
                            break
                    except json.JSONDecodeError as e:
                        if eof:
                            raise error(e.msg, e.pos) from None
                    refill()  # the element runs past the chunk: read on and decode it again
                pos = end
                yield value
                c = peek()
                if c == ",":
                    pos += 1
                    peek()  # raw_decode does not skip whitespace
                elif c == "]":
                    pos += 1
                    if peek() != "":
                        raise error("Extra data", pos)
                    return
                else:
                    raise error("Expecting ',' delimiter" if c else "Unterminated list", pos)
        except UnicodeDecodeError as e:
            raise MalformedDataError(f"{dataset}: {path} is not UTF-8 JSON ({e}).\nExpected: {schema}\nFix: {hint}.") from e


def malformed(path: Path, dataset: str, problem: str, schema: str, hint: str) -> MalformedDataError:
    return formats.format_error(MalformedDataError, dataset, path, problem, schema, hint)


def expect_keys(obj: Any, keys: Sequence[str], where: str, path: Path, dataset: str, schema: str, hint: str) -> None:
    """``obj`` must be a dict holding every key in ``keys``; ``where`` says which element it is."""
    formats.expect_keys(obj, keys, where, path, MalformedDataError, dataset, schema, hint)


def check_images_exist(paths: Iterable[Path], dataset: str, hint: str) -> None:
    """Every listed image must be on disk: one directory listing per folder, not a stat per file."""
    listings: dict[Path, set[str]] = {}
    missing: list[Path] = []
    for p in paths:
        folder = p.parent
        if folder not in listings:
            listings[folder] = set(os.listdir(folder)) if folder.is_dir() else set()
        if p.name not in listings[folder]:
            missing.append(p)
    if missing:
        shown = "\n  ".join(str(p) for p in missing[:5])
        more = f"\n  ... and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise MissingDataError(
            f"{dataset}: {len(missing)} image(s) listed in the annotations are missing on disk:\n  {shown}{more}\n"
            f"Fix: {hint}."
        )


# --------------------------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------------------------
def build_transform(image_size: int = 224, resize_size: int = 256, mean: Sequence[float] = IMAGENET_MEAN,
                    std: Sequence[float] = IMAGENET_STD) -> Callable:
    """Resize the short side to ``resize_size``, centre-crop ``image_size``, normalise with the backbone's stats."""
    from torchvision import transforms

    return transforms.Compose([
        transforms.Resize(resize_size),
        transforms.CenterCrop(image_size),
        transforms.ToTensor(),
        transforms.Normalize(mean=list(mean), std=list(std)),
    ])


def open_rgb(path: Path):
    """Decode an image fully (so truncation is caught here) as RGB; errors name the path."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            img.load()
            return img.convert("RGB")
    except FileNotFoundError as e:
        raise MissingDataError(f"image {path} is missing (it is listed in the annotations).") from e
    except (OSError, SyntaxError, ValueError) as e:  # UnidentifiedImageError and truncation are OSErrors
        raise CorruptImageError(
            f"image {path} is corrupt or not an image ({type(e).__name__}: {e}). "
            "Fix: re-download or re-extract that file."
        ) from e


class ImageDataset(Dataset):
    """Images by split-level index; ``load_image`` is the one place pixels come from, so a feature
    cache can override it and return precomputed backbone features keyed by index."""

    def __init__(self, image_paths: Sequence[Path], transform: Callable):
        self.image_paths = [Path(p) for p in image_paths]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.image_paths)

    def load_image(self, index: int) -> torch.Tensor:
        return self.transform(open_rgb(self.image_paths[index]))


# --------------------------------------------------------------------------------------------
# Captions
# --------------------------------------------------------------------------------------------
@dataclass
class CaptionSplit:
    """What a caption format reader returns for one split: images and all captions of each, and each image's
    canonical key (grounding.training_images: ``coco:<id>``, ``flickr:<id>``; 0 = by its file name)."""

    image_paths: list[Path] = field(default_factory=list)
    captions: list[list[str]] = field(default_factory=list)
    keys: list[int] = field(default_factory=list)

    def add(self, path: Path, captions: Sequence[str], key: int = 0) -> None:
        captions = [c.strip() for c in captions if c and c.strip()]
        if captions:  # an image without captions has nothing to match
            self.image_paths.append(path)
            self.captions.append(captions)
            self.keys.append(int(key))

    def subset(self, indices: Sequence[int]) -> "CaptionSplit":
        keys = self.image_keys()
        return CaptionSplit([self.image_paths[i] for i in indices], [self.captions[i] for i in indices],
                            [int(keys[i]) for i in indices])

    def image_keys(self) -> np.ndarray:
        """(N,) int64 keys; an image its reader gave no key is keyed by its file name."""
        keys = list(self.keys) + [0] * (len(self.image_paths) - len(self.keys))
        return np.array([k or file_key(p.name) for k, p in zip(keys, self.image_paths)], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.image_paths)


class CaptionDataset(ImageDataset):
    """One split of an image-caption dataset.

    Training (``train=True``): an item is one image with ONE caption; the index is ``(image, caption)``
    from :class:`EpochSampler` (seeded per epoch) or a plain image index (caption drawn from torch's RNG).
    Evaluation: an item is one image with ALL its captions.
    """

    def __init__(self, image_paths: Sequence[Path], captions: Sequence[Sequence[str]], transform: Callable,
                 train: bool = False):
        super().__init__(image_paths, transform)
        if len(self.image_paths) != len(captions):
            raise ValueError(f"{len(self.image_paths)} images but {len(captions)} caption lists")
        self.captions = [list(c) for c in captions]
        self.train = train

    @property
    def num_captions(self) -> list[int]:
        return [len(c) for c in self.captions]

    @property
    def caption_image_index(self) -> torch.Tensor:
        """(N_captions,) split-level image index of every caption, captions flattened in image order."""
        return torch.repeat_interleave(torch.arange(len(self)), torch.tensor(self.num_captions, dtype=torch.long))

    @property
    def caption_offsets(self) -> torch.Tensor:
        """(N_images + 1,) captions of image i are flattened caption ids ``offsets[i]:offsets[i+1]``."""
        counts = torch.tensor([0] + self.num_captions, dtype=torch.long)
        return torch.cumsum(counts, 0)

    def __getitem__(self, item):
        if isinstance(item, (tuple, list)):
            index, choice = int(item[0]), int(item[1])
        else:
            index, choice = int(item), None
        out = {"image": self.load_image(index), "image_index": index}
        if self.train:
            caps = self.captions[index]
            if choice is None:
                choice = int(torch.randint(len(caps), ()).item())
            out["caption"] = caps[choice % len(caps)]
        else:
            out["captions"] = self.captions[index]
        return out


class EpochSampler(Sampler):
    """Seeded per-epoch order (and caption choice): epoch e uses a generator seeded with (seed, e),
    so training is reproducible whatever the number of workers, and a resumed run continues the
    same sequence (Lightning calls ``set_epoch`` at every epoch start)."""

    def __init__(self, size: int, shuffle: bool = True, seed: int = 0, num_choices: Sequence[int] | None = None):
        self.size = size
        self.shuffle = shuffle
        self.seed = seed
        self.num_choices = None if num_choices is None else torch.as_tensor(list(num_choices), dtype=torch.long)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator:
        g = torch.Generator().manual_seed(int(self.seed) * 1_000_003 + self.epoch)
        self.epoch += 1  # without set_epoch (plain PyTorch loops) each pass still differs
        order = torch.randperm(self.size, generator=g) if self.shuffle else torch.arange(self.size)
        if self.num_choices is None:
            yield from order.tolist()
            return
        choice = (torch.rand(self.size, generator=g) * self.num_choices).long()
        yield from zip(order.tolist(), choice[order].tolist())


def tokenize(tokenizer, texts: Sequence[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch-tokenize, truncating to ``max_length`` and padding to the longest in the batch."""
    if len(texts) == 0:
        return torch.zeros(0, 0, dtype=torch.long), torch.zeros(0, 0, dtype=torch.long)
    enc = tokenizer(list(texts), padding="longest", truncation=True, max_length=max_length, return_tensors="pt")
    return enc["input_ids"].long(), enc["attention_mask"].long()


class CaptionTrainCollate:
    """Items ``{image, image_index, caption}`` -> the training batch of contract B."""

    def __init__(self, tokenizer, max_length: int = 32):
        self.tokenizer = tokenizer
        self.max_length = max_length

    def __call__(self, items: list[dict]) -> dict:
        captions = [it["caption"] for it in items]
        input_ids, attention_mask = tokenize(self.tokenizer, captions, self.max_length)
        return {"images": torch.stack([it["image"] for it in items]),
                "input_ids": input_ids, "attention_mask": attention_mask,
                "image_index": torch.tensor([it["image_index"] for it in items], dtype=torch.long),
                "captions": captions}


class CaptionEvalCollate(CaptionTrainCollate):
    """Items ``{image, image_index, captions}`` -> the evaluation batch: captions flattened with
    ``caption_image_index`` (split-level image index of each caption) for retrieval metrics."""

    def __call__(self, items: list[dict]) -> dict:
        image_index = torch.tensor([it["image_index"] for it in items], dtype=torch.long)
        counts = torch.tensor([len(it["captions"]) for it in items], dtype=torch.long)
        captions = [c for it in items for c in it["captions"]]
        input_ids, attention_mask = tokenize(self.tokenizer, captions, self.max_length)
        return {"images": torch.stack([it["image"] for it in items]), "image_index": image_index,
                "input_ids": input_ids, "attention_mask": attention_mask,
                "caption_image_index": torch.repeat_interleave(image_index, counts), "captions": captions}


# --------------------------------------------------------------------------------------------
# Karpathy split files (dataset_coco.json / dataset_flickr30k.json / dataset_flickr8k.json),
# read by data_modules.formats; KARPATHY_SCHEMA is re-exported from there.
# --------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------
# Base DataModules
# --------------------------------------------------------------------------------------------
class GroundingDataModule(LightningDataModule):
    """Shared knobs: tokenizer, transform and DataLoader settings. Subclasses build ``self.datasets``
    (split -> Dataset) in ``_build_datasets`` and give collate functions in ``_collate``."""

    def __init__(self, root: str, text_encoder: str = "minilm", max_length: int = 32, batch_size: int = 32,
                 eval_batch_size: int | None = None, num_workers: int = 0, image_size: int = 224,
                 resize_size: int = 256, mean: tuple[float, float, float] = IMAGENET_MEAN,
                 std: tuple[float, float, float] = IMAGENET_STD, seed: int = 0, pin_memory: bool = False,
                 drop_last: bool = False):
        super().__init__()
        self.root = root
        self.text_encoder = text_encoder
        self.max_length = max_length
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.image_size = image_size
        self.resize_size = resize_size
        self.mean, self.std = tuple(mean), tuple(std)
        self.seed = seed
        self.pin_memory = pin_memory
        self.drop_last = drop_last
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
        return DataLoader(
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

    ``train_subset``: a seeded random subset of N training images (COMPOSER's C30K is 29,000 COCO
    images); ``test_subset``: the first N test images (the COCO 1K test is the first 1,000); ``val_subset``:
    the first N validation images (an exhaustive validation on COCO's 5,000 is too slow for COMPOSER).
    ``exclude_eval_images``: checkpoints (``.ckpt``: every image their record says they and the checkpoints
    they were built from trained on) or image lists (one key a line: ``coco:397133``, ``flickr:<id>``,
    ``vg:<id>``, ``file:<name>``) whose images leave the val and test splits (before the subsets), so a stage
    built from an earlier one is evaluated on held-out images (grounding.training_images).
    """

    dataset_name = "captions"
    layout = ""
    hint = WORLD_HINT
    required_splits: tuple[str, ...] = SPLITS  # splits that must have images (a test-only reader: ("test",))

    def __init__(self, root: str, text_encoder: str = "minilm", max_length: int = 32, batch_size: int = 32,
                 eval_batch_size: int | None = None, num_workers: int = 0, image_size: int = 224,
                 resize_size: int = 256, mean: tuple[float, float, float] = IMAGENET_MEAN,
                 std: tuple[float, float, float] = IMAGENET_STD, seed: int = 0, pin_memory: bool = False,
                 drop_last: bool = False, train_subset: int | None = None, test_subset: int | None = None,
                 val_subset: int | None = None, exclude_eval_images: list[str] | str | None = None):
        super().__init__(root, text_encoder, max_length, batch_size, eval_batch_size, num_workers, image_size,
                         resize_size, mean, std, seed, pin_memory, drop_last)
        self.train_subset = train_subset
        self.test_subset = test_subset
        self.val_subset = val_subset
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
        return EpochSampler(len(dataset), shuffle=True, seed=self.seed, num_choices=dataset.num_captions)


def group_captions(pairs: Iterable[tuple[Any, str]]) -> dict[Any, list[str]]:
    """(key, caption) pairs -> key -> captions, in first-seen key order."""
    out: dict[Any, list[str]] = defaultdict(list)
    for k, c in pairs:
        out[k].append(c)
    return out

"""Caption datasets: what a format reader returns per split, the image-with-captions dataset and its seeded
per-epoch sampler.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

from grounding.training_images import file_key

from .images import ImageDataset

SPLITS = ("train", "val", "test")
# a training epoch: every caption of every image once (``all``, as COMPOSER, VSE++ and CLIP-style papers train) or one
# caption drawn per image (``one``)
CAPTIONS_PER_EPOCH = ("all", "one")


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


class CaptionRoundsSampler(Sampler):
    """Every caption of every kept image (COMPOSER: every decomposed one) once an epoch, as (image, choice) items
    (``captions_per_epoch: all``): round r holds each image with more than r captions once, in a seeded random
    order, with its r-th caption of a per-epoch seeded permutation (``choice mod n``); ``choice div n`` is a
    uniform draw below ``hard_draws`` (COMPOSER's hard-negative key of ``hard_negatives: pool``). Rounds follow
    each other, so only a batch straddling two rounds can hold an image twice. Epoch e is seeded by (seed, e),
    like :class:`EpochSampler`."""

    def __init__(self, counts: np.ndarray, keep, hard_draws: np.ndarray | int = 1, seed: int = 0):
        self.counts = np.asarray(counts, dtype=np.int64)
        self.keep = np.asarray(sorted(keep), dtype=np.int64)
        self.hard_draws = np.broadcast_to(np.asarray(hard_draws, dtype=np.int64), self.counts.shape)
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self):
        return int(self.counts[self.keep].sum())

    def __iter__(self):
        rng = np.random.default_rng([int(self.seed), self.epoch])
        self.epoch += 1
        n = self.counts[self.keep]
        image = np.repeat(self.keep, n)
        slot = np.arange(len(image)) - np.repeat(np.cumsum(n) - n, n)
        # a random round per caption: a per-image permutation of its slots (sort random keys within each image)
        order = np.lexsort((rng.random(len(image)), image))
        rounds = np.empty(len(image), dtype=np.int64)
        rounds[order] = slot
        # rounds in order; inside a round the images in a random order
        sequence = np.lexsort((rng.random(len(image)), rounds))
        hard = (rng.random(len(image)) * self.hard_draws[image]).astype(np.int64)
        choice = slot + self.counts[image] * hard
        yield from zip(image[sequence].tolist(), choice[sequence].tolist())


def group_captions(pairs: Iterable[tuple[Any, str]]) -> dict[Any, list[str]]:
    """(key, caption) pairs -> key -> captions, in first-seen key order."""
    out: dict[Any, list[str]] = defaultdict(list)
    for k, c in pairs:
        out[k].append(c)
    return out


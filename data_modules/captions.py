"""Caption datasets: what a format reader returns per split, the image-with-captions dataset, its seeded
per-epoch samplers and the training loader that a fit resumes mid-epoch.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

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


class SkipFirstSampler(Sampler):
    """A sampler whose next pass skips its first ``skip`` items (then ``skip`` is 0 again): how
    :class:`ResumableLoader` continues an epoch without loading the items already trained on. ``set_epoch``
    passes through and is remembered (``epoch``)."""

    def __init__(self, inner: Sampler):
        self.inner, self.skip, self.epoch = inner, 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        if callable(getattr(self.inner, "set_epoch", None)):
            self.inner.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator:
        skip, self.skip = self.skip, 0
        return itertools.islice(iter(self.inner), skip, None)


class ResumableLoader(DataLoader):
    """A training DataLoader that a fit resumes mid-epoch (Lightning's stateful-loader protocol: every checkpoint
    stores :meth:`state_dict`, a resumed fit calls :meth:`load_state_dict` before its first pass). The state is
    (epoch, batches handed out in it); the resumed pass of that epoch skips those batches' items in the sampler,
    so they are never loaded, and goes on with the rest of the same order: the sampler must be seeded per epoch
    (:class:`EpochSampler`, :class:`CaptionRoundsSampler`). A checkpoint from an epoch's end resumes at the next
    epoch, which skips nothing. The state is read when a pass starts, after Lightning's ``set_epoch``, with or
    without workers. Without a sampler it is a plain DataLoader that counts (nothing to skip by)."""

    def __init__(self, dataset, batch_size: int | None = 1, sampler: Sampler | None = None, **kwargs):
        if sampler is not None and not isinstance(sampler, SkipFirstSampler):
            sampler = SkipFirstSampler(sampler)
        super().__init__(dataset, batch_size=batch_size, sampler=sampler, **kwargs)
        self.position = {"epoch": 0, "batches": 0}
        self.resume_at: dict | None = None

    def state_dict(self) -> dict:
        return dict(self.position)

    def load_state_dict(self, state: dict) -> None:
        self.resume_at = {"epoch": int(state["epoch"]), "batches": int(state["batches"])}

    def __iter__(self) -> Iterator:
        skippable = isinstance(self.sampler, SkipFirstSampler) and self.batch_size
        epoch = self.sampler.epoch if skippable else self.position["epoch"]
        done = 0
        if self.resume_at is not None and skippable and self.resume_at["epoch"] == epoch:
            done = min(self.resume_at["batches"], len(self))
            self.sampler.skip = done * self.batch_size
        self.resume_at = None
        self.position = {"epoch": epoch, "batches": done}
        for batch in super().__iter__():
            self.position["batches"] += 1
            yield batch


def group_captions(pairs: Iterable[tuple[Any, str]]) -> dict[Any, list[str]]:
    """(key, caption) pairs -> key -> captions, in first-seen key order."""
    out: dict[Any, list[str]] = defaultdict(list)
    for k, c in pairs:
        out[k].append(c)
    return out


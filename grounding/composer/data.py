"""COMPOSER's DataModule: any caption DataModule's splits, each with its Concept & Relation Graph.

``captions`` (a :class:`data_modules.base.CaptionDataModule`: Flickr30K / Flickr8k / COCO / the
embedded world) reads the splits and their images; this module parses every split's captions into a
CRG (cached parses, :func:`grounding.composer.build_concept_graph`), tokenizes templates and primitives
once, and batches captions as :func:`grounding.composer.batch.composition_batch` structures. Its own
text_encoder and transform (image_size / mean / std, linked from the network) replace the reader's.

Training items are an image with one of its decomposed captions: ``loader: {captions_per_epoch: all}`` (the paper's
epochs) visits every decomposed caption once an epoch, in rounds that hold each image at most once (so a batch
rarely holds two captions of one image); ``one`` draws one caption per image (seeded per epoch). Evaluation gives
two loaders — the split's images, then its captions in batches — so the model can compose every
caption with every image (the paper's exhaustive protocol).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

from data_modules.base import CaptionDataModule, GroundingDataModule
from data_modules.captions import CaptionDataset, CaptionRoundsSampler, EpochSampler, ResumableLoader
from data_modules.file_checks import MalformedDataError, MissingDataError
from data_modules.formats import load_json
from data_modules.options import CaptionLoaderOptions, ImageTransform
from data_modules.regions import BoxStore, RegionStore
from grounding.paths import resolve_path

from .batch import TokenTables, composition_batch
from .captions import CaptionSet
from .concept_graph import OK, ConceptGraph
from .graph_build import build_concept_graph
from .hard_negatives import HARD_NEGATIVE_MODES, draw_hard_captions, hard_draws, training_pool
from .parsing import DEFAULT_BACKEND

log = logging.getLogger(__name__)
SPLITS = ("train", "val", "test")


def _visual(images: CaptionDataset, regions: RegionStore | BoxStore | None, index: int) -> dict:
    """Pixels (or cached backbone maps) of an image, with its object boxes when ``regions`` is a
    :class:`BoxStore` (``region_source: boxes``), or its detector regions from a :class:`RegionStore`."""
    if regions is None:
        return {"image": images.load_image(index), "image_index": index}
    if isinstance(regions, BoxStore):
        boxes = regions.load(images.image_paths[index])
        return {"image": images.load_image(index), "region_boxes": torch.from_numpy(boxes), "image_index": index}
    features, boxes = regions.load(images.image_paths[index])
    return {"region_features": torch.from_numpy(features), "region_boxes": torch.from_numpy(boxes), "image_index": index}


class _TrainItems(Dataset):
    """(image, sampler choice) -> its visual input, graph caption id ``choice mod n`` of its n decomposed
    captions, and ``hard_key`` = ``choice div n`` (the hard-negative draw of ``hard_negatives: pool``)."""

    def __init__(self, images: CaptionDataset, caption_ids: list[np.ndarray], regions: RegionStore | None = None):
        self.images, self.caption_ids, self.regions = images, caption_ids, regions

    def __len__(self):
        return len(self.caption_ids)

    def __getitem__(self, item):
        index, choice = item if isinstance(item, (tuple, list)) else (item, 0)
        ids = self.caption_ids[index]
        return {**_visual(self.images, self.regions, int(index)), "caption": int(ids[choice % len(ids)]),
                "hard_key": int(choice) // len(ids)}


class _Images(Dataset):
    def __init__(self, images: CaptionDataset, regions: RegionStore | None = None):
        self.images, self.regions = images, regions

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        return _visual(self.images, self.regions, index)


def collate_visual(items: list[dict]) -> dict:
    """Stacked pixels / maps, and any regions' boxes (features) right-padded to the batch's most regions with a mask."""
    out = {"image_index": torch.tensor([it["image_index"] for it in items])}
    if "image" in items[0]:
        out["images"] = torch.stack([it["image"] for it in items])
    if "region_boxes" in items[0]:
        boxes = [it["region_boxes"] for it in items]
        out["region_boxes"] = pad_sequence(boxes, batch_first=True)
        out["region_mask"] = pad_sequence([torch.ones(len(b), dtype=torch.bool) for b in boxes], batch_first=True)
    if "region_features" in items[0]:
        out["region_features"] = pad_sequence([it["region_features"] for it in items], batch_first=True)
    return out


class _Captions(Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        return index


class SplitGraph:
    """One split's CRG, token tables and per-caption facts (image row, held-out flag)."""

    def __init__(self, graph: ConceptGraph, tables: TokenTables, compositional: np.ndarray):
        self.graph, self.tables, self.compositional = graph, tables, compositional

    def batch(self, captions, phrase_seed: int | None = None) -> dict:
        out = composition_batch(self.graph, self.tables, captions, phrase_seed)
        caps = out["captions"].numpy()
        out["caption_image_index"] = torch.from_numpy(self.graph.caption_image[caps].astype(np.int64))
        out["compositional"] = torch.from_numpy(self.compositional[caps])
        return out


class _TrainCollate:
    """Training items -> one composition batch of their B captions; with a hard-negative ``pool`` (image ->
    its P nearest training images) the captions are the B positives then B hard ones, a caption of a pool
    neighbour of each positive's image (:func:`draw_hard_captions`; ``caption_ptr``/``caption_ids``: every
    training image's decomposed captions as a CSR), and ``hard_caption`` gives their rows (B..2B−1)."""

    def __init__(self, split: SplitGraph, pool: np.ndarray | None = None, caption_ptr: np.ndarray | None = None,
                 caption_ids: np.ndarray | None = None):
        self.split, self.pool, self.caption_ptr, self.caption_ids = split, pool, caption_ptr, caption_ids

    def __call__(self, items):
        visual = collate_visual(items)
        captions = np.array([it["caption"] for it in items], dtype=np.int64)
        if self.pool is None:
            return {**self.split.batch(captions), **visual}
        key = np.array([it["hard_key"] for it in items], dtype=np.int64)
        hard = draw_hard_captions(self.pool, self.caption_ptr, self.caption_ids, visual["image_index"].numpy(), key)
        out = self.split.batch(np.concatenate([captions, hard]))
        out["hard_caption"] = torch.arange(len(items), 2 * len(items))
        out["host"].hard_caption = np.arange(len(items), 2 * len(items))
        return {**out, **visual}


class _CaptionCollate:
    def __init__(self, split: SplitGraph, phrase_seed: int | None):
        self.split, self.phrase_seed = split, phrase_seed

    def __call__(self, captions):
        return self.split.batch(captions, self.phrase_seed)


def held_out_pair_mask(captions: list[str], world_meta: str | Path) -> np.ndarray:
    """Captions naming one of the embedded world's held-out attribute–object pairs (no training image shows
    them): the attribute word, then within 3 words the first object word (a name, plural or synonym),
    which must be the pair's object ("a large white dotted box", not "a white ball next to a box")."""
    meta = load_json(world_meta, MalformedDataError, hint="regenerate the world with `make world`", dataset="embedded world",
                     schema="world.json of data_modules.synthetic")
    forms: dict[str, set[str]] = {}
    for obj in meta["vocabulary"]["objects"]:
        forms[obj["name"]] = {obj["name"], obj["plural"]} | {w for s in obj["synonyms"] for w in (s["word"], s.get("plural", s["word"]))}
    object_of = {w: name for name, words in forms.items() for w in words for w in [w.split()[-1]]}
    pairs = {(a, o) for a, o in meta["held_out_pairs"]}
    attributes = {a for a, _ in pairs}
    out = np.zeros(len(captions), dtype=bool)
    for j, text in enumerate(captions):
        words = re.findall(r"[a-z]+", text.lower())
        for i, w in enumerate(words):
            if w in attributes:
                following = [object_of[x] for x in words[i + 1:i + 4] if x in object_of]
                if following and (w, following[0]) in pairs:
                    out[j] = True
    return out


@dataclass(frozen=True)
class CRGParsing:
    """How :class:`ComposerDataModule` builds its Concept & Relation Graphs. ``backend`` / ``parse_workers``: the
    constituency parser (``python -m grounding.composer check-parser``) and its processes. ``degrade``: Table 7's parse
    degradation, applied to every split's trees (seeded by the DataModule's ``seed``)."""

    backend: str = DEFAULT_BACKEND
    parse_workers: int = 1
    degrade: float = 0.0


@dataclass(frozen=True)
class RegionInputs:
    """Where :class:`ComposerDataModule`'s batches get their regions (without either file, batches carry images).
    ``region_files``: a folder of per-image ``.npz`` or a bottom-up-attention ``.tsv`` of detector regions (the
    network's ``region_source: files``; see :mod:`data_modules.regions`). ``region_boxes``: Visual Genome's
    ``objects.json`` (image sizes from ``image_data.json`` beside it): batches carry images and up to ``max_boxes``
    object boxes each (the network's ``region_source: boxes``)."""

    region_files: str | None = None
    region_boxes: str | None = None
    max_boxes: int = 100


@dataclass(frozen=True)
class HardNegativePool:
    """The pool of ``hard_negatives: pool``: each positive image's ``pool_size`` nearest training images (paper 100),
    by the cosine of ``embeddings`` (an .npz of ``names`` and ``embeddings``, e.g. ``python -m grounding.semclip
    hard-negative-embeddings``) or else of the mean detector region (``region_files``) or the mean-pooled frozen CNN
    map (see :mod:`grounding.composer.hard_negatives`)."""

    pool_size: int = 100
    embeddings: str | None = None

    def __post_init__(self):
        if self.pool_size < 1:
            raise ValueError(f"hard_negative_pool.pool_size must be at least 1; got {self.pool_size}")


class ComposerDataModule(GroundingDataModule):
    """Caption splits with their Concept & Relation Graphs, batched for COMPOSER.

    ``parsing``: the parser and Table 7's degradation (:class:`CRGParsing`). ``world_meta``: the embedded world's
    ``world.json``; its held-out attribute–object pairs mark the compositional test captions. ``phrase_seed``: draws
    Table 5's phrase queries (null: none). ``region_inputs``: detector region files or object boxes
    (:class:`RegionInputs`). ``loader`` (:class:`~data_modules.options.CaptionLoaderOptions`, ``drop_last`` on):
    ``captions_per_epoch`` ``all`` (every decomposed caption once an epoch, as the paper trains) or ``one`` (one seeded
    caption per image an epoch: 5x fewer steps). ``transform``: the images' sizes and normalisation, linked from the
    network (they replace the reader's). ``hard_negatives`` (linked from the
    model's): ``pool`` adds to every training batch a caption of one of each positive image's nearest training images
    (:class:`HardNegativePool`).
    """

    # the two pool options that changed their names as they moved into ``hard_negative_pool``
    renamed_options = {"hard_negative_pool_size": "hard_negative_pool.pool_size",
                       "hard_negative_embeddings": "hard_negative_pool.embeddings"}

    def __init__(self, captions: CaptionDataModule, parsing: CRGParsing = CRGParsing(), world_meta: str | None = None,
                 phrase_seed: int | None = 0, region_inputs: RegionInputs = RegionInputs(),
                 hard_negatives: str = "batch", hard_negative_pool: HardNegativePool = HardNegativePool(),
                 text_encoder: str = "minilm", max_length: int = 32, batch_size: int = 64,
                 eval_batch_size: int | None = None, caption_batch_size: int = 64,
                 transform: ImageTransform = ImageTransform(),
                 loader: CaptionLoaderOptions = CaptionLoaderOptions(drop_last=True, captions_per_epoch="all"),
                 seed: int = 0):
        super().__init__(captions.root, text_encoder, max_length, batch_size, eval_batch_size, transform, loader, seed)
        self.captions = captions
        self.backend, self.parse_workers, self.degrade = parsing.backend, parsing.parse_workers, parsing.degrade
        self.world_meta, self.phrase_seed = world_meta, phrase_seed
        self.caption_batch_size = caption_batch_size
        self.region_files = region_inputs.region_files
        self.region_boxes, self.max_boxes = region_inputs.region_boxes, region_inputs.max_boxes
        if hard_negatives not in HARD_NEGATIVE_MODES:
            raise ValueError(f"hard_negatives must be one of {HARD_NEGATIVE_MODES}; got {hard_negatives!r}")
        self.hard_negatives, self.hard_negative_pool_size = hard_negatives, hard_negative_pool.pool_size
        self.hard_negative_embeddings = hard_negative_pool.embeddings
        self.captions_per_epoch = loader.captions_per_epoch
        self.regions: RegionStore | None = None
        self.graphs: dict[str, SplitGraph] = {}

    # ---------------------------------------------------------------- building
    def check_inputs(self) -> None:
        """The caption reader's files and the files named here exist (before any model is built)."""
        self.captions.check_inputs()
        for name, fix in (("world_meta", "generate the world (`make world`) or set world_meta: null"),
                          ("region_files", "extract the regions first (docs/composer.md) or set region_files: null"),
                          ("region_boxes", "point it at Visual Genome's objects.json or set region_boxes: null")):
            value = getattr(self, name)
            if value and not resolve_path(value).exists():
                raise MissingDataError(f"ComposerDataModule: {name} {value} does not exist. Fix: {fix}.")

    def _build_datasets(self) -> dict[str, Dataset]:
        self.captions.setup()
        datasets = dict(self.captions.datasets)
        transform = self.transform
        for ds in datasets.values():  # this module's (linked) image settings, not the reader's
            ds.transform = transform
        if self.region_files:
            self.regions = RegionStore(resolve_path(self.region_files))
        elif self.region_boxes:
            self.regions = BoxStore(resolve_path(self.region_boxes), self.max_boxes, self.resize_size, self.image_size)
        for split in SPLITS:  # a test-only caption file (an MCD split) has empty train / val: empty graphs
            self.graphs[split] = self._split_graph(split, datasets[split])
        return datasets

    def image_datasets(self) -> list[Dataset]:
        """Datasets whose pixels the feature cache may replace (none when regions come from files)."""
        return [] if self.region_files else super().image_datasets()

    def _split_graph(self, split: str, images: CaptionDataset) -> SplitGraph:
        texts = [c for caps in images.captions for c in caps]
        caption_image = images.caption_image_index.numpy()
        names = [p.name for p in images.image_paths]
        if not texts:  # an empty split (test-only caption file): nothing to parse or cache
            graph = ConceptGraph.build([], caption_image, names)
            return SplitGraph(graph, TokenTables(graph, self.tokenizer, texts, self.max_length), np.zeros(0, dtype=bool))
        source = f"{type(self.captions).__name__}:{self.captions.root}:{split}"
        graph, report = build_concept_graph(CaptionSet(names, texts, caption_image, source=source), backend=self.backend,
                                            workers=self.parse_workers, degrade_prob=self.degrade, seed=self.seed)
        failed = int((graph.caption_status != OK).sum())
        log.info("CRG %s: %d captions, %d concepts, %d predicates, %d without a decomposition", split, len(texts),
                 graph.n_concepts, graph.n_predicates, failed)
        compositional = (held_out_pair_mask(texts, resolve_path(self.world_meta)) if self.world_meta
                         else np.zeros(len(texts), dtype=bool))
        return SplitGraph(graph, TokenTables(graph, self.tokenizer, texts, self.max_length), compositional)

    @property
    def placeholder_base(self) -> int:
        """First placeholder word-piece id (the text encoder's vocabulary size): checked against the network."""
        return len(self.tokenizer)

    def train_image(self, index: int) -> dict:
        """Training image ``index``'s visual input as the loaders give it (pixels / cached maps, boxes or detector
        regions): for :func:`collate_visual`."""
        return _visual(self.train_dataset, self.regions, index)

    # ---------------------------------------------------------------- loaders
    def _train_items(self) -> _TrainItems:
        images, graph = self.train_dataset, self.graphs["train"].graph
        ok = np.flatnonzero(graph.caption_status == OK)
        per_image = np.split(ok, np.searchsorted(graph.caption_image[ok], np.arange(1, len(images))))
        keep = [i for i, ids in enumerate(per_image) if len(ids)]
        if not keep:
            raise MalformedDataError(f"{self.captions.root}: no training caption could be decomposed into a CRG; "
                                     "check the parser with `python -m grounding.composer check-parser`.")
        return _TrainItems(images, per_image, self.regions), keep

    def train_dataloader(self) -> DataLoader:
        items, keep = self._train_items()
        counts = np.array([len(c) for c in items.caption_ids], dtype=np.int64)
        choices, collate = np.maximum(counts, 1), _TrainCollate(self.graphs["train"])
        if self.hard_negatives == "pool":
            pool = self._hard_negative_pool(items.images, keep)
            # the sampler's seeded per-epoch caption draw, widened: choice mod n the positive, choice div n the hard one
            choices = choices * hard_draws(pool.shape[1], int(counts.max()))
            ptr = np.concatenate([[0], np.cumsum(counts)])
            # int32: every loader worker holds a copy (N x P; ~45 MB for COCO's 113k images at P = 100)
            collate = _TrainCollate(self.graphs["train"], pool.astype(np.int32), ptr,
                                    np.concatenate(items.caption_ids).astype(np.int64))
        if self.captions_per_epoch == "all":
            sampler = CaptionRoundsSampler(counts, keep, choices // np.maximum(counts, 1), seed=self.seed)
        else:
            sampler = _KeepSampler(EpochSampler(len(items), shuffle=True, seed=self.seed, num_choices=choices.tolist()),
                                   set(keep))
        # a loader that a fit resumes mid-epoch (its position is in every checkpoint)
        return ResumableLoader(items, batch_size=self.batch_size, sampler=sampler, num_workers=self.num_workers,
                               persistent_workers=self.num_workers > 0, pin_memory=self.pin_memory,
                               collate_fn=collate, drop_last=self.drop_last)

    def _hard_negative_pool(self, images: CaptionDataset, keep: list[int]) -> np.ndarray:
        """Every training image's nearest training images (:func:`training_pool`), computed when the train loader is
        made: after the run's weights are restored and the feature cache attached (whose maps it reuses). Under
        DDP rank 0 builds (or reads) the cached pool and broadcasts it to the other ranks."""
        trainer = self.trainer
        backbone = None
        if trainer is not None and not self.hard_negative_embeddings and not self.region_files:
            backbone = trainer.lightning_module.frozen_backbone()
        args = dict(dataset=images, images=np.asarray(keep), size=self.hard_negative_pool_size,
                    embeddings_file=self.hard_negative_embeddings, regions=self.regions if self.region_files else None,
                    backbone=backbone, batch_size=self.eval_batch_size, num_workers=self.num_workers,
                    device=trainer.strategy.root_device if trainer is not None else "cpu")
        if trainer is None or trainer.world_size == 1:
            return training_pool(**args)
        # rank 0 builds (or reads) it and sends it: the other ranks need no shared filesystem (multi-node runs)
        return trainer.strategy.broadcast(training_pool(**args) if trainer.is_global_zero else None, src=0)

    def _eval_loaders(self, split: str) -> list[DataLoader]:
        images = self._dataset(split)
        if len(images) == 0:  # an empty split (test-only caption file): no loaders, the loop skips it
            return []
        common = dict(num_workers=self.num_workers, persistent_workers=self.num_workers > 0, pin_memory=self.pin_memory)
        return [DataLoader(_Images(images, self.regions), batch_size=self.eval_batch_size, collate_fn=collate_visual, **common),
                DataLoader(_Captions(self.graphs[split].graph.n_captions), batch_size=self.caption_batch_size,
                           collate_fn=_CaptionCollate(self.graphs[split], self.phrase_seed), **common)]

    def val_dataloader(self):
        return self._eval_loaders("val")

    def test_dataloader(self):
        return self._eval_loaders("test")

    def predict_dataloader(self):
        return self._eval_loaders("test")


class _KeepSampler(torch.utils.data.Sampler):
    """An :class:`EpochSampler` skipping images without a decomposed caption (set_epoch passes through)."""

    def __init__(self, inner: EpochSampler, keep: set[int]):
        self.inner, self.keep = inner, keep

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def __len__(self):
        return len(self.keep)

    def __iter__(self):
        return (item for item in self.inner if item[0] in self.keep)

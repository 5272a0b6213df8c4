"""WordNet similarity lists (SemCLIP §3) as a LightningDataModule for training the STE.

It builds (or loads) the similarity-lists dataset file, exposes the vocabulary of lemma keys, and
serves batches of anchors with their list members and scores (Eq. 3's label vectors):

``{"anchors": long (B,) vocabulary ids, "candidates": long (C,) the unique vocabulary ids encoded
this step (anchors, their list members, sampled negatives), "anchor_position": long (B,) column of
each anchor in the candidates, and Eq. 3's label vectors Y_i in list form over the batch's M list
members: "member_owner": long (M,) the anchor row, "member_position": long (M,) the candidate
column, "member_weight": float (M,) Y_ij}`` (plus "targets", the dense (B, C) Y, on request).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from data_modules.wordnet_lists import (
    SimilarityListConfig,
    SimilarityLists,
    build_similarity_lists,
    config_key,
    read_curated_lists,
    subtree_synsets,
)
from grounding.paths import cache_dir, resolve_path
from grounding.utils.io import sha1_of_json


class _Rows(Dataset):
    def __init__(self, rows: np.ndarray):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return int(self.rows[i])

    def __getitems__(self, i: list[int]) -> np.ndarray:  # a whole batch in one gather (the DataLoader's fast path)
        return self.rows[i]


POSITIVE_WEIGHTINGS = ("score", "uniform")


def label_weights(lists: SimilarityLists, positive_weighting: str = "score", non_synonym_weight: float = 1.0) -> np.ndarray:
    """Eq. 3's label value Y_ij of every list member (one per CSR pair, float32).

    ``positive_weighting``: ``"score"`` Y_ij = the list score (Wu–Palmer, Eq. 1; synonyms 1) or
    ``"uniform"`` Y_ij = 1 for every member. ``non_synonym_weight`` then multiplies Y_ij of the
    members that are not synonyms of the anchor (the hypernym / hyponym, and with
    ``include_siblings`` co-hyponym, neighbours; see :meth:`SimilarityLists.synonym_mask`): 1 keeps
    the lists' own balance, < 1 shifts the pull towards synonyms, > 1 towards the neighbours, and 0
    makes them zero-weight members: still encoded in the anchor's batch (so they stay in Eq. 3's
    denominator) but no longer positives.
    """
    if positive_weighting not in POSITIVE_WEIGHTINGS:
        raise ValueError(f"positive_weighting must be one of {POSITIVE_WEIGHTINGS}, got {positive_weighting!r}")
    if not non_synonym_weight >= 0:
        raise ValueError(f"non_synonym_weight must be >= 0, got {non_synonym_weight!r}")
    y = lists.scores.astype(np.float32) if positive_weighting == "score" else np.ones(len(lists.scores), np.float32)
    if non_synonym_weight != 1.0:
        y = np.where(lists.synonym_mask(), y, np.float32(non_synonym_weight) * y).astype(np.float32)
    return y


class SimilarityListCollator:
    """Turns a list of anchor rows into one contrastive batch (vectorised CSR gathering).

    ``positive_weighting`` / ``non_synonym_weight``: how the label vectors Y are weighted (see
    :func:`label_weights`; the defaults are the list scores as they are). ``dense_targets`` adds
    the (B, C) ``targets`` matrix of the dense loss form (tests, benchmarks); the list form is
    always there."""

    def __init__(self, lists: SimilarityLists, num_negatives: int = 0, seed: int = 0,
                 positive_weighting: str = "score", non_synonym_weight: float = 1.0, dense_targets: bool = False):
        self.indptr = torch.from_numpy(lists.indptr)
        self.indices = torch.from_numpy(lists.indices)
        self.scores = torch.from_numpy(label_weights(lists, positive_weighting, non_synonym_weight))
        self.anchors = torch.from_numpy(lists.anchors)
        self.vocab_size = len(lists.vocab)
        self.num_negatives = num_negatives
        self.dense_targets = dense_targets
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, rows) -> dict[str, torch.Tensor]:
        rows = torch.as_tensor(np.asarray(rows), dtype=torch.long)
        anchors = self.anchors[rows]
        starts, ends = self.indptr[rows], self.indptr[rows + 1]
        lens = ends - starts
        owner = torch.repeat_interleave(torch.arange(len(rows)), lens)
        flat = torch.arange(int(lens.sum())) + torch.repeat_interleave(starts - (torch.cumsum(lens, 0) - lens), lens)
        members, weights = self.indices[flat], self.scores[flat]
        pool = [anchors, members]
        if self.num_negatives:  # Eq. 3's denominator ideally spans V: add uniform vocabulary samples
            pool.append(torch.randint(self.vocab_size, (self.num_negatives,), generator=self.generator))
        candidates, inverse = torch.unique(torch.cat(pool), return_inverse=True)
        anchor_position = inverse[: len(anchors)]
        member_position = inverse[len(anchors): len(anchors) + len(members)]
        batch = {"anchors": anchors, "candidates": candidates, "anchor_position": anchor_position,
                 "member_owner": owner, "member_position": member_position, "member_weight": weights}
        if self.dense_targets:
            batch["targets"] = dense_targets(batch)
        return batch


def dense_targets(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The (B, C) label matrix Y of a batch's list form (0 off the lists)."""
    targets = torch.zeros(len(batch["anchors"]), len(batch["candidates"]), dtype=batch["member_weight"].dtype)
    return targets.index_put_((batch["member_owner"], batch["member_position"]), batch["member_weight"])


class SimilarityListsDataModule(LightningDataModule):
    """Similarity lists from WordNet (built on first use, cached atomically) or from a curated file.

    Args:
        path: the lists file (``.npz``). Built here when absent. Default: a file in the cache
            folder keyed by the traversal settings.
        curated: an externally curated lists file (.json/.jsonl/.tsv, see ``read_curated_lists``)
            used instead of the WordNet traversal (e.g. the paper's linguist-curated release).
        max_depth_diff, wup_threshold, include_siblings, max_list_size: the traversal (§3).
        subtree_of: restrict anchors to these synsets and their hyponyms (tiny demos/tests).
        batch_size: anchors per step (800 in the paper). num_negatives: extra vocabulary samples
            per step for the denominator. val_anchors: a fixed sample of anchors whose loss and
            synonym recovery are tracked (the lists are a fit target, not a held-out task).
        positive_weighting: Eq. 3's label vector Y: ``score`` (the list scores, Wu–Palmer with
            synonyms at 1; the default) or ``uniform`` (1 for every list member).
        non_synonym_weight: a multiplier on Y of the list members that are not the anchor's
            synonyms (its hypernym / hyponym neighbours), i.e. their share of the positive pull
            against the synonyms': 1 (default) as the lists are, 0 synonyms-only positives (the
            others stay in the batch as denominator terms). See :func:`label_weights`. Both apply to
            the validation batches too (val/loss is then the loss of the chosen weighting).
    """

    def __init__(self, path: str | None = None, curated: str | None = None, max_depth_diff: int = 2,
                 wup_threshold: float = 0.8, include_siblings: bool = False, max_list_size: int | None = 64,
                 subtree_of: list[str] | None = None, batch_size: int = 800, num_negatives: int = 0,
                 val_anchors: int = 2000, num_workers: int = 0, seed: int = 0,
                 positive_weighting: Literal["score", "uniform"] = "score", non_synonym_weight: float = 1.0):
        super().__init__()
        self.save_hyperparameters()
        if positive_weighting not in POSITIVE_WEIGHTINGS:  # fail at configuration, not after loading the lists
            raise ValueError(f"positive_weighting must be one of {POSITIVE_WEIGHTINGS}, got {positive_weighting!r}")
        if not non_synonym_weight >= 0:
            raise ValueError(f"non_synonym_weight must be >= 0, got {non_synonym_weight!r}")
        self.config = SimilarityListConfig(max_depth_diff=max_depth_diff, wup_threshold=wup_threshold,
                                           include_siblings=include_siblings, max_list_size=max_list_size)
        self.lists: SimilarityLists | None = None

    # ------------------------------------------------------------------------------ files
    def lists_path(self) -> Path:
        if self.hparams.path:
            return resolve_path(self.hparams.path)
        key = config_key(self.config)
        if self.hparams.subtree_of:
            key += "-" + sha1_of_json(sorted(self.hparams.subtree_of))[:8]
        return cache_dir() / "semclip" / f"similarity_lists-{key}.npz"

    def prepare_data(self):
        if self.hparams.curated is None and not self.lists_path().is_file():
            self._build().save(self.lists_path())

    def _build(self) -> SimilarityLists:
        synsets = subtree_synsets(self.hparams.subtree_of) if self.hparams.subtree_of else None
        return build_similarity_lists(self.config, synsets=synsets, progress=synsets is None)

    def load_lists(self) -> SimilarityLists:
        if self.lists is None:
            if self.hparams.curated is not None:
                self.lists = read_curated_lists(self.hparams.curated)
            else:
                path = self.lists_path()
                if not path.is_file():
                    self.prepare_data()
                self.lists = SimilarityLists.load(path)
                stored = self.lists.metadata.get("config")
                if stored is not None and stored != dataclasses.asdict(self.config) and self.hparams.path:
                    raise ValueError(f"{path} was built with {stored}, not the configured {dataclasses.asdict(self.config)}. "
                                     "Delete it (it is rebuilt) or point `path` elsewhere.")
        return self.lists

    @property
    def vocab(self) -> list[str]:
        return self.load_lists().vocab

    # ------------------------------------------------------------------------------ loaders
    def setup(self, stage: str | None = None):
        lists = self.load_lists()
        sizes = np.diff(lists.indptr)
        self.train_rows = np.flatnonzero(sizes > 0)  # an empty list has no positive to pull
        if len(self.train_rows) == 0:
            raise ValueError("The similarity lists have no anchor with a non-empty list; nothing to train on.")
        rng = np.random.default_rng(self.hparams.seed)
        n_val = min(self.hparams.val_anchors, len(self.train_rows))
        self.val_rows = np.sort(rng.choice(self.train_rows, n_val, replace=False))
        self.collate = SimilarityListCollator(lists, self.hparams.num_negatives, self.hparams.seed,
                                              self.hparams.positive_weighting, self.hparams.non_synonym_weight)

    def _loader(self, rows, shuffle):
        return DataLoader(_Rows(rows), batch_size=self.hparams.batch_size, shuffle=shuffle, collate_fn=self.collate,
                          num_workers=self.hparams.num_workers, persistent_workers=self.hparams.num_workers > 0)

    def train_dataloader(self):
        return self._loader(self.train_rows, True)

    def val_dataloader(self):
        return self._loader(self.val_rows, False)

"""The STE's training switches (Eq. 3's label weighting) and its fast paths against the reference forms."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from data_modules.similarity_lists import SimilarityListCollator, SimilarityListsDataModule, label_weights
from data_modules.wordnet_lists import SimilarityLists


def _keyed_lists() -> SimilarityLists:
    # anchor bag.n.01.bag: synonym bag.n.01.sack (1.0), hypernym container.n.01.container (0.9),
    # hyponym purse.n.01.purse (0.85); anchor sack lists bag (1.0) and container (0.9)
    return SimilarityLists.from_mapping({
        "bag.n.01.bag": [("bag.n.01.sack", 1.0), ("container.n.01.container", 0.9), ("purse.n.01.purse", 0.85)],
        "bag.n.01.sack": [("bag.n.01.bag", 1.0), ("container.n.01.container", 0.9)],
    })


def test_synonym_mask_is_the_anchors_synset():
    lists = _keyed_lists()
    assert lists.synonym_mask().tolist() == [True, False, False, True, False]
    # a lemma name with dots (WordNet has 'H._pylori') still belongs to its synset
    dotted = SimilarityLists.from_mapping({"h.n.01.Helicobacter": [("h.n.01.H._pylori", 0.5), ("h.n.02.H", 1.0)]})
    assert dotted.synonym_mask().tolist() == [True, False]
    # plain-word curated lists: a synonym is a member scored 1
    plain = SimilarityLists.from_mapping({"bag": [("sack", 1.0), ("container", 0.9)]})
    assert plain.synonym_mask().tolist() == [True, False]


@pytest.mark.parametrize("weighting, w, expected", [
    ("score", 1.0, [1.0, 0.9, 0.85, 1.0, 0.9]),
    ("uniform", 1.0, [1.0, 1.0, 1.0, 1.0, 1.0]),
    ("score", 0.5, [1.0, 0.45, 0.425, 1.0, 0.45]),
    ("uniform", 0.0, [1.0, 0.0, 0.0, 1.0, 0.0]),
    ("uniform", 2.0, [1.0, 2.0, 2.0, 1.0, 2.0]),
])
def test_label_weights(weighting, w, expected):
    assert label_weights(_keyed_lists(), weighting, w).tolist() == pytest.approx(expected)


def test_collator_applies_the_weighting_and_keeps_zero_weight_members():
    lists = _keyed_lists()
    batch = SimilarityListCollator(lists, positive_weighting="uniform", non_synonym_weight=0.0)([0])
    cand = [lists.vocab[i] for i in batch["candidates"]]
    # the zero-weight neighbours are still encoded (denominator terms), with Y = 0
    assert set(cand) == {"bag.n.01.bag", "bag.n.01.sack", "container.n.01.container", "purse.n.01.purse"}
    y = dict(zip(cand, batch["targets"][0].tolist()))
    assert y == {"bag.n.01.bag": 0.0, "bag.n.01.sack": 1.0, "container.n.01.container": 0.0, "purse.n.01.purse": 0.0}
    default = SimilarityListCollator(lists)([0])
    assert default["targets"][0].tolist() == pytest.approx(
        [{"bag.n.01.sack": 1.0, "container.n.01.container": 0.9, "purse.n.01.purse": 0.85}.get(lists.vocab[i], 0.0)
         for i in default["candidates"]])


def test_bad_switches_fail_early():
    with pytest.raises(ValueError, match="positive_weighting"):
        SimilarityListsDataModule(positive_weighting="softmax")
    with pytest.raises(ValueError, match="non_synonym_weight"):
        SimilarityListsDataModule(non_synonym_weight=-1.0)


def test_switches_from_the_command_line():
    from grounding.cli import ConfigError, resolved_config

    cfg = resolved_config("experiments/semclip/ste_wordnet.yaml",
                          [{"data": {"init_args": {"positive_weighting": "uniform", "non_synonym_weight": 0.25}}}])
    assert cfg["data"]["init_args"]["positive_weighting"] == "uniform"
    assert cfg["data"]["init_args"]["non_synonym_weight"] == 0.25
    default = resolved_config("experiments/semclip/ste_wordnet.yaml")["data"]["init_args"]
    assert default["positive_weighting"] == "score" and default["non_synonym_weight"] == 1.0
    with pytest.raises(ConfigError):
        resolved_config("experiments/semclip/ste_wordnet.yaml", [{"data": {"init_args": {"positive_weighting": "flat"}}}])

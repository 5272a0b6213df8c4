"""Similarity lists (SemCLIP §3): hand-checked WordNet traversal, exact Wu–Palmer, file formats."""

from __future__ import annotations

import json

import numpy as np
import pytest

from data_modules.wordnet_lists import (
    SimilarityListConfig,
    SimilarityLists,
    WordNetNounGraph,
    build_similarity_lists,
    parse_lemma_key,
    read_curated_lists,
    write_curated_lists,
)

SYNSETS = ["basket.n.01", "hamper.n.02", "car.n.01", "dog.n.01", "chair.n.05"]


@pytest.fixture(scope="module")
def wn():
    from grounding.lexicon import wordnet

    return wordnet()


@pytest.fixture(scope="module")
def graph(wn):
    return WordNetNounGraph(wn, around=SYNSETS, hops=2)


@pytest.fixture(scope="module")
def lists(graph):
    return build_similarity_lists(SimilarityListConfig(wup_threshold=0.8, max_list_size=None), graph=graph, synsets=SYNSETS)


def _within_hops(wn, name, hops=2):
    s = wn.synset(name)
    up, down, found = [s], [s], set()
    for _ in range(hops):
        up = [h for x in up for h in x.hypernyms() + x.instance_hypernyms()]
        down = [h for x in down for h in x.hyponyms() + x.instance_hyponyms()]
        found |= {x.name() for x in up + down}
    return found


def test_lemma_key_is_the_4_tuple():
    assert parse_lemma_key("basket.n.01.handbasket") == ("basket", "n", 1, "handbasket")
    assert parse_lemma_key("st._john's_wort.n.01.st._john's_wort") == ("st._john's_wort", "n", 1, "st._john's_wort")
    with pytest.raises(ValueError, match="lemma key"):
        parse_lemma_key("basket")


def test_synonyms_present_with_score_one(lists):
    car = dict(lists.list_of("car.n.01.car"))
    for syn in ("car.n.01.auto", "car.n.01.automobile", "car.n.01.machine", "car.n.01.motorcar"):
        assert car[syn] == 1.0
    assert "car.n.01.car" not in car  # never its own positive
    basket = dict(lists.list_of("basket.n.01.handbasket"))
    assert basket["basket.n.01.basket"] == 1.0


def test_paper_example_basket_list(lists):
    # Fig. 2: for "basket" the positives include hamper, creel and pannier (its hyponyms).
    basket = dict(lists.list_of("basket.n.01.basket"))
    for member in ("hamper.n.02.hamper", "creel.n.01.creel", "pannier.n.02.pannier"):
        assert member in basket
    assert "window.n.01.window" not in basket


def test_depth_constraint_and_scores_equal_nltk(lists, wn):
    cfg = SimilarityListConfig()
    for anchor_row in lists.anchors:
        anchor = lists.vocab[anchor_row]
        a_syn = wn.synset(parse_lemma_key(anchor)[0] + ".n.%02d" % parse_lemma_key(anchor)[2])
        allowed = _within_hops(wn, a_syn.name(), cfg.max_depth_diff)
        for key, score in lists.list_of(anchor):
            w, _, sense, _ = parse_lemma_key(key)
            m_syn = wn.synset(f"{w}.n.{sense:02d}")
            if m_syn == a_syn:
                assert score == 1.0
                continue
            assert m_syn.name() in allowed, (anchor, key)
            assert abs(m_syn.max_depth() - a_syn.max_depth()) <= cfg.max_depth_diff
            assert score == pytest.approx(a_syn.wup_similarity(m_syn), abs=1e-6)
            assert score >= 0.8


def test_threshold_excludes_low_scores(graph):
    loose = build_similarity_lists(SimilarityListConfig(wup_threshold=0.5, max_list_size=None), graph=graph, synsets=["chair.n.05"])
    strict = build_similarity_lists(SimilarityListConfig(wup_threshold=0.9, max_list_size=None), graph=graph, synsets=["chair.n.05"])
    lo, hi = dict(loose.list_of("chair.n.05.chair")), dict(strict.list_of("chair.n.05.chair"))
    assert set(hi) <= set(lo) and len(hi) < len(lo)
    assert all(s >= 0.9 for s in hi.values())


def test_graph_wup_matches_nltk_on_random_pairs(graph, wn):
    rng = np.random.default_rng(0)
    for i in rng.choice(len(graph.synsets), 40, replace=False):
        for j in rng.choice(len(graph.synsets), 3, replace=False):
            expected = graph.synsets[i].wup_similarity(graph.synsets[j])
            assert graph.wup(int(i), int(j)) == pytest.approx(expected, abs=1e-12)


def test_statistics_and_roundtrip(lists, tmp_path):
    st = lists.statistics()
    assert st["anchors"] == len(lists.anchors) and st["pairs"] == len(lists.indices)
    assert st["average_list_size"] == pytest.approx(len(lists.indices) / len(lists.anchors))
    path = lists.save(tmp_path / "lists.npz")
    again = SimilarityLists.load(path)
    assert again.vocab == lists.vocab and again.list_of("car.n.01.car") == lists.list_of("car.n.01.car")
    assert again.metadata["statistics"]["pairs"] == st["pairs"]
    assert not list(tmp_path.glob(".*tmp*"))  # atomic: no temporary left behind


def test_curated_readers(tmp_path, lists):
    (tmp_path / "a.json").write_text(json.dumps({"basket.n.01.basket": [["hamper.n.02.hamper", 0.9], "creel.n.01.creel"]}))
    got = read_curated_lists(tmp_path / "a.json")
    assert got.list_of("basket.n.01.basket") == [("hamper.n.02.hamper", pytest.approx(0.9)), ("creel.n.01.creel", 1.0)]
    (tmp_path / "b.tsv").write_text("x\ty\t0.5\nx\tz\n")
    assert read_curated_lists(tmp_path / "b.tsv").list_of("x") == [("y", 0.5), ("z", 1.0)]
    rt = read_curated_lists(write_curated_lists(lists, tmp_path / "c.jsonl"))
    assert [(k, pytest.approx(s, abs=1e-5)) for k, s in rt.list_of("car.n.01.car")] == lists.list_of("car.n.01.car")
    (tmp_path / "bad.tsv").write_text("only-one-field\n")
    with pytest.raises(ValueError, match=r"bad.tsv:1.*anchor<TAB>lemma<TAB>score"):
        read_curated_lists(tmp_path / "bad.tsv")
    (tmp_path / "bad.jsonl").write_text('{"anchor": "x"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        read_curated_lists(tmp_path / "bad.jsonl")

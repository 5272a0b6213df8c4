"""Compound divergence (Keysers et al. 2020) and MCD splits (App. B)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
from nltk import Tree

from grounding.composer import (
    CaptionSet,
    ConceptGraph,
    atom_divergence,
    chernoff_coefficient,
    compound_divergence,
    divergence,
    extract_crg,
    make_mcd_splits,
    read_captions,
    removal_deltas,
)
from grounding.composer.mcd import rowwise_divergence, window_divergences, write_karpathy_split


def test_identical_distributions_have_zero_divergence():
    p = np.array([3.0, 1.0, 6.0])
    assert compound_divergence(p, 2 * p) == pytest.approx(0.0, abs=1e-12)
    assert atom_divergence(p, p) == pytest.approx(0.0, abs=1e-12)


def test_disjoint_distributions_have_divergence_one():
    assert compound_divergence([1, 2, 0, 0], [0, 0, 5, 1]) == 1.0
    assert atom_divergence([1, 0], [0, 1]) == 1.0


def test_hand_computed_intermediate_case():
    # P_train = (1/4, 3/4, 0), P_eval = (1, 0, 0): C_a = (1/4)^a * 1^(1-a)
    assert compound_divergence([1, 3, 0], [2, 0, 0]) == pytest.approx(1 - 0.25 ** 0.1)  # 0.129449...
    assert atom_divergence([1, 3, 0], [2, 0, 0]) == pytest.approx(0.5)
    # P = (1/2, 1/2), Q = (1/4, 3/4), alpha = 0.1: C = .5^.1 .25^.9 + .5^.1 .75^.9
    c = 0.5 ** 0.1 * 0.25 ** 0.9 + 0.5 ** 0.1 * 0.75 ** 0.9
    assert compound_divergence([1, 1], [1, 3]) == pytest.approx(1 - c)
    assert chernoff_coefficient([1, 1], [1, 3], 0.1) == pytest.approx(c)
    # asymmetric: swapping train and eval changes a compound divergence (alpha != 0.5)
    assert compound_divergence([1, 3], [1, 1]) != pytest.approx(compound_divergence([1, 1], [1, 3]))


def test_atom_divergence_matches_bhattacharyya_via_scipy():
    from scipy.spatial.distance import jensenshannon  # noqa: F401  (scipy present)

    rng = np.random.default_rng(0)
    p, q = rng.random(50), rng.random(50)
    bc = np.sum(np.sqrt(p / p.sum() * q / q.sum()))
    assert atom_divergence(p, q) == pytest.approx(1 - bc)
    with pytest.raises(ValueError):
        divergence([0, 0], [1, 1], 0.1)


def test_removal_deltas_equal_brute_force():
    rng = np.random.default_rng(1)
    train = rng.integers(0, 5, 30).astype(float)
    m = sp.random(40, 30, density=0.2, random_state=2, data_rvs=lambda n: rng.integers(1, 4, n)).tocsr()
    m = m[np.asarray(m.sum(axis=1)).ravel() > 0]
    cd_all, delta = removal_deltas(train, m)
    total = np.asarray(m.sum(axis=0)).ravel()
    assert cd_all == pytest.approx(compound_divergence(train, total))
    brute = [compound_divergence(train, total - m[i].toarray().ravel()) - cd_all for i in range(m.shape[0])]
    np.testing.assert_allclose(delta, brute, atol=1e-12)
    rows = rowwise_divergence(train, m[:5], 0.1)
    np.testing.assert_allclose(rows, [compound_divergence(train, m[i].toarray().ravel()) for i in range(5)])
    w = window_divergences(train, m, np.array([0, 3]), 4, 0.1)
    np.testing.assert_allclose(w, [compound_divergence(train, m[s:s + 4].sum(axis=0)) for s in (0, 3)])


# ---------------------------------------------------------------- a synthetic caption world
NOUNS = ["dog", "cat", "man", "woman", "ball", "grass", "bench", "car", "boy", "girl"]
VERBS = ["runs on", "sits on", "jumps over", "looks at", "walks near", "plays with"]


def _caption_tree(rng, verbs) -> tuple[str, str]:
    a, b = rng.choice(NOUNS, 2, replace=False)
    v = verbs[rng.integers(len(verbs))]
    vb, prep = v.split()
    raw = f"a {a} {v} the {b}"
    tree = f"(S (NP (DT a) (NN {a})) (VP (VBZ {vb}) (PP (IN {prep}) (NP (DT the) (NN {b})))))"
    return raw, tree


def _world(n_images, verbs, seed, offset=0):
    rng = np.random.default_rng(seed)
    raws, trees, img = [], [], []
    for i in range(n_images):
        # each image leans to one verb so images differ in their compound mix
        lean = [verbs[i % len(verbs)]] * 3 + list(verbs)
        for _ in range(5):
            r, t = _caption_tree(rng, lean)
            raws.append(r)
            trees.append(t)
            img.append(i)
    names = [f"img_{offset + i:05d}.jpg" for i in range(n_images)]
    cs = CaptionSet(names, raws, np.array(img), dataset="synthetic")
    graph = ConceptGraph.build([extract_crg(Tree.fromstring(t)) for t in trees], img, names)
    return cs, graph


def test_mcd_split_beats_random_splits_and_writes_karpathy_files(tmp_path):
    # training sees mostly the first verbs; candidates use all of them (compositional shift)
    _, train = _world(300, VERBS[:3] * 6 + VERBS[3:], seed=0)
    cand_cs, cand = _world(120, VERBS, seed=1, offset=1000)
    s = make_mcd_splits(train, cand, cand_cs, tmp_path, k=30, levels=5, random_baselines=20, seed=0)
    assert s["mcd_beats_all_random"]
    assert s["mcd"]["compound_divergence"] > max(s["random_splits"]["compound_divergence"])
    assert s["windows"]["compound_divergence_max"] >= s["windows"]["compound_divergence_min"]
    split = json.loads((tmp_path / "mcd.json").read_text())
    assert len(split["images"]) == 30
    first = split["images"][0]
    assert set(first) >= {"filename", "imgid", "split", "sentences", "sentids"} and first["split"] == "test"
    assert len(first["sentences"]) == 5 and first["sentids"] == [x["sentid"] for x in first["sentences"]]
    assert set(first["sentences"][0]) == {"raw", "tokens", "imgid", "sentid"}
    assert split["mcd"]["compound_divergence"] == pytest.approx(s["mcd"]["compound_divergence"])
    graded = [g["compound_divergence"] for g in s["graded"]]
    assert graded == sorted(graded, reverse=True) and len(graded) >= 2
    assert all((tmp_path / g["file"]).is_file() for g in s["graded"])
    # the written split is readable by our own Karpathy reader
    assert read_captions(tmp_path / "mcd.json").n_images == 30


def test_candidates_with_unseen_primitives_are_dropped(tmp_path):
    _, train = _world(50, VERBS, seed=0)
    # image "d" has one caption mentioning a primitive ("zebra") never seen in training
    nouns, images = ["dog", "cat", "car", "ball", "zebra"], [0, 1, 2, 3, 3]
    crgs = [extract_crg(Tree.fromstring(f"(NP (DT a) (NN {n}))")) for n in nouns]
    names = ["a.jpg", "b.jpg", "c.jpg", "d.jpg"]
    cand = ConceptGraph.build(crgs, images, names)
    cs = CaptionSet(names, [f"a {n}" for n in nouns], np.array(images))
    s = make_mcd_splits(train, cand, cs, tmp_path, k=2, levels=2, random_baselines=3)
    assert s["candidates_dropped"] == 1 and s["candidates_kept"] == 3
    kept = {im["filename"] for im in json.loads((tmp_path / "mcd.json").read_text())["images"]}
    assert "d.jpg" not in kept
    with pytest.raises(ValueError, match="cannot pick k=4"):
        make_mcd_splits(train, cand, cs, tmp_path, k=4)


def _seven_caption_set():
    # image 0 has 7 captions and image 1 has 5, interleaved in the file (COCO has 6-7 for some images)
    img = [0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 1]
    caps = [f"a dog number {j} runs" for j in range(len(img))]
    return CaptionSet(["a.jpg", "b.jpg"], caps, np.array(img), dataset="coco")


def test_first_captions_keeps_each_images_first_five_in_file_order():
    cs = _seven_caption_set()
    five = cs.first_captions(5)
    assert [len(five.captions_of(i)) for i in range(2)] == [5, 5]
    assert five.captions_of(0) == cs.captions_of(0)[:5] and five.captions_of(1) == cs.captions_of(1)
    assert five.rows.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 9, 11]  # rows into the file: the 6th and 7th of image 0 dropped
    assert cs.first_captions(99).captions == cs.captions
    with pytest.raises(ValueError):
        cs.first_captions(0)


def test_split_files_hold_five_captions_per_image(tmp_path):
    cs = _seven_caption_set()
    split = json.loads(write_karpathy_split(tmp_path / "s.json", cs, [0, 1]).read_text())
    assert [len(im["sentences"]) for im in split["images"]] == [5, 5]
    assert [x["raw"] for x in split["images"][0]["sentences"]] == cs.captions_of(0)[:5]
    assert [x["sentid"] for im in split["images"] for x in im["sentences"]] == list(range(10))
    every = json.loads(write_karpathy_split(tmp_path / "all.json", cs, [0, 1], captions_per_image=None).read_text())
    assert [len(im["sentences"]) for im in every["images"]] == [7, 5]


def test_mcd_and_graded_splits_cap_images_at_five_captions(tmp_path):
    _, train = _world(60, VERBS[:3], seed=0)
    cand_cs, _ = _world(40, VERBS, seed=1, offset=1000)
    # give every other candidate image two extra captions (7 in all), then cap as the `mcd` command does
    extra = [(i, f"a dog sits on the bench {i}") for i in range(0, 40, 2) for _ in range(2)]
    cs = CaptionSet(cand_cs.image_names, cand_cs.captions + [c for _, c in extra],
                    np.concatenate([cand_cs.caption_image, [i for i, _ in extra]]), dataset="coco")
    capped = cs.first_captions(5)
    trees = [f"(S (NP (DT a) (NN {c.split()[1]})) (VP (VBZ {c.split()[2]}) (PP (IN {c.split()[3]}) (NP (DT the) (NN {c.split()[5]})))))"
             for c in capped.captions]
    cand = ConceptGraph.build([extract_crg(Tree.fromstring(t)) for t in trees], capped.caption_image, capped.image_names)
    s = make_mcd_splits(train, cand, cs, tmp_path, k=10, levels=3, random_baselines=3)
    assert s["captions_per_image"] == 5
    for f in ["mcd.json"] + [g["file"] for g in s["graded"]]:
        split = json.loads((tmp_path / f).read_text())
        assert {len(im["sentences"]) for im in split["images"]} == {5}, f
        assert all(x["raw"] in capped.captions for im in split["images"] for x in im["sentences"])


def test_summary_record_rows_hold_the_summary_numbers(tmp_path):
    """`mcd --record`'s rows (grounding.composer.mcd.summary_record_rows) from summary.json: the MCD split, all
    candidates, the random splits' mean / sd / max, each graded split in order; a record docs_tables accepts."""
    from grounding.composer.mcd import SUMMARY_LABELS, summary_record_rows
    from grounding.docs_tables import provenance, validate_record, write_record

    _, train = _world(60, VERBS[:3] * 6 + VERBS[3:], seed=0)
    cand_cs, cand = _world(30, VERBS, seed=1, offset=1000)
    make_mcd_splits(train, cand, cand_cs, tmp_path, k=8, levels=3, random_baselines=4, seed=0)
    s = json.loads((tmp_path / "summary.json").read_text())
    rows = summary_record_rows(s)
    assert [r["split"] for r in rows] == ["mcd", "all_candidates", "random"] + ["graded"] * len(s["graded"])
    assert (rows[0]["compound_divergence"], rows[0]["atom_divergence"], rows[0]["images"]) == \
        (s["mcd"]["compound_divergence"], s["mcd"]["atom_divergence"], 8)
    assert (rows[1]["compound_divergence"], rows[1]["images"]) == (s["cd_all_candidates"], s["candidates_kept"])
    rnd = s["random_splits"]
    assert rows[2]["n"] == 4 and rows[2]["compound_divergence_max"] == max(rnd["compound_divergence"])
    assert rows[2]["compound_divergence"] == pytest.approx(np.mean(rnd["compound_divergence"]))
    assert rows[2]["compound_divergence_sd"] == pytest.approx(np.std(rnd["compound_divergence"]))
    assert rows[2]["atom_divergence"] == pytest.approx(np.mean(rnd["atom_divergence"]))
    assert [(r["file"], r["window_start"], r["compound_divergence"], r["atom_divergence"]) for r in rows[3:]] == \
        [(g["file"], g["window_start"], g["compound_divergence"], g["atom_divergence"]) for g in s["graded"]]
    path = write_record(tmp_path / "mcd_record.json", list(SUMMARY_LABELS), rows, provenance(command="mcd", seeds=[0]),
                        labels=SUMMARY_LABELS)
    validate_record(json.loads(path.read_text()), str(path))
    s["random_splits"]["n"] = 0  # no random splits: no random row
    assert "random" not in [r["split"] for r in summary_record_rows(s)]

"""SemCLIP on real photos (grounding.semclip.photo_evaluation): the bootstrap, the relevance definition on a
hand-made case, per-query Table 4 metrics, and the evaluation + report end to end on tiny generated photos."""

from __future__ import annotations

import csv
import json
import re
import shutil
from collections import Counter

import numpy as np
import pytest
import torch
from semclip_helpers import markdown_tables, table_cells, tiny_baseline_ckpt, tiny_world_ste


# ------------------------------------------------------------------------------------------------ bootstrap
def test_bootstrap_means_paired_clustered_and_seeded():
    from grounding.semclip.stability import bootstrap_means

    rng = np.random.default_rng(0)
    base = rng.random(60)
    values = np.stack([base, base + 0.1, base[::-1]])  # system 1 = system 0 + 0.1 on every unit
    clusters = np.repeat(np.arange(20), 3)  # 20 queries of 3 units each
    b = bootstrap_means(values, clusters, n_resamples=200, seed=0)
    assert b["clusters"] == 20
    assert np.allclose(b["mean"], values.mean(1))  # the point estimate is the plain mean over units
    assert np.all(b["low"] <= b["mean"]) and np.all(b["mean"] <= b["high"]) and np.all(b["low"] < b["high"])
    # paired: the same resamples for every system, so a constant shift has a zero-width interval
    assert b["diff"][1] == pytest.approx(0.1) and b["diff_low"][1] == pytest.approx(0.1)
    assert b["diff_high"][1] == pytest.approx(0.1) and b["diff"][0] == 0.0
    assert b["diff_low"][2] < b["diff"][2] < b["diff_high"][2]
    again = bootstrap_means(values, clusters, n_resamples=200, seed=0)
    assert all(np.array_equal(b[k], again[k]) for k in ("low", "high", "diff_low", "diff_high"))  # seeded
    other = bootstrap_means(values, clusters, n_resamples=200, seed=1)
    assert not np.array_equal(b["low"], other["low"])
    # clusters are resampled whole: units constant within a cluster give the interval of the cluster means
    per_cluster = bootstrap_means(values[:, ::3], np.arange(20), n_resamples=200, seed=0)
    constant = bootstrap_means(np.repeat(values[:, ::3], 3, axis=1), clusters, n_resamples=200, seed=0)
    assert np.allclose(per_cluster["low"], constant["low"]) and np.allclose(per_cluster["high"], constant["high"])
    # one query: nothing to resample
    one = bootstrap_means(values[:, :3], clusters[:3])
    assert one["clusters"] == 1 and np.isnan(one["low"]).all() and np.allclose(one["mean"], values[:, :3].mean(1))


def test_per_query_metrics_average_to_torchmetrics():
    from grounding.retrieval_metrics import break_ties
    from grounding.semclip.alignment import retrieval_scores
    from grounding.semclip.stability import per_query_retrieval, retrieval

    g = torch.Generator().manual_seed(0)
    scores = torch.rand(30, 40, generator=g)
    relevant = torch.rand(30, 40, generator=g) < 0.15
    relevant[:, 0] = True  # every query has a relevant item
    per = per_query_retrieval(break_ties(scores), relevant, k=10)
    expected = retrieval_scores(scores, relevant, k=10)
    assert set(per) == set(expected)
    for m, v in per.items():
        assert v.shape == (30,) and float(v.mean()) == pytest.approx(expected[m], abs=1e-6)
    # by hand: relevant items at ranks 1 and 3 of 4
    s, r = torch.tensor([[0.9, 0.8, 0.7, 0.6]]), torch.tensor([[True, False, True, False]])
    one = per_query_retrieval(s, r, k=2)
    assert one["map"].item() == pytest.approx((1 + 2 / 3) / 2) and one["recall@2"].item() == pytest.approx(0.5)
    assert one["ndcg@2"].item() == pytest.approx(1 / (1 + 1 / np.log2(3)))
    r4 = retrieval(torch.cat([s, s.flip(1)]), torch.cat([r, r]), k=10)
    assert r4["t2i"]["queries"] == 2 and r4["i2t"]["queries"] == 2  # images 1 and 3 have no relevant query


# ------------------------------------------------------------------------------------------------ relevance
def test_synonym_augmented_relevance_on_a_hand_made_case(tmp_path, monkeypatch):
    import grounding.semclip.photo_evaluation as pe
    from grounding.semclip.photo_evaluation import caption_noun_senses, group_queries, image_kinds, noun_groups, synset_of
    from grounding.semclip.stability import relevance, synonym_pairs

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    captions = ["A red car near a tree .", "An automobile on the road .", "A dog runs on the grass ."]
    senses = caption_noun_senses(captions)
    # kept per caption: a second call (any order) extracts nothing again and gives the same senses
    assert caption_noun_senses(captions, cache=False) == senses
    monkeypatch.setattr(pe, "caption_nouns", lambda *a: pytest.fail("a cached caption was tagged again"))
    assert caption_noun_senses(captions[::-1]) == senses[::-1]
    assert [n for n, _ in senses[0]] == ["car", "tree"] and senses[0][0][1] == "car.n.01"
    assert senses[1][0] == ("automobile", "car.n.01")  # synonyms land on one sense
    groups = {g.noun: g for g in noun_groups(senses)}
    assert set(groups) == {"car", "tree", "automobile", "road", "dog", "grass"}
    assert groups["car"].synset == "car.n.01" and groups["car"].variants == ["auto", "automobile", "machine", "motorcar"]
    assert groups["automobile"].variants == ["car", "auto", "machine", "motorcar"]
    kinds = image_kinds(list(groups.values()), senses, [0, 1, 2], 3)
    # image 0 says "car": relevant to the car group and to the automobile group (car is a synonym of automobile)
    assert {"car", "automobile", "tree"} <= kinds[0] and {"car", "automobile", "road"} <= kinds[1]
    assert "car" not in kinds[2] and "dog" in kinds[2]
    queries = group_queries([groups["car"], groups["dog"]])
    assert [q.text for q in queries[:3]] == ["A photo of a car", "A photo of an auto", "A photo of an automobile"]
    assert [q.canonical for q in queries[:5]] == [True, False, False, False, False]
    rel = relevance(queries, kinds)
    assert rel[:5].tolist() == [[True, True, False]] * 5  # every car query: photos 0 and 1
    assert rel[5].tolist() == [False, False, True]
    assert synonym_pairs(queries)[:4] == [(0, 1), (0, 2), (0, 3), (0, 4)]
    assert synset_of("car.n.01.automobile") == "car.n.01" and synset_of(None) is None


def test_noun_groups_majority_sense_and_variant_cap():
    from grounding.semclip.photo_evaluation import noun_groups

    senses = [[("car", "car.n.01")], [("car", "car.n.02")], [("car", "car.n.01")], [("selfie", None)]]
    groups = noun_groups(senses, max_variants=2)
    assert [(g.noun, g.synset, g.variants) for g in groups] == [("car", "car.n.01", ["auto", "automobile"]),
                                                               ("selfie", None, [])]


# ------------------------------------------------------------------------------------------------ end to end
CAPTIONS = {"ball": "A ball lies on the grass", "car": "A car is parked near a house", "box": "A box and a cup",
            "bucket": "Somebody carries a bucket", "tree": "A tree beside a car"}


@pytest.fixture(scope="module")
def photo_inputs(tiny_world, tmp_path_factory):
    """Eight tiny generated photos in a Flickr8k layout: images/, a token file (captions naming the world's objects),
    a test list; a random tiny VLM, a world STE, a small Γ_t and its alignment pairs."""
    from grounding.semclip.alignment import AlignmentTransform, fit_alignment
    from grounding.semclip.alignment_data import build_pairs
    from grounding.semclip.ste import STEEmbedding
    from grounding.semclip.vlm import load_vlm

    root = tmp_path_factory.mktemp("photos")
    meta = json.loads((tiny_world / "world.json").read_text())
    (root / "images").mkdir()
    tokens, names = [], []
    for im in meta["images"][:8]:
        name = f"photo_{im['image_id']:04d}.jpg"
        src = tiny_world / "images" / im["file_name"]
        shutil.copyfile(src, root / "images" / name)
        kinds = sorted({o["kind"] for o in im["objects"]})
        lines = [f"A photo with a {' and a '.join(kinds)} .", f"Here a {' and a '.join(kinds[::-1])} ."]
        lines += [CAPTIONS[k] for k in kinds if k in CAPTIONS][:2]  # 2-4 captions: one can tag the photo
        tokens += [f"{name}#{j}\t{c}" for j, c in enumerate(lines)]
        names.append(name)
    (root / "tokens.txt").write_text("\n".join(tokens) + "\n")
    (root / "Flickr_8k.testImages.txt").write_text("\n".join(names + ["not_here.jpg"]) + "\n")
    vlm = load_vlm(f"suite:{tiny_baseline_ckpt(root / 'vlm')}", feature_cache=False)
    ste = STEEmbedding.load(tiny_world_ste(root / "ste"))
    pairs = build_pairs(vlm, ste, ["A red ball on a box", "A car near a tree", "A cup in a bucket", "An automobile",
                                   "A house with a ring", "A crate and a pail"], lexical_variants=False)
    torch.manual_seed(0)
    transform = AlignmentTransform(vlm.dim, ste.dim, hidden=16)
    fit_alignment(transform, pairs["vlm_text"], pairs["targets"], epochs=3, batch_size=4)
    return {"root": root, "vlm": vlm, "ste": ste, "pairs": pairs, "transform": transform}


def test_photo_evaluation_and_report(photo_inputs, tmp_path):
    from grounding.semclip.photo_evaluation import evaluate_photos, read_photo_split, write_photo_report

    root = photo_inputs["root"]
    split = read_photo_split(root / "tokens.txt", root / "Flickr_8k.testImages.txt", root / "images", name="test")
    assert len(split.paths) == 8 and all(len(c) >= 2 for c in split.captions)  # the missing photo is left out
    args = dict(pairs=photo_inputs["pairs"], train_idx=torch.arange(4), val_idx=torch.arange(4, 6), ks=(1, 5),
                n_resamples=50)
    results = evaluate_photos(photo_inputs["vlm"], photo_inputs["transform"], photo_inputs["ste"], split, **args)
    # the default store is the paper's: one tagging caption per photo in the bank, the others are the labels
    assert results["bank"] == "tagging" and results["bank_captions"] == 8 and results["n_distractors"] == 0
    assert results["n_captions"] == sum(len(c) for c in split.captions) - 8
    systems = ["VLM", "SemCLIP (STE query)", "SemCLIP (Γ_t query)"]
    assert results["systems"] == systems and results["n_images"] == 8
    assert set(results["table"]) == {"overlap@1", "overlap@5"} | {f"{d} {m}" for d in ("t2i", "i2t")
                                                                  for m in ("ndcg@10", "map", "recall@10")}
    for metric, row in results["table"].items():
        for s in systems + results["reference_systems"]:
            r = row[s]
            assert 0.0 <= r["mean"] <= 1.0 and r["low"] <= r["mean"] + 1e-9 <= r["high"] + 2e-9, (metric, s, r)
        assert row["VLM"]["diff"] == 0.0
    assert results["table"]["i2t map"]["VLM"]["units"] == 8  # image→text: one unit per photo
    d = results["diagnostics"]
    assert set(d["recovery"]) >= {"train pairs", "held-out pairs"} and "query_gap" in d and "image_side" in d
    assert sum(d["query_coverage"]["queries"].values()) == results["n_queries"]
    # deterministic: the same inputs give the same numbers
    again = evaluate_photos(photo_inputs["vlm"], photo_inputs["transform"], photo_inputs["ste"], split, **args)
    assert again["table"] == results["table"]

    out = write_photo_report(results, tmp_path / "report", provenance={"vlm": "tiny"})
    assert {p.name for p in out.iterdir()} == {"report.md", "stability.csv", "retrieval.csv", "differences.csv",
                                               "stability_pairs.csv", "results.json"}
    md = (out / "report.md").read_text()
    for text in ("Table 3", "Table 4", "VG-BERT search heads | skipped", "Verdict", "Diagnosis", "Δ SemCLIP (STE query)"):
        assert text in md
    rows = list(csv.DictReader(open(out / "stability.csv")))
    assert len(rows) == 2 * (len(systems) + len(results["reference_systems"]))
    n_reference = len(results["reference_systems"])
    assert n_reference == 3 and d["gamma_t_cost"]["system"] == "SemCLIP (STE query)"
    assert len(list(csv.DictReader(open(out / "retrieval.csv")))) == 6 * (len(systems) + n_reference)
    diffs = list(csv.DictReader(open(out / "differences.csv")))
    assert {r["minus"] for r in diffs} == {"VLM"} and len(diffs) == 8 * (len(systems) - 1 + n_reference)
    assert "Γ_t or the nearest text?" in md and "Bank protocol `tagging`" in md
    assert json.loads((out / "results.json").read_text())["provenance"] == {"vlm": "tiny"}
    # today's protocol as a switch: every caption a label, the alignment captions in the bank
    other = evaluate_photos(photo_inputs["vlm"], photo_inputs["transform"], photo_inputs["ste"], split,
                            bank="other-images", **args)
    assert other["bank"] == "other-images" and other["bank_captions"] == len(photo_inputs["pairs"]["captions"])
    assert other["n_captions"] == sum(len(c) for c in split.captions)
    assert "Bank protocol `other-images`" in (write_photo_report(other, tmp_path / "other") / "report.md").read_text()


class _LookupTransform(torch.nn.Module):
    """A perfect Γ_t on a bank: each input row gets the exact target of its nearest bank row (cosine)."""

    def __init__(self, keys: torch.Tensor, targets: torch.Tensor):
        super().__init__()
        self.keys, self.targets = torch.nn.functional.normalize(keys.float(), dim=-1), targets.float()
        self.net = torch.nn.Sequential(torch.nn.Linear(1, targets.shape[1]))  # out_features, as AlignmentTransform's

    def forward(self, x):
        return self.targets[(torch.nn.functional.normalize(x.float(), dim=-1) @ self.keys.T).argmax(-1)]


def test_exact_target_reference_is_a_perfect_transform(photo_inputs):
    """The "Eq. 7 with exact targets" reference is SemCLIP (STE query) with a Γ_t that returns each bank text's own
    target: with such a Γ_t the two rank identically and Γ_t's measured cost is exactly 0."""
    from grounding.semclip.alignment import CaptionTargets
    from grounding.semclip.photo_evaluation import EXACT_TARGETS, evaluate_photos, read_photo_split

    root, pairs, vlm, ste = photo_inputs["root"], photo_inputs["pairs"], photo_inputs["vlm"], photo_inputs["ste"]
    split = read_photo_split(root / "tokens.txt", root / "Flickr_8k.testImages.txt", root / "images", name="test")
    args = dict(pairs=pairs, train_idx=torch.arange(4), val_idx=torch.arange(4, 6), ks=(1, 5), n_resamples=50,
                bank="other-images")
    trained = evaluate_photos(vlm, photo_inputs["transform"], ste, split, **args)
    # the bank: the pairs' captions, then the query words (their targets from the same CaptionTargets)
    words = list(dict.fromkeys(w for g in trained["groups"] for w in [g["noun"], *g["variants"]]))
    word_targets, kept = CaptionTargets(ste)(words)
    full = torch.zeros(len(words), pairs["targets"].shape[1])
    full[kept] = word_targets
    lookup = _LookupTransform(torch.cat([pairs["vlm_text"], vlm.encode_text(words)]), torch.cat([pairs["targets"], full]))
    perfect = evaluate_photos(vlm, lookup, ste, split, **args)
    for metric, row in perfect["table"].items():
        assert row["SemCLIP (STE query)"]["mean"] == pytest.approx(row[EXACT_TARGETS]["mean"], abs=1e-12), metric
    cost = perfect["diagnostics"]["gamma_t_cost"]
    assert cost["diff"] == pytest.approx(0.0, abs=1e-12) and cost["diff_low"] == pytest.approx(0.0, abs=1e-12)
    # the k-nearest ablation: the reference averages the same k nearest texts' targets as the store
    three = evaluate_photos(vlm, lookup, ste, split, image_neighbours=3, **args)
    assert three["image_neighbours"] == 3
    for metric, row in three["table"].items():
        assert row["SemCLIP (STE query)"]["mean"] == pytest.approx(row[EXACT_TARGETS]["mean"], abs=1e-12), metric
    assert EXACT_TARGETS in trained["reference_systems"] and trained["diagnostics"]["gamma_t_cost"] is not None


def test_evaluate_command_photo_mode(photo_inputs, tmp_path, monkeypatch, capsys):
    """`python -m grounding.semclip evaluate --photos` on the tiny photo folder, Γ_t from a saved transform."""
    from grounding.semclip.__main__ import main
    from grounding.semclip.alignment import save_transform

    root = photo_inputs["root"]
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    # Γ_t's captions belong to other (training) images, named by caption_images, as align_flickr8k.yaml does
    captions, train_list = tmp_path / "bank.txt", tmp_path / "train.txt"
    bank = photo_inputs["pairs"]["captions"]
    captions.write_text("".join(f"train_{i}.jpg#0\t{c}\n" for i, c in enumerate(bank)))
    train_list.write_text("".join(f"train_{i}.jpg\n" for i in range(len(bank))))

    def evaluate(name, *extra, **provenance):
        path = save_transform(photo_inputs["transform"], tmp_path / name, vlm=photo_inputs["vlm"].spec,
                              ste=str(root / "ste"), captions=str(captions), lexical_variants=False, val_fraction=0.3,
                              **provenance)
        main(["evaluate", "--transform", str(path), "--photos", str(root), "--photo-captions", "tokens.txt",
              "--split", "test", "--bootstrap", "30", "--out", str(tmp_path / "out"), *extra])

    # refused, exit 2, when Γ_t's captions are not restricted to other images, or include an evaluated photo's
    leaky = tmp_path / "train_and_test.txt"
    leaky.write_text(train_list.read_text() + (root / "Flickr_8k.testImages.txt").read_text().splitlines()[0] + "\n")
    for name, provenance in (("open.pt", {}), ("leak.pt", {"caption_images": str(leaky)})):
        with pytest.raises(SystemExit) as exit_info:
            evaluate(name, **provenance)
        assert exit_info.value.code == 2 and "caption_images" in capsys.readouterr().err
    evaluate("transform.pt", "--record", str(tmp_path / "records" / "photos.json"), caption_images=str(train_list))
    assert "Table 4" in capsys.readouterr().out
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["split"] == "test" and results["ks"] == [1, 5, 10] and results["bootstrap"]["n_resamples"] == 30
    # --record: Tables 3-4 as a record, the report's numbers under its headers, with the provenance
    record = json.loads((tmp_path / "records" / "photos.json").read_text())
    _assert_record_holds_the_report_tables(record, (tmp_path / "out" / "report.md").read_text())
    assert record["config"] == [str(tmp_path / "transform.pt")] and record["seeds"] == [0]
    assert record["systems"] == results["systems"] and record["resamples"] == 30 and record["ks"] == [1, 5, 10]
    assert record["inputs"]["image_list"].endswith("Flickr_8k.testImages.txt") and record["bank"] == "tagging"
    assert record["report"] == str(tmp_path / "out" / "report.md") and record["command"].startswith("python")
    assert results["provenance"]["image_list"].endswith("Flickr_8k.testImages.txt")
    assert results["provenance"]["image_neighbours"] == 1 and results["image_neighbours"] == 1
    with pytest.raises(SystemExit) as exit_info:  # a k below 1: one line, exit 2
        main(["evaluate", "--transform", str(tmp_path / "transform.pt"), "--photos", str(root), "--image-neighbours", "0",
              "--out", str(tmp_path / "out0")])
    assert exit_info.value.code == 2 and "--image-neighbours 0" in capsys.readouterr().err
    base = ["evaluate", "--transform", str(tmp_path / "transform.pt"), "--photos", str(root), "--photo-captions",
            "tokens.txt", "--bootstrap", "20", "--out", str(tmp_path / "out1")]
    for extra, message in ((["--tagging-captions", "9"], "leaving it no relevance caption"),
                           (["--distractors", "test"], "both evaluated and distractors"),
                           (["--bank-captions", "other-images", "--distractors", "train"], "needs --bank-captions tagging")):
        with pytest.raises(SystemExit) as exit_info:  # one line, exit 2, nothing written
            main(base + extra)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err, extra
    assert not (tmp_path / "out1").exists()
    main(base + ["--bank-captions", "other-images"])
    other = json.loads((tmp_path / "out1" / "results.json").read_text())
    assert other["bank"] == "other-images" and other["provenance"]["bank_captions"] == "other-images"
    assert results["bank"] == "tagging" and results["tagging_captions"] == 1
    # one table over both reports: the VLM and SemCLIP per protocol, with the paired difference
    main(["summarize", "--reports", str(tmp_path / "out"), str(tmp_path / "out1"), "--out", str(tmp_path / "sum")])
    md = (tmp_path / "sum" / "summary.md").read_text()
    assert "| tagging |" in md and "| other-images |" in md and "t2i ndcg@10" in md
    rows = list(csv.DictReader(open(tmp_path / "sum" / "summary.csv")))
    assert [r["bank"] for r in rows] == ["tagging", "other-images"]
    ndcg = results["table"]["t2i ndcg@10"]
    assert float(rows[0]["t2i ndcg@10 vlm"]) == pytest.approx(ndcg["VLM"]["mean"], abs=1e-4)
    assert float(rows[0]["t2i ndcg@10 diff"]) == pytest.approx(ndcg["SemCLIP (STE query)"]["diff"], abs=1e-4)
    with pytest.raises(SystemExit) as exit_info:
        main(["summarize", "--reports", str(tmp_path / "nowhere"), "--out", str(tmp_path / "sum2")])
    assert exit_info.value.code == 2 and "results.json" in capsys.readouterr().err


def _assert_record_holds_the_report_tables(record: dict, md: str) -> None:
    """The record validates and holds report.md's Tables 3 and 4: its rows in the report's order, each cell's numbers
    (mean or Δ, then the interval) in the row of that system under the column the header labels."""
    from grounding.docs_tables import validate_record

    validate_record(record, "the record")
    by_system = {r["system"]: r for r in record["rows"]}
    column = {label: c for c, label in record["labels"].items() if not c.endswith("_ci")}
    table3, table4 = markdown_tables(md)[:2]
    assert [table_cells(line)[0] for line in table3[2:]] == [r["system"] for r in record["rows"]]
    for lines in (table3, table4):
        headers = table_cells(lines[0])
        assert headers[0] == "System" and all(h in column for h in headers)
        assert [column[h] for h in headers] == [c for c in record["columns"] if c in {column[h] for h in headers}]
        for line in lines[2:]:
            cells = table_cells(line)
            row = by_system[cells[0]]
            for header, text in zip(headers[1:], cells[1:]):
                c = column[header]
                numbers = [row[c], row[f"{c}_low"], row[f"{c}_high"]]
                if "skipped" in row:
                    assert numbers == [None] * 3 and text in ("", f"skipped: {row['skipped']}")
                    continue
                printed = [float(x) for x in re.findall(r"[-+]?\d+\.\d+", text)]
                assert printed == pytest.approx([x for x in numbers if x is not None], abs=5e-4 + 1e-9), (cells[0], header)


def test_photo_record_rows_by_hand(tmp_path):
    """Tables 3–4 as record rows on a hand-built result: the systems, the skipped ones, then the Δ rows; a mean and
    its interval as X, X_low, X_high (NaN: null), the report's headers as labels; the written record validates."""
    from grounding.docs_tables import provenance, render_table, validate_record
    from grounding.semclip.photo_evaluation import photo_record_table, write_photo_record

    nan = float("nan")

    def cell(mean, low, high, diff, diff_low, diff_high):
        return {"mean": mean, "low": low, "high": high, "diff": diff, "diff_low": diff_low, "diff_high": diff_high,
                "units": 4, "queries": 2}
    metrics = ["overlap@1"] + [f"{d} {m}" for d in ("t2i", "i2t") for m in ("ndcg@10", "map", "recall@10")]
    results = {"table": {m: {"VLM": cell(0.5, 0.4, 0.6, 0.0, 0.0, 0.0), "SemCLIP": cell(0.25, nan, nan, -0.25, -0.3, -0.2)}
                         for m in metrics},
               "ks": [1], "systems": ["VLM", "SemCLIP"], "skipped": {"Heads": "no checkpoint"}, "split": "test",
               "bootstrap": {"confidence": 0.9, "n_resamples": 7, "seed": 3, "method": "percentile"},
               "n_images": 2, "n_queries": 4, "n_nouns": 2, "n_pairs": 2}
    columns, labels, rows = photo_record_table(results)
    assert columns[:3] == ["system", "overlap_at1", "overlap_at1_ci"] and len(columns) == 1 + 2 * len(metrics)
    assert (labels["system"], labels["overlap_at1"], labels["overlap_at1_ci"]) == ("System", "Overlap@1", "90 % CI")
    assert (labels["t2i_ndcg_at10"], labels["t2i_map"], labels["i2t_recall_at10"]) == ("t2i NDCG@10", "t2i mAP", "i2t R@10")
    assert [r["system"] for r in rows] == ["VLM", "SemCLIP", "Heads", "Δ SemCLIP"]
    assert (rows[0]["overlap_at1"], rows[0]["overlap_at1_low"], rows[0]["overlap_at1_high"]) == (0.5, 0.4, 0.6)
    assert (rows[1]["t2i_map"], rows[1]["t2i_map_low"], rows[1]["t2i_map_high"]) == (0.25, None, None)
    assert rows[2]["skipped"] == "no checkpoint" and rows[2]["i2t_map"] is None
    assert (rows[3]["i2t_map"], rows[3]["i2t_map_low"], rows[3]["i2t_map_high"]) == (-0.25, -0.3, -0.2)
    path = write_photo_record(tmp_path / "r.json", results, provenance(config=["a.yaml"], seeds=[3]),
                              inputs={"transform": tmp_path / "t.pt"})
    record = json.loads(path.read_text())
    validate_record(record, str(path))
    assert record["rows"] == rows and record["labels"] == labels and record["columns"] == columns
    assert record["resamples"] == 7 and record["seeds"] == [3] and record["systems"] == ["VLM", "SemCLIP"]
    assert record["inputs"] == {"transform": str(tmp_path / "t.pt")}
    assert "| VLM | 0.5 | [0.4, 0.6] |" in render_table(record)


def test_evaluate_record_bad_name_exits_2_before_any_work(tmp_path, capsys):
    """`evaluate --record` with a name that cannot be a record: one line, exit 2, before Γ_t is looked for."""
    from grounding.semclip.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["evaluate", "--transform", str(tmp_path / "none.pt"), "--photos", str(tmp_path), "--out",
              str(tmp_path / "out"), "--record", "no good"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert "evaluate: --record" in err and "'no good'" in err and "none.pt" not in err
    assert not (tmp_path / "out").exists()


def test_make_target_evaluates_after_the_fit():
    """`make semclip-flickr8k` (dry run): Γ_t's fit when missing, then the photo evaluation into the report folder."""
    import subprocess
    from pathlib import Path

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(["make", "-n", "--no-print-directory", "semclip-flickr8k"], cwd=root, capture_output=True,
                         text=True, timeout=120).stdout
    fit = out.index("fit --config experiments/semclip/align_flickr8k.yaml")
    evaluate = out.index("-m grounding.semclip evaluate --config experiments/semclip/align_flickr8k.yaml")
    assert fit < evaluate
    assert "--photos ../shared/data/flickr8k --split test --out reports/semclip/flickr8k --ks 1 5 10" in out[evaluate:]
    full = subprocess.run(["make", "-n", "--no-print-directory", "semclip-flickr8k-full", "STE_OUT=/nonexistent"],
                          cwd=root, capture_output=True, text=True, timeout=120).stdout
    for text in ("align_flickr8k_full.yaml", "align_flickr8k_vse_full.yaml", "tagging tagging+train other-images",
                 "--distractors", "--image-dir images-224", "Flickr8k.token.txt --split test", "semclip summarize"):
        assert text in full, text
    assert full.index("fit --config experiments/semclip/ste_wordnet.yaml") < full.index("semclip evaluate")


def test_table4_ties_stay_broken_at_random():
    """break_ties' jitter is below float32 resolution: the metrics must read it in float64 (a float32 cast restores
    the ties, and a tied relevant photo at index 0 would then always rank first)."""
    from grounding.semclip.stability import retrieval

    scores, relevant = torch.zeros(1, 50), torch.zeros(1, 50, dtype=torch.bool)
    relevant[0, 0] = True
    r = retrieval(scores, relevant)
    assert r["t2i"]["map"] < 1.0 and r["t2i"]["queries"] == 1
    assert retrieval(scores, relevant) == r  # seeded


# ------------------------------------------------------------------------------------------------ tagging split
def test_tagging_split_by_hand():
    from grounding.semclip.photo_evaluation import tagging_split

    captions = [["a0", "a1", "a2", "a3", "a4"], ["b0", "b1"], ["c0", "c1", "c2"]]
    one = tagging_split(captions, 1, seed=0)
    assert [len(t) for t in one.tags] == [1, 1, 1] and [len(x) for x in one.labels] == [4, 1, 2]
    for i, cs in enumerate(captions):  # a photo's tags and labels partition its own captions, in caption order
        assert sorted(one.tags[i] + one.labels[i]) == cs and not set(one.tags[i]) & set(one.labels[i])
        assert one.labels[i] == [c for c in cs if c not in one.tags[i]]
    assert set(one.tag_index).isdisjoint(one.label_index)
    assert sorted(one.tag_index + one.label_index) == [(i, j) for i, cs in enumerate(captions) for j in range(len(cs))]
    assert [captions[i][j] for i, j in one.tag_index] == [c for t in one.tags for c in t]
    assert tagging_split(captions, 1, seed=0) == one  # seeded
    draws = {tuple(c for t in tagging_split(captions, 1, seed=s).tags for c in t) for s in range(20)}
    assert len(draws) > 5  # the seed picks different captions
    firsts = Counter(tagging_split(captions, 1, seed=s).tags[0][0] for s in range(400))
    assert set(firsts) == set(captions[0]) and min(firsts.values()) > 40  # every caption equally likely (~80 each)
    two = tagging_split([captions[0], captions[2]], 2, seed=3)
    assert [len(t) for t in two.tags] == [2, 2] and [len(x) for x in two.labels] == [3, 1]
    with pytest.raises(ValueError, match="photo 1 has 2 caption"):
        tagging_split(captions, 2)
    with pytest.raises(ValueError, match="1 or more"):
        tagging_split(captions, 0)


def test_no_relevance_caption_enters_the_bank(photo_inputs, monkeypatch):
    """Under the tagging protocol the bank's captions are exactly the photos' tagging captions (never a label), and
    a store grown with distractors scores image→text on the evaluated photos only."""
    import grounding.semclip.photo_evaluation as pe

    root = photo_inputs["root"]
    split = pe.read_photo_split(root / "tokens.txt", root / "Flickr_8k.testImages.txt", root / "images", name="test")
    seen = []
    real = pe.system_scores

    def recording(*args, **kwargs):
        seen.append(list(args[6]))  # bank_texts
        return real(*args, **kwargs)

    monkeypatch.setattr(pe, "system_scores", recording)
    args = dict(pairs=photo_inputs["pairs"], train_idx=torch.arange(4), val_idx=torch.arange(4, 6), ks=(1,),
                n_resamples=20, query_modes=("ste",))
    first, rest = pe.PhotoSplit(split.paths[:5], split.captions[:5], "test"), \
        pe.PhotoSplit(split.paths[5:], split.captions[5:], "distractors")
    for n_tags in (1, 2):
        usable = [i for i, c in enumerate(first.captions) if len(c) > n_tags]
        part = pe.PhotoSplit([first.paths[i] for i in usable], [first.captions[i] for i in usable], "test")
        r = pe.evaluate_photos(photo_inputs["vlm"], photo_inputs["transform"], photo_inputs["ste"], part,
                               tagging_captions=n_tags, tagging_seed=7, **args)
        split_ = pe.tagging_split(part.captions, n_tags, seed=7)
        tags = [c for t in split_.tags for c in t]
        assert seen[-1][:len(tags)] == tags and r["bank_captions"] == len(tags) == n_tags * len(usable)
        assert not set(seen[-1][len(tags):]) & set(c for cs in part.captions for c in cs)  # the rest: query words
        assert r["n_captions"] == sum(len(x) for x in split_.labels)
    grown = pe.evaluate_photos(photo_inputs["vlm"], photo_inputs["transform"], photo_inputs["ste"], first,
                               distractors=rest, **args)
    assert grown["n_images"] == 5 and grown["n_store_images"] == 8 and grown["n_distractors"] == 3
    assert grown["bank_captions"] == 8  # every stored photo's tagging caption
    assert grown["table"]["i2t map"]["VLM"]["units"] <= 5  # image→text: the evaluated photos only
    alone = pe.evaluate_photos(photo_inputs["vlm"], photo_inputs["transform"], photo_inputs["ste"], first, **args)
    assert alone["n_queries"] == grown["n_queries"]  # the queries are the evaluated photos' nouns either way
    assert grown["diagnostics"]["nearest_is_own_tagging_caption"]["evaluated"] >= 0.0
    with pytest.raises(ValueError, match="distractor photos need bank 'tagging'"):
        pe.evaluate_photos(photo_inputs["vlm"], photo_inputs["transform"], photo_inputs["ste"], first,
                           distractors=rest, bank="other-images", **args)


def test_gamma_t_cost_reads_the_sign_of_semclip_minus_the_exact_store():
    """The diagnosis says Γ_t's error costs quality when SemCLIP scores below the exact-target store (diff < 0)."""
    from grounding.semclip.photo_evaluation import EXACT_TARGETS, _reading

    def row(mean, diff, low, high):
        return {"mean": mean, "low": mean - 0.01, "high": mean + 0.01, "diff": diff, "diff_low": low, "diff_high": high}

    table = {"t2i ndcg@10": {"VLM": row(0.10, 0, 0, 0), "SemCLIP (STE query)": row(0.05, -0.05, -0.06, -0.04),
                             "Oracle": row(0.27, 0.17, 0.16, 0.18), "Eq7": row(0.06, -0.04, -0.05, -0.03),
                             EXACT_TARGETS: row(0.067, -0.033, -0.04, -0.02)}}
    systems, reference = ["VLM", "SemCLIP (STE query)"], ["Oracle", "Eq7", EXACT_TARGETS]
    worse = {"gamma_t_cost": {"system": "SemCLIP (STE query)", "diff": -0.013, "diff_low": -0.018, "diff_high": -0.008}}
    assert "Γ_t's error costs retrieval quality here" in " ".join(_reading(table, systems, reference, worse))
    better = {"gamma_t_cost": {"system": "SemCLIP (STE query)", "diff": 0.01, "diff_low": 0.004, "diff_high": 0.02}}
    assert "does better with Γ_t" in " ".join(_reading(table, systems, reference, better))

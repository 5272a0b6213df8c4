"""Visual Genome cleaning (App. A.3.2) on a small hand-written VG sample."""

from __future__ import annotations

import json
import os

import pytest

from data_modules.vg_cleaning import (
    CleanedVGLabelMapping,
    SynsetClassifier,
    VGCleaningError,
    clean_visual_genome,
    load_object_classes,
    load_relation_merge,
    main,
    normalize_predicate,
    split_file_for,
)
from data_modules.visual_genome import VGFilters, VGSplit


def _obj(oid, name, synset=None):
    return {"object_id": oid, "x": 0, "y": 0, "w": 10, "h": 10, "names": [name], "synsets": [synset] if synset else []}


def _rel(rid, subj, pred, obj):
    return {"relationship_id": rid, "predicate": pred, "synsets": [], "subject": subj, "object": obj}


def write_sample(root, n_rich=6):
    """Images 1..n_rich have six triplets with frequent predicates; image 100 has only two."""
    man, dog, shirt = _obj(1, "man", "man.n.01"), _obj(2, "dog"), _obj(3, "shirt", "shirt.n.01")
    cat, table = _obj(4, "cat", "cat.n.01"), _obj(5, "table", "table.n.02")
    records = []
    for i in range(1, n_rich + 1):
        records.append({"image_id": i, "relationships": [
            _rel(10 * i, man, "next to", dog),        # -> near
            _rel(10 * i + 1, man, "is wearing a", shirt),  # -> wear
            _rel(10 * i + 2, dog, "beside", cat),     # -> near
            _rel(10 * i + 3, cat, "ON TOP OF", table),  # -> on
            _rel(10 * i + 4, dog, "standing on", table),  # -> stand
            _rel(10 * i + 5, man, "near", table),     # -> near
            _rel(10 * i + 6, man, "juggling", cat),   # rare predicate: dropped
            _rel(10 * i + 7, man, "near", table),     # exact duplicate triplet: counted once
        ]})
    records.append({"image_id": 100, "relationships": [_rel(1000, man, "near", dog), _rel(1001, cat, "on", table)]})
    root.mkdir(parents=True, exist_ok=True)
    (root / "relationships.json").write_text(json.dumps(records))
    return records


def test_normalize_predicate():
    assert normalize_predicate("  Is Wearing  A ") == "wearing"
    assert normalize_predicate("near a") == "near"
    assert normalize_predicate("are in") == "in"
    assert normalize_predicate("a") == "a" and normalize_predicate("is") == "is"  # Table 4 keeps "a" and "be"


def test_resource_tables_match_the_paper():
    classes = load_object_classes()
    assert len(classes) == 55 and "feline.n.01" in classes and classes[-1] == "artifact.n.01"
    merge = load_relation_merge()
    labels = set(merge.values())
    assert len(labels) == 114  # Table 4
    for raw in ("near", "next to", "beside", "on side of", "close to", "standing next to", "to right of"):
        assert merge[raw] == "near"
    assert merge["on top of"] == "on" and merge["standing on"] == "stand" and merge["wearing"] == "wear"
    assert all(merge[lab] == lab for lab in labels)  # every label maps to itself


def test_bad_merge_table_names_the_file(tmp_path):
    bad = tmp_path / "merge.tsv"
    bad.write_text("near\tnear\nnear a\ton\n")  # "near a" normalises to "near": contradiction
    with pytest.raises(VGCleaningError, match="merge.tsv:2"):
        load_relation_merge(bad)


def test_synset_classes_most_specific():
    c = SynsetClassifier(load_object_classes())
    cls = c.classes
    assert cls[c.classify(["man"], ["man.n.01"])] == "man.n.01"
    assert cls[c.classify(["dog"], [])] == "mammal.n.01"  # dog.n.01 -> canine -> carnivore -> ... -> mammal
    assert cls[c.classify(["cat"], [])] == "feline.n.01"
    assert cls[c.classify(["horse"], [])] == "equine.n.01"
    assert cls[c.classify(["shirt"], ["shirt.n.01"])] == "clothing.n.01"
    assert cls[c.classify(["woman"], [])] == "woman.n.01"
    assert cls[c.classify(["skateboard"], [])] == "wheeled_vehicle.n.01"  # not container.n.01 (its hypernym)
    assert cls[c.classify(["tennis racquet"], [])] == "artifact.n.01"  # multi-word entry: implement -> artifact
    assert c.classify(["red fire hydrant"], []) == c.classify(["hydrant"], [])  # head-noun fallback
    assert c.classify(["zzqx"], []) == -1


def test_cleaning_end_to_end(tmp_path, capsys):
    root = tmp_path / "vg"
    write_sample(root)
    out = tmp_path / "clean" / "vg_clean.json"
    res = clean_visual_genome(root, out, min_predicate_count=5, min_triplets=5, test_size=2, seed=0)
    # Frequent predicates (>5 occurrences over 6 images): next to, wearing, beside, on top of, standing on, near.
    assert set(res["relation_labels"]) == {"near", "wear", "on", "stand"}
    assert res["relation_labels"][0] == "near"  # ordered by frequency (6+6+6+1=... near forms dominate)
    assert "juggling" not in res["predicate_map"]
    ids = [img["image_id"] for img in res["images"]]
    assert sorted(ids) == [1, 2, 3, 4, 5, 6]  # image 100 has < 5 triplets
    img = res["images"][0]
    assert len(img["triplets"]) == 6  # 8 relations - "juggling" (frequent but not in the merge table) - duplicate
    near = res["relation_labels"].index("near")
    assert [1, near, 2, "next to"] in img["triplets"]
    classes = res["object_classes"]
    by_id = {o["object_id"]: o for o in img["objects"]}
    assert classes[by_id[1]["class"]] == "man.n.01" and classes[by_id[2]["class"]] == "mammal.n.01"
    assert sorted(len(v) for v in res["split"].values()) == [0, 2, 4]
    split_file = json.loads(split_file_for(out).read_text())
    assert split_file["train"] == res["split"]["train"] and split_file["val"] == split_file["test"] == res["split"]["test"]
    assert "images kept: 6 of 7" in capsys.readouterr().out

    # Same seed -> same split; another seed -> (almost surely) another one.
    again = clean_visual_genome(root, tmp_path / "b.json", min_predicate_count=5, test_size=2, seed=0, verbose=False)
    assert again["split"] == res["split"]
    other = clean_visual_genome(root, tmp_path / "c.json", min_predicate_count=5, test_size=0.5, seed=3, verbose=False)
    assert len(other["split"]["test"]) == 3


def test_threshold_is_strict(tmp_path):
    root = tmp_path / "vg"
    write_sample(root)
    # "near" alone occurs 6*2 (dedup happens later) + 1 = 13 times, "wearing" 6 times.
    res = clean_visual_genome(root, tmp_path / "o.json", min_predicate_count=6, min_triplets=1, test_size=0,
                              verbose=False)
    assert res["predicate_map"] == {"near": "near"}


def test_cache_reuse_and_invalidation(tmp_path, capsys):
    root = tmp_path / "vg"
    records = write_sample(root, n_rich=8)
    out = tmp_path / "vg_clean.json"
    clean_visual_genome(root, out, min_predicate_count=5, test_size=2)
    mtime = os.stat(out).st_mtime_ns
    capsys.readouterr()
    clean_visual_genome(root, out, min_predicate_count=5, test_size=2)
    assert "Reusing" in capsys.readouterr().out and os.stat(out).st_mtime_ns == mtime
    # Changed parameters or inputs recompute.
    res = clean_visual_genome(root, out, min_predicate_count=5, test_size=1)
    assert "Reusing" not in capsys.readouterr().out and len(res["split"]["test"]) == 1
    records[0]["relationships"] = records[0]["relationships"][:2]
    (root / "relationships.json").write_text(json.dumps(records))
    res = clean_visual_genome(root, out, min_predicate_count=5, test_size=1)
    assert 1 not in [img["image_id"] for img in res["images"]]
    # No temporary files are left beside the output.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vg", "vg_clean.json", "vg_clean.split.json"]


def test_failed_write_keeps_previous_output(tmp_path, monkeypatch):
    root = tmp_path / "vg"
    write_sample(root)
    out = tmp_path / "vg_clean.json"
    clean_visual_genome(root, out, min_predicate_count=5, test_size=2, verbose=False)
    before = out.read_bytes()
    import data_modules.vg_cleaning as vgc

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(vgc.random, "Random", boom)  # fails mid-run, after the inputs were read
    with pytest.raises(RuntimeError):
        clean_visual_genome(root, out, min_predicate_count=5, test_size=3, verbose=False)
    assert out.read_bytes() == before


def test_label_mapping_from_file(tmp_path):
    root = tmp_path / "vg"
    write_sample(root)
    out = tmp_path / "vg_clean.json"
    main(["--root", str(root), "--out", str(out), "--min-predicate-count", "5", "--test-size", "0.34"])
    m = CleanedVGLabelMapping.from_file(out)
    assert len(m.object_classes) == 55
    assert m.relation_labels[m.relation_label("Is next to a", [])] == "near"
    assert m.relation_label("juggling", []) == -1
    assert m.object_classes[m.object_label(["man"], ["man.n.01"])] == "man.n.01"
    assert m.object_classes[m.object_label(["lion"], [])] == "feline.n.01"  # not in the file: WordNet lookup
    assert m.kept_image_ids == {1, 2, 3, 4, 5, 6} and len(m.split["test"]) == 2


def test_clear_errors(tmp_path):
    with pytest.raises(VGCleaningError, match="relationships.json"):
        clean_visual_genome(tmp_path, tmp_path / "o.json")
    with pytest.raises(VGCleaningError, match="vg_cleaning"):
        CleanedVGLabelMapping.from_file(tmp_path / "missing.json")
    root = tmp_path / "vg"
    write_sample(root)
    with pytest.raises(VGCleaningError, match="fraction"):
        clean_visual_genome(root, tmp_path / "o.json", min_predicate_count=5, test_size=5000, verbose=False)
    with pytest.raises(VGCleaningError, match="min-predicate-count"):
        clean_visual_genome(root, tmp_path / "o.json", verbose=False)  # 250: nothing survives at this size


def test_cleaned_mapping_plugs_into_visual_genome_datamodule(tiny_world, tmp_path):
    from data_modules import VisualGenomeDataModule

    vg = tiny_world / "visual_genome"
    out = tmp_path / "vg_clean.json"
    res = clean_visual_genome(vg, out, min_predicate_count=3, min_triplets=1, test_size=0.2, val_size=0.2,
                              verbose=False)
    # The world's predicates merge as the paper's table says: left of / right of / next to -> near, below -> under.
    assert res["predicate_map"]["left of"] == "near" and res["predicate_map"]["below"] == "under"
    split = json.loads(split_file_for(out).read_text())
    dm = VisualGenomeDataModule(root=str(vg), label_mapping=str(out), split=VGSplit(split_file=str(split_file_for(out))),
                                filters=VGFilters(min_triplets=1), text_encoder="tiny-random",
                                transform={"image_size": 32, "resize_size": 32}, batch_size=4)
    assert dm.relation_labels == res["relation_labels"] and len(dm.object_classes) == 55
    batch = next(iter(dm.train_dataloader()))
    assert batch["triplet_predicate"].min() >= 0 and batch["triplet_predicate"].max() < len(res["relation_labels"])
    assert batch["object_labels"].min() >= -1 and batch["object_labels"].max() < 55  # -1: shapes outside the 55
    assert (batch["object_labels"] >= 0).any()
    assert {int(i) for i in dm.datasets["train"].image_ids} <= set(split["train"])
    assert {int(i) for i in dm.datasets["test"].image_ids} <= set(split["test"])

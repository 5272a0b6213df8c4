"""Caption readers and the `python -m grounding.composer` commands on tiny files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from grounding.composer import CaptionFileError, ConceptGraph, backend_available, read_captions
from grounding.composer.__main__ import main
from grounding.composer.captions import C30K_IMAGES, C30K_SPLITS, c30k

CAPTIONS = [
    "A dog runs on the grass .", "Two dogs are running on the grass .", "A brown dog plays with a ball .",
    "A man sits on a bench .", "A woman sits on a bench near a tree .", "A man and a woman walk in the park .",
    "A child in a red shirt jumps into a pool .", "A boy swims in a pool .", "Children play in the water .",
    "A cat sleeps on a bed .", "A black cat looks at a bird .", "A cat sits near a window .",
]


def _token_file(tmp_path, captions=CAPTIONS, per_image=3, prefix="img"):
    lines = [f"{prefix}{j // per_image}.jpg#{j % per_image}\t{c}" for j, c in enumerate(captions)]
    path = tmp_path / f"{prefix}.token.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_flickr_karpathy_and_coco_readers_agree(tmp_path):
    tok = read_captions(_token_file(tmp_path))
    assert tok.n_images == 4 and len(tok) == 12 and tok.captions_of(1)[0] == "A man sits on a bench ."
    karpathy = {"dataset": "flickr30k", "images": [
        {"filename": f"img{i}.jpg", "imgid": i, "split": "train" if i < 3 else "test", "sentids": [],
         "sentences": [{"raw": c, "tokens": [], "imgid": i, "sentid": 3 * i + k} for k, c in enumerate(CAPTIONS[3 * i:3 * i + 3])]}
        for i in range(4)]}
    (tmp_path / "k.json").write_text(json.dumps(karpathy))
    kp = read_captions(tmp_path / "k.json")
    assert kp.captions == tok.captions and kp.image_names == tok.image_names
    assert read_captions(tmp_path / "k.json", splits=["test"]).captions == CAPTIONS[9:]
    coco = {"images": [{"id": 10 + i, "file_name": f"img{i}.jpg"} for i in range(4)],
            "annotations": [{"id": j, "image_id": 10 + j // 3, "caption": c} for j, c in enumerate(CAPTIONS)]}
    (tmp_path / "c.json").write_text(json.dumps(coco))
    cc = read_captions(tmp_path / "c.json")
    assert cc.captions == tok.captions and cc.image_ids == [10, 11, 12, 13]
    lst = tmp_path / "list.txt"
    lst.write_text("img2.jpg\nimg0.jpg\n")
    sub = read_captions(_token_file(tmp_path), images_list=lst)
    assert sub.image_names == ["img0.jpg", "img2.jpg"] and sub.rows.tolist() == [0, 1, 2, 6, 7, 8]


def test_reader_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("no tab here\n")
    with pytest.raises(CaptionFileError, match="bad.txt:1"):
        read_captions(bad)
    (tmp_path / "x.json").write_text("{\"foo\": 1}")
    with pytest.raises(CaptionFileError, match="Karpathy"):
        read_captions(tmp_path / "x.json")
    with pytest.raises(CaptionFileError, match="does not exist"):
        read_captions(tmp_path / "missing.txt")


@pytest.mark.shared_data
def test_flickr8k_caption_file_reads_completely(shared_data):
    cs = read_captions(shared_data / "flickr8k" / "Flickr8k.token.txt")
    assert len(cs) == 40460 and cs.n_images == 8092
    train = read_captions(shared_data / "flickr8k" / "Flickr8k.token.txt",
                          images_list=shared_data / "flickr8k" / "Flickr_8k.trainImages.txt")
    assert train.n_images == 6000 and np.all(np.diff(train.caption_image) >= 0)


def test_crg_stats_show_and_mcd_commands(tmp_path, capsys, monkeypatch):
    ok, why = backend_available("spacy")
    if not ok:
        pytest.skip(f"spaCy backend not installed: {why}")
    train = _token_file(tmp_path, CAPTIONS[:9], prefix="tr")
    cand = _token_file(tmp_path, CAPTIONS[3:] + ["A dog runs on a bench .", "A man plays with a cat ."] + CAPTIONS[:1], prefix="ca")
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))  # parse cache inside the test folder
    assert main(["crg", "--captions", str(train), "--out", str(tmp_path / "crg")]) == 0
    out = capsys.readouterr().out
    assert "# concepts" in out and "parse failures 0" in out
    g = ConceptGraph.load(tmp_path / "crg" / "crg.npz")
    assert g.n_captions == 9 and "a bench" in g.concept_text.tolist()
    stats = json.loads((tmp_path / "crg" / "stats.json").read_text())
    assert stats["primitives"] == int(g.concept_is_primitive.sum())
    assert main(["stats", "--graph", str(tmp_path / "crg" / "crg.npz")]) == 0
    assert main(["show", "--graph", str(tmp_path / "crg" / "crg.npz"), "--caption", "1"]) == 0
    assert "[NP] are running on [NP]" in capsys.readouterr().out
    assert main(["mcd", "--train", str(train), "--candidates", str(cand), "--out", str(tmp_path / "mcd"),
                 "--k", "2", "--levels", "3", "--random-baselines", "5"]) == 0
    split = json.loads((tmp_path / "mcd" / "mcd.json").read_text())
    assert len(split["images"]) == 2 and all(len(im["sentences"]) == 3 for im in split["images"])
    assert main(["crg", "--captions", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "x")]) == 2
    assert list((tmp_path / "cache" / "composer" / "parses").glob("spacy-*.json.gz"))


def _record(path):
    from grounding.docs_tables import validate_record

    record = json.loads(path.read_text())
    validate_record(record, str(path))
    return record


def test_crg_and_mcd_write_their_records(tmp_path, capsys, monkeypatch):
    """`crg --record` / `mcd --record`: a record docs_tables accepts, rows with stats.json's / summary.json's numbers,
    the printed headers as labels, the --config file as config; without --record no record is written."""
    ok, why = backend_available("spacy")
    if not ok:
        pytest.skip(f"spaCy backend not installed: {why}")
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # no docs/records/ appears here: every path below is absolute
    train = _token_file(tmp_path, CAPTIONS[:9], prefix="tr")
    cand = _token_file(tmp_path, CAPTIONS[3:] + ["A dog runs on a bench .", "A man plays with a cat ."] + CAPTIONS[:1], prefix="ca")
    cfg = tmp_path / "crg.yaml"
    cfg.write_text(f"crg:\n  captions: {train}\n  out: {tmp_path / 'crg'}\n")
    assert main(["crg", "--config", str(cfg), "--record", str(tmp_path / "rec" / "crg.json")]) == 0
    out = capsys.readouterr().out
    record = _record(tmp_path / "rec" / "crg.json")
    stats = json.loads((tmp_path / "crg" / "stats.json").read_text())
    assert (record["config"], record["seeds"], record["columns"]) == \
        (str(cfg), None, ["dataset", "concepts", "predicates", "primitives", "avg_height"])
    assert record["command"].startswith("python -m grounding.composer crg --config") and f"wrote the record {tmp_path}" in out
    [row] = record["rows"]
    assert row["dataset"] == "tr.token" and {k: row[k] for k in stats if k in row} == {k: stats[k] for k in stats if k in row}
    assert set(stats) - set(row) == {"source", "parse_seconds", "extract_seconds", "graph_seconds", "parse_cache",
                                     "unparsed_examples"}
    printed = [line.split() for line in out.splitlines() if line.startswith("tr.token")][0]
    assert printed[1:] == [f"{row['concepts']:,}", f"{row['predicates']:,}", f"{row['primitives']:,}", f"{row['avg_height']:.2f}"]
    assert [record["labels"][c] for c in record["columns"]] == ["dataset", "# concepts", "# predicates", "# primitives", "avg height"]

    argv = ["mcd", "--train", str(train), "--candidates", str(cand), "--out", str(tmp_path / "mcd"), "--k", "2", "--levels", "3",
            "--random-baselines", "5"]
    assert main(argv) == 0  # without --record: the split's files, no record
    assert sorted(p.name for p in (tmp_path / "mcd").iterdir()) == ["candidates_crg.npz", "graded", "mcd.json", "summary.json",
                                                                    "train_crg.npz"]
    assert main([*argv, "--record", str(tmp_path / "mcd_record.json")]) == 0
    record, s = _record(tmp_path / "mcd_record.json"), json.loads((tmp_path / "mcd" / "summary.json").read_text())
    assert (record["config"], record["seeds"], record["k"], record["candidates_kept"]) == (None, [0], 2, s["candidates_kept"])
    rows = {r["split"]: r for r in record["rows"]}
    assert (rows["mcd"]["compound_divergence"], rows["mcd"]["atom_divergence"]) == \
        (s["mcd"]["compound_divergence"], s["mcd"]["atom_divergence"])
    assert rows["all_candidates"]["compound_divergence"] == s["cd_all_candidates"]
    assert rows["random"]["compound_divergence_max"] == max(s["random_splits"]["compound_divergence"])
    assert [r["compound_divergence"] for r in record["rows"] if r["split"] == "graded"] == \
        [g["compound_divergence"] for g in s["graded"]]
    assert f"compound divergence {rows['mcd']['compound_divergence']:.4f}" in capsys.readouterr().out
    assert not list((tmp_path / "cwd").iterdir())


def test_record_option_is_one_error_line_before_any_work(tmp_path, capsys):
    """`--record` naming a folder, a bad name or a path under a file: exit 2, one line, nothing read or written."""
    (tmp_path / "file.txt").write_text("x")
    commands = [["crg", "--captions", "missing.txt", "--out", str(tmp_path / "crg")],
                ["mcd", "--train", "a.txt", "--candidates", "b.txt", "--out", str(tmp_path / "mcd")],
                ["cost", "--config", "missing.yaml"], ["fit-check", "--out", str(tmp_path / "world")]]
    for argv in commands:
        for bad, says in ((str(tmp_path), "is a folder"), ("bad:name", "record name 'bad:name'"),
                          (str(tmp_path / "file.txt" / "x.json"), "is a file, not a folder")):
            capsys.readouterr()
            assert main([*argv, "--record", bad]) == 2, (argv, bad)
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and err.startswith("error: --record") and says in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


def test_fit_check_rows_hold_each_seeds_figures(tmp_path):
    """`fit-check --record`'s rows (diagnostics.fit_check_rows) on synthetic fits: per seed its recall and first / last
    loss, the init diagnostics on the first seed's row, then the mean and sd (ddof 1); a record docs_tables accepts."""
    from grounding.composer.diagnostics import FIT_CHECK_LABELS, fit_check_rows
    from grounding.docs_tables import provenance, write_record

    fits = [{"loss": [3.0, 2.5, 2.0], "match": [1.5, 1.0, 0.5], "t2i_r1": 50.0, "i2t_r1": 40.0, "rsum": 300.0},
            {"loss": [3.2, 2.2], "match": [1.4, 0.7], "t2i_r1": 25.0, "i2t_r1": 12.5, "rsum": 200.0}]
    init = {"caption_gap_sigma": 0.3, "noun_swap": 0.1, "image_swap": 0.4, "noun_to_image": 0.25}
    rows = fit_check_rows([7, 8], fits, init, steps=3)
    assert [r["seed"] for r in rows] == [7, 8, "mean"]
    assert (rows[0]["t2i_r1"], rows[0]["loss_first"], rows[0]["loss_last"], rows[0]["match_last"], rows[0]["rsum"]) == \
        (50.0, 3.0, 2.0, 0.5, 300.0)
    assert {k: rows[0][k] for k in init} == init and all(rows[1][k] is None for k in init)
    assert (rows[1]["loss_first"], rows[1]["loss_last"], rows[1]["i2t_r1"]) == (3.2, 2.2, 12.5) and "loss" not in rows[1]
    assert rows[2]["t2i_r1"] == 37.5 and rows[2]["t2i_r1_sd"] == pytest.approx(float(np.std([50.0, 25.0], ddof=1)))
    assert len(fit_check_rows([0], fits[:1], init, steps=3)) == 1  # one seed: no mean row
    path = write_record(tmp_path / "fit.json", list(FIT_CHECK_LABELS), rows, provenance(command="fit-check", seeds=[7, 8]),
                        labels=FIT_CHECK_LABELS)
    assert _record(path)["rows"] == rows


def test_config_files_load_and_the_command_line_wins(tmp_path, capsys):
    from grounding.composer.__main__ import parse_args
    from grounding.paths import EXPERIMENTS_DIR

    cfg = EXPERIMENTS_DIR / "composer" / "mcd_world.yaml"  # options nested under `mcd:`
    args = parse_args(["mcd", "--k", "7", "--config", str(cfg), "--no-cache"])  # before or after --config
    assert (args.command, args.k, args.levels, args.no_cache) == ("mcd", 7, 8, True)
    assert args.candidates_images == ["data/world/flickr/Flickr_8k.devImages.txt", "data/world/flickr/Flickr_8k.testImages.txt"]
    flat = tmp_path / "flat.yaml"
    flat.write_text("captions: a.txt\ncaptions_split: [train, restval]\nworkers: 3\ndegrade: 0.1\n")
    args = parse_args(["crg", f"--config={flat}"])
    assert (args.captions, args.captions_split, args.workers, args.degrade, args.out) == ("a.txt", ["train", "restval"], 3, 0.1, None)

    bad = tmp_path / "bad.yaml"
    bad.write_text("crg:\n  captions: a.txt\n  captoins_split: [train]\n")
    for argv in (["crg", "--config", str(bad)], ["crg", "--captoins", "x"], ["crg", "--workers", "many"],
                 ["crg", "--config", str(tmp_path / "missing.yaml")], ["frob"]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "error:" in err, (argv, err)
    assert main(["crg", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "captoins_split" in err and str(bad) in err
    assert main(["crg", "--out", str(tmp_path / "x")]) == 2 and "needs --captions" in capsys.readouterr().err


def test_reader_takes_mcd_outputs_and_reports_non_utf8(tmp_path):
    mcd_file = tmp_path / "mcd.json"  # COMPOSER's own Karpathy-layout output: no cocoid; a split may be absent
    mcd_file.write_text(json.dumps({"dataset": "flickr8k", "images": [
        {"filename": "a.jpg", "imgid": 0, "sentences": [{"raw": "A dog .", "tokens": ["a", "dog"]}]}]}))
    cs = read_captions(mcd_file)
    assert cs.captions == ["A dog ."] and cs.splits == [""] and cs.image_ids == [0] and cs.dataset == "flickr8k"
    latin = tmp_path / "latin.token.txt"
    latin.write_bytes("img0.jpg#0\tA dog .\nimg0.jpg#1\tA caf\xe9 .\n".encode("latin-1"))
    with pytest.raises(CaptionFileError, match=r"latin\.token\.txt:2 is not UTF-8"):
        read_captions(latin)
    lst = tmp_path / "list.txt"
    lst.write_bytes(b"img\xe90.jpg\n")
    with pytest.raises(CaptionFileError, match=r"list\.txt:1 is not UTF-8"):
        read_captions(_token_file(tmp_path), images_list=lst)


def _karpathy_coco(tmp_path, splits=("train", "restval", "val", "test", "train", "restval", "train", "test")):
    def sentences(i):
        return [{"raw": c, "tokens": [], "imgid": i, "sentid": 2 * i + k} for k, c in enumerate(CAPTIONS[i % 6 * 2:i % 6 * 2 + 2])]

    images = [{"filename": f"COCO_{i:03d}.jpg", "filepath": "x", "cocoid": 100 + i, "imgid": i, "split": sp, "sentids": [],
               "sentences": sentences(i)} for i, sp in enumerate(splits)]
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"dataset": "coco", "images": images}))
    return path


def test_c30k_is_a_seeded_subset_of_the_karpathy_training_split(tmp_path):
    assert C30K_IMAGES == 29_000 and set(C30K_SPLITS) == {"train", "restval"}  # F30K's Karpathy training split size (§5.1)
    cs = read_captions(_karpathy_coco(tmp_path))
    a, b = c30k(cs, seed=0, n_images=4), c30k(cs, seed=0, n_images=4)
    assert a.image_names == b.image_names and a.n_images == 4 and len(a) == 8
    assert set(a.splits) <= {"train", "restval"} and a.image_names == sorted(a.image_names)  # file order kept
    assert {c30k(cs, seed=s, n_images=3).image_names[0] for s in range(8)} != {a.image_names[0]}  # the seed matters
    assert c30k(cs, n_images=5).n_images == 5  # all train + restval images
    with pytest.raises(CaptionFileError, match="C30K needs 6"):
        c30k(cs, n_images=6)
    with pytest.raises(CaptionFileError, match="Karpathy"):
        c30k(read_captions(_token_file(tmp_path)), n_images=2)
    with pytest.raises(CaptionFileError, match="cannot sample"):
        cs.sample_images(99)


def test_subset_options_and_the_f30k_mcd_config_use_c30k(tmp_path, capsys):
    from grounding.composer.__main__ import parse_args
    from grounding.paths import EXPERIMENTS_DIR

    args = parse_args(["mcd", "--config", str(EXPERIMENTS_DIR / "composer" / "mcd_coco_to_f30k.yaml")])
    assert (args.train_subset, args.train_sample_seed, args.captions_per_image) == ("c30k", 0, 5)
    assert args.candidates_subset is None and args.candidates_split == ["train"]
    args = parse_args(["crg", "--config", str(EXPERIMENTS_DIR / "composer" / "crg_c30k.yaml")])
    assert args.captions_subset == "c30k"
    coco = str(_karpathy_coco(tmp_path))
    for argv in (["crg", "--captions", coco, "--captions-subset", "c30k", "--captions-sample-images", "3", "--out", str(tmp_path)],
                 ["crg", "--captions", coco, "--captions-subset", "c30k", "--captions-split", "val", "--out", str(tmp_path)],
                 ["crg", "--captions", coco, "--captions-subset", "c31k", "--out", str(tmp_path)]):
        assert main(argv) == 2, argv
    assert "c30k" in capsys.readouterr().err


def test_sampled_crg_writes_its_image_list(tmp_path, capsys, monkeypatch):
    ok, why = backend_available("spacy")
    if not ok:
        pytest.skip(f"spaCy backend not installed: {why}")
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    coco = _karpathy_coco(tmp_path)
    argv = ["crg", "--captions", str(coco), "--captions-split", "train", "restval", "--captions-sample-images", "3",
            "--captions-sample-seed", "1", "--out", str(tmp_path / "crg")]
    assert main(argv) == 0
    listed = (tmp_path / "crg" / "captions_images.txt").read_text().split()
    expected = read_captions(coco, ["train", "restval"]).sample_images(3, seed=1).image_names
    assert listed == expected and ConceptGraph.load(tmp_path / "crg" / "crg.npz").n_captions == 6
    # the list reads back as --captions-images: the same graph from the same images
    assert main(["crg", "--captions", str(coco), "--captions-images", str(tmp_path / "crg" / "captions_images.txt"),
                 "--out", str(tmp_path / "again")]) == 0
    assert ConceptGraph.load(tmp_path / "again" / "crg.npz").image_names.tolist() == expected


def test_fit_check_reports_init_diagnostics_and_train_recall_per_seed(tmp_path, capsys):
    """`fit-check` (docs/composer.md's fit and init numbers): one line of init diagnostics, one of train R@1 per seed;
    a folder that holds something else is one error line, exit 2."""
    assert main(["fit-check", "--steps", "1", "--seeds", "0", "--out", str(tmp_path / "world"),
                 "--record", str(tmp_path / "fit.json")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-3].startswith("init (seed 0): caption_gap_sigma") and "noun_to_image" in lines[-3]
    assert lines[-2].startswith("train text→image R@1 after 1 steps:") and "(seeds 0)" in lines[-2]
    assert lines[-1] == f"wrote the record {tmp_path / 'fit.json'}"
    # the record holds the printed figures
    record = _record(tmp_path / "fit.json")
    [row] = record["rows"]
    assert (record["seeds"], record["config"], row["seed"], row["steps"]) == ([0], None, 0, 1)
    assert f"{row['t2i_r1']:.1f} (seeds 0)" in lines[-2] and f"{row['loss_first']:.3f} → {row['loss_last']:.3f}" in lines[-2]
    assert all(f"{k} {row[k]:.3f}" in lines[-3] for k in ("caption_gap_sigma", "noun_swap", "image_swap", "noun_to_image"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert main(["fit-check", "--steps", "1", "--out", str(tmp_path / "other")]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"

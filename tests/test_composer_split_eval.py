"""`python -m grounding.leaderboard.evaluate_splits` (old name `python -m grounding.composer evaluate-splits`): a
checkpoint tested on the MCD and graded splits (Fig. 4),
its table and plot, its bad-input lines, and test-only Karpathy files in ComposerDataModule."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
import yaml

from data_modules import FlickrDataModule
from data_modules.file_checks import MalformedDataError
from grounding.cli import main as cli_main
from grounding.composer import backend_available, read_captions, write_karpathy_split
from grounding.composer.__main__ import main
from grounding.composer.data import ComposerDataModule
from grounding.docs_tables import validate_record
from grounding.errors import user_errors_exit
from grounding.leaderboard.evaluate_splits import PROG, write_splits_record
from grounding.leaderboard.evaluate_splits import main as splits_main
from grounding.leaderboard.splits import COLUMNS, find_splits, plot_fig4, write_table
from grounding.paths import EXPERIMENTS_DIR

WORLD_CONFIG = EXPERIMENTS_DIR / "composer" / "composer_world.yaml"
TINY_NET = {"text_encoder": "tiny-random", "backbone": "tiny_cnn", "backbone_weights": None,
            "sizes": {"heads": 2, "co_heads": 2, "co_dim": 16, "dim": 32}}


def split_eval(argv: list[str]) -> int:
    """``python -m grounding.leaderboard.evaluate_splits <argv>``'s exit status, run in this process."""
    try:
        with user_errors_exit(PROG):
            return splits_main(argv)
    except SystemExit as e:
        return e.code


def _need_spacy():
    ok, why = backend_available("spacy")
    if not ok:
        pytest.skip(f"spaCy backend not installed: {why}")


def _row(name, cd, r1, r5, mcd=False, images=4):
    metrics = {"t2i_r1": r1, "t2i_r5": r5, "t2i_r10": 100.0, "i2t_r1": r1, "i2t_r5": r5, "i2t_r10": 100.0}
    metrics["rsum"] = sum(metrics.values())
    return {"split": name, "file": f"{name}.json", "compound_divergence": cd, "atom_divergence": cd / 2, "images": images,
            "captions": 5 * images, **metrics, "mcd": mcd, "metrics": metrics}


def _fake_splits(tmp_path, cds=(0.3, 0.1, 0.2)):
    """An mcd.json (first divergence) and graded files (the rest) of one tiny caption set, + summary.json."""
    tok = tmp_path / "c.token.txt"
    tok.write_text("".join(f"img{i}.jpg#{j}\ta dog number {i} runs\n" for i in range(2) for j in range(5)))
    cs = read_captions(tok)
    out = tmp_path / "splits"
    write_karpathy_split(out / "mcd.json", cs, [0, 1], {"compound_divergence": cds[0], "atom_divergence": 0.05})
    for i, cd in enumerate(cds[1:]):
        write_karpathy_split(out / "graded" / f"cd_{cd:.4f}_start{i}.json", cs, [0, 1],
                             {"compound_divergence": cd, "atom_divergence": 0.01})
    (out / "summary.json").write_text(json.dumps({"k": 2, "random_splits": {"n": 3, "compound_divergence": [0.1, 0.12, 0.15]}}))
    return out


def test_find_splits_reads_divergences_mcd_first_then_graded_by_falling_divergence(tmp_path):
    splits, summary = find_splits(_fake_splits(tmp_path, (0.3, 0.1, 0.2, 0.25)))
    assert [s.name for s in splits] == ["mcd", "cd_0.2500_start2", "cd_0.2000_start1", "cd_0.1000_start0"]
    assert [s.compound_divergence for s in splits] == [0.3, 0.25, 0.2, 0.1] and splits[0].is_mcd
    assert splits[0].atom_divergence == 0.05 and summary["random_splits"]["n"] == 3


def test_table_and_fig4_from_synthetic_metrics(tmp_path):
    rows = [_row("mcd", 0.3, 10.0, 40.0, mcd=True), _row("cd_0.3000_start0", 0.3, 10.0, 40.0),
            _row("cd_0.1000_start9", 0.1, 30.0, 70.0)]
    write_table(rows, tmp_path, {"checkpoint": "x.ckpt"})
    plot_fig4(rows, tmp_path / "fig4.png", {"random_splits": {"compound_divergence": [0.12, 0.15]}})
    with open(tmp_path / "splits.csv") as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == list(COLUMNS) and [r["split"] for r in table] == ["mcd", "cd_0.3000_start0", "cd_0.1000_start9"]
    assert float(table[2]["t2i_r1"]) == 30.0 and float(table[2]["rsum"]) == 30 + 70 + 100 + 30 + 70 + 100
    assert int(table[0]["captions"]) == 20
    saved = json.loads((tmp_path / "splits.json").read_text())
    assert saved["checkpoint"] == "x.ckpt" and saved["splits"][0]["mcd"] is True and saved["splits"][1]["metrics"]["t2i_r5"] == 40.0
    assert (tmp_path / "fig4.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig4.png", "splits.csv", "splits.json"]  # no temp files left


def _one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "GROUNDING_DEBUG" not in line]
    assert len(err) == 1, err
    return err[0]


def test_bad_inputs_are_one_line_and_exit_2(tmp_path, capsys):
    ckpt = tmp_path / "stage1.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1)}, "hyper_parameters": {"_class_path": "grounding.vgbert.GroundingPretrain"}},
               ckpt)
    base = ["--config", str(WORLD_CONFIG), "--ckpt", str(ckpt)]
    assert split_eval([*base, "--splits", str(tmp_path / "nowhere")]) == 2
    assert "no such folder" in _one_error_line(capsys)
    (tmp_path / "empty").mkdir()
    assert split_eval([*base, "--splits", str(tmp_path / "empty")]) == 2
    assert "no mcd.json" in _one_error_line(capsys)
    splits = _fake_splits(tmp_path)
    assert split_eval([*base, "--splits", str(splits)]) == 2
    line = _one_error_line(capsys)
    assert "grounding.vgbert.GroundingPretrain (another stage)" in line and str(ckpt) in line
    assert split_eval([*base[:-1], str(tmp_path / "missing.ckpt"), "--splits", str(splits)]) == 2
    assert "no such file" in _one_error_line(capsys)
    stage1 = EXPERIMENTS_DIR / "vgbert" / "stage1_tiny.yaml"
    assert split_eval(["--config", str(stage1), "--ckpt", str(ckpt), "--splits", str(splits)]) == 2
    assert "not COMPOSER" in _one_error_line(capsys)


def _karpathy_test_file(world, tmp_path, n_images=3):
    flickr = world / "flickr"
    cs = read_captions(flickr / "Flickr8k.token.txt", images_list=flickr / "Flickr_8k.testImages.txt")
    return write_karpathy_split(tmp_path / "test_only.json", cs, list(range(n_images)))


def test_test_only_karpathy_file_loads_in_composer_datamodule(tiny_world, tmp_path, monkeypatch):
    _need_spacy()
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    path = _karpathy_test_file(tiny_world, tmp_path)
    with pytest.raises(MalformedDataError, match="'train' split has no captioned images"):
        FlickrDataModule(root=str(tiny_world / "flickr"), karpathy_file=str(path)).setup()
    captions = FlickrDataModule(root=str(tiny_world / "flickr"), karpathy_file=str(path), test_only=True)
    dm = ComposerDataModule(captions, text_encoder="tiny-random", transform={"image_size": 64, "resize_size": 64},
                            caption_batch_size=4)
    dm.setup()
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [0, 0, 3]
    assert [dm.graphs[s].graph.n_captions for s in ("train", "val", "test")] == [0, 0, 15]
    assert dm.val_dataloader() == [] and dm.image_datasets() == [dm.test_dataset]  # nothing to cache for empty splits
    images, caption_batches = dm.test_dataloader()
    assert len(next(iter(images))["images"]) == 3 and len(caption_batches) == 4  # 15 captions, 4 a batch


def _tiny_model_config(world, tmp_path):
    cfg = {"base": str(WORLD_CONFIG), "model": {"init_args": {"net": {"init_args": TINY_NET}}},
           "data": {"init_args": {"captions": {"class_path": "data_modules.FlickrDataModule",
                                               "init_args": {"root": str(world / "flickr")}},
                                  "world_meta": str(world / "world.json")}}}
    path = tmp_path / "tiny_composer.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_evaluate_splits_end_to_end_on_a_tiny_world(tiny_world, tmp_path, monkeypatch, capsys):
    """mcd split of the tiny world -> a one-step checkpoint -> evaluate-splits: one row per split, the same
    numbers for the MCD split and a graded split of the same images, the table and Fig. 4 written."""
    _need_spacy()
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    flickr = tiny_world / "flickr"
    splits = tmp_path / "mcd"
    assert main(["mcd", "--train", str(flickr / "Flickr8k.token.txt"), "--train-images", str(flickr / "Flickr_8k.trainImages.txt"),
                 "--candidates", str(flickr / "Flickr8k.token.txt"), "--candidates-images", str(flickr / "Flickr_8k.devImages.txt"),
                 str(flickr / "Flickr_8k.testImages.txt"), "--out", str(splits), "--k", "4", "--levels", "2",
                 "--random-baselines", "3"]) == 0
    config = _tiny_model_config(tiny_world, tmp_path)
    cli_main(["fit", "--config", str(config), "--trainer.max_epochs=1", "--trainer.limit_train_batches=1",
              "--trainer.limit_val_batches=0", "--trainer.check_val_every_n_epoch=1", "--trainer.logger=false",
              "--trainer.callbacks=[]", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
              f"--trainer.default_root_dir={tmp_path / 'run'}"])
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    out = tmp_path / "report"
    record_file = tmp_path / "records" / "splits.json"
    assert split_eval(["--config", str(config), "--ckpt", str(ckpt), "--splits", str(splits),
                 "--out", str(out), "--record", str(record_file)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((splits / "summary.json").read_text())
    saved = json.loads((out / "splits.json").read_text())
    rows = saved["splits"]
    assert [r["split"] for r in rows] == ["mcd"] + [g["file"].split("/")[1][:-5] for g in summary["graded"]]
    assert f"[{len(rows)}/{len(rows)}]" in printed and "fig4.png" in printed
    assert rows[0]["mcd"] and rows[0]["compound_divergence"] == pytest.approx(summary["mcd"]["compound_divergence"])
    for r in rows:
        assert (r["images"], r["captions"]) == (4, 20)
        assert r["t2i_r5"] == r["t2i_r10"] == 100.0  # 4 images: the true one is always in the top 5
        assert r["rsum"] == pytest.approx(sum(r[k] for k in ("t2i_r1", "t2i_r5", "t2i_r10", "i2t_r1", "i2t_r5", "i2t_r10")))
        assert 0.0 <= r["t2i_r1"] <= 100.0 and "phrase_r1" in r["metrics"]
    same_images = [r for r in rows[1:] if r["split"].endswith("_start0")]  # the first window holds the MCD images
    assert same_images
    for r in same_images:
        assert {k: r["metrics"][k] for k in r["metrics"]} == pytest.approx(rows[0]["metrics"])
    assert saved["random_splits"]["n"] == 3 and np.isfinite(saved["seconds"])
    with open(out / "splits.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows)
    assert (out / "fig4.png").stat().st_size > 0
    _check_splits_record(json.loads(record_file.read_text()), saved, table, str(config))


def _check_splits_record(record, saved, table, config):
    """The record of --record: the schema, the table's columns, its rows the numbers of splits.json (unrounded) and
    splits.csv (4 decimals), the --config file."""
    validate_record(record, "record")
    assert record["columns"] == list(COLUMNS) and set(record["labels"]) == set(COLUMNS)
    assert record["config"] == config and record["seeds"] is None and record["checkpoint"] == saved["checkpoint"]
    assert [r["split"] for r in record["rows"]] == [r["split"] for r in saved["splits"]] == [r["split"] for r in table]
    for written, row, csv_row in zip(record["rows"], saved["splits"], table):
        assert {c: written[c] for c in COLUMNS} == {c: row[c] for c in COLUMNS} and written["mcd"] == row["mcd"]
        for c in COLUMNS[2:]:
            assert isinstance(written[c], (int, float)) and written[c] == pytest.approx(float(csv_row[c]), abs=1e-4), c


def test_the_record_of_a_synthetic_table(tmp_path):
    """write_splits_record on synthetic rows: the table write_table writes, numbers as numbers, NaN as null."""
    rows = [_row("mcd", 0.3, 10.0, 40.0, mcd=True), _row("cd_0.1000_start9", 0.1, 30.0 + 1 / 3, 70.0)]
    rows[1]["atom_divergence"] = float("nan")
    info = {"checkpoint": "x.ckpt", "seconds": 1.5}
    write_table(rows, tmp_path, info)
    path = write_splits_record(tmp_path / "r.json", {**info, "splits": rows}, "m.yaml")
    record = json.loads(path.read_text())
    with open(tmp_path / "splits.csv") as f:
        table = list(csv.DictReader(f))
    assert record["rows"][1]["atom_divergence"] is None and table[1]["atom_divergence"] == "nan"
    rows[1]["atom_divergence"] = table[1]["atom_divergence"] = 0.0
    record["rows"][1]["atom_divergence"] = 0.0
    _check_splits_record(record, {**info, "splits": rows}, table, "m.yaml")
    assert record["rows"][1]["t2i_r1"] == 30.0 + 1 / 3 and record["seconds"] == 1.5


@pytest.mark.parametrize("bad", ["bad name!", "folder", "in/a/file.json"])
def test_a_bad_record_is_one_line_before_any_work(bad, tmp_path, capsys):
    (tmp_path / "in").write_text("x")
    name = {"folder": str(tmp_path), "in/a/file.json": str(tmp_path / "in" / "a" / "file.json")}.get(bad, bad)
    argv = ["--config", str(WORLD_CONFIG), "--ckpt", "x.ckpt", "--splits", str(tmp_path / "nowhere"), "--record", name]
    assert split_eval(argv) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"{PROG}: error: ") and ("--record " in line or "record name " in line) and "nowhere" not in line


def test_the_old_command_name_runs_the_split_evaluation(tmp_path, capfd):
    """`python -m grounding.composer evaluate-splits` starts `python -m grounding.leaderboard.evaluate_splits` (a process: the
    paper package never imports the top floor), with its options and its exit status."""
    assert main(["evaluate-splits", "--config", str(WORLD_CONFIG), "--ckpt", "x.ckpt", "--splits",
                 str(tmp_path / "nowhere"), "--record", str(tmp_path / "r.json")]) == 2  # --record: an option of both
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) <= 2 and err[0].startswith(f"{PROG}: error:") and "no such folder" in err[0] and "Traceback" not in "".join(err)

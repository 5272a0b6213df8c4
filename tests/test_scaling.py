"""The scaling curve (grounding.leaderboard.scaling): the train_subset override per DataModule, the fits it runs
for the missing sizes, and its table and plot."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from test_leaderboard import _tiny_config, tiny_region_setup

from grounding.leaderboard import load_leaderboard
from grounding.leaderboard.scaling import main as scaling_main
from grounding.leaderboard.scaling import markdown, plot_scaling, slug, subset_override
from grounding.paths import EXPERIMENTS_DIR
from grounding.training_images import checkpoint_training_keys


def test_subset_override_reaches_each_datamodules_reader():
    """COMPOSER's DataModule wraps a caption DataModule: its train_subset sits one level down."""
    assert subset_override(str(EXPERIMENTS_DIR / "vgbert" / "baseline_flickr8k_full.yaml"), 750) == \
        {"data": {"init_args": {"train_subset": 750}}}
    assert subset_override(str(EXPERIMENTS_DIR / "composer" / "vse_flickr8k_full.yaml"), 750) == \
        {"data": {"init_args": {"captions": {"init_args": {"train_subset": 750}}}}}
    assert slug("CLIP-style dual encoder") == "clip-style_dual_encoder" and slug("ViLBERT + MVSA") == "vilbert_+_mvsa"


def test_table_and_plot_of_fake_rows(tmp_path):
    rows = [{"model": "A", "photos": n, "rsum": r, "rsum_low": r - 5, "rsum_high": r + 5, "t2i_r1": 1.0, "i2t_r1": 2.0,
             "train_minutes": 1.5, "epochs": 3, "status": "ok", "command": "c"} for n, r in ((750, 100.0), (1500, 150.0))]
    rows.append({"model": "B", "photos": 750, "status": "skipped: no run for 750 photos", "command": "fit B"})
    md = markdown(rows)
    assert "| A | 1500 | 150.0 [145.0, 155.0] | 1.0 | 2.0 | 1.5 | 3 |" in md and "`fit B`" in md
    assert plot_scaling(rows, tmp_path / "s.png", "t").stat().st_size > 1000


@pytest.mark.slow
def test_scaling_fits_the_missing_size_and_tests_every_size(tiny_world, tmp_path, monkeypatch):
    """VSE on the tiny world at 8 training photos (fit by --fit with train_subset 8) and at all of them (the
    leaderboard row's own run): both tested on the same test set; the 8-photo run trained on 8 images."""
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    offline, flickr, data = tiny_region_setup(tiny_world)
    config = _tiny_config(tmp_path, "vse", "composer/vse_world.yaml", tiny_world, {**offline, "dim": 32}, data)
    cfg = yaml.safe_load(open(config))
    cfg["trainer"].update(max_epochs=1, check_val_every_n_epoch=1, limit_train_batches=2)
    (tmp_path / "vse.yaml").write_text(yaml.safe_dump(cfg))
    full = tmp_path / "full"
    subprocess.run([sys.executable, "-m", "grounding", "fit", "--config", config, "--trainer.default_root_dir",
                    str(full)], check=True, capture_output=True)
    board = {"test_set": {"name": "tiny", "captions": flickr}, "out": str(tmp_path / "board"),
             "models": [{"name": "VSE", "config": config, "ckpt": str(full / "checkpoints" / "best-*.ckpt"),
                         "command": "fit VSE"}]}
    (tmp_path / "board.yaml").write_text(yaml.safe_dump(board))
    load_leaderboard(tmp_path / "board.yaml")
    out = tmp_path / "report"
    assert scaling_main(["--config", str(tmp_path / "board.yaml"), "--models", "VSE", "--photos", "8", "1000",
                         "--runs", str(tmp_path / "runs"), "--out", str(out), "--fit"]) == 0
    rows = json.loads((out / "scaling.json").read_text())["rows"]
    assert [(r["model"], r["status"]) for r in rows] == [("VSE", "ok"), ("VSE", "ok")]
    small, whole = rows
    assert small["photos"] == 8 and whole["photos"] > 8  # the whole training split, not the 1000 asked for
    small_ckpt = next((tmp_path / "runs" / "vse" / "n8" / "checkpoints").glob("best-*.ckpt"))
    assert len(set(checkpoint_training_keys(small_ckpt).tolist())) == 8  # the images its fit trained on
    assert len(set(checkpoint_training_keys(next((full / "checkpoints").glob("best-*.ckpt"))).tolist())) > 8
    assert (out / "scaling.png").stat().st_size > 1000 and "| VSE | 8 |" in (out / "scaling.md").read_text()

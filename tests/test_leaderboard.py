"""The leaderboard: its YAMLs, its bad-input lines, and its numbers equal to each stage's own `test` on the same
checkpoint (a VG-BERT caption stage tested on COMPOSER's data, and a COMPOSER-family baseline with the world's
compositional captions)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil
from pathlib import Path

import pytest
import yaml

from grounding.cli import main as cli_main
from grounding.cli import resolved_config
from grounding.leaderboard import LeaderboardError, evaluate, load_leaderboard, write_outputs
from grounding.leaderboard.__main__ import main as leaderboard_main
from grounding.leaderboard.board import markdown_table
from grounding.paths import EXPERIMENTS_DIR

BOARDS = sorted((EXPERIMENTS_DIR / "leaderboard").glob("*.yaml"))


@pytest.mark.parametrize("path", BOARDS, ids=[p.name for p in BOARDS])
def test_leaderboard_yamls_name_configs_that_parse(path):
    board = load_leaderboard(path)
    assert len(board.models) >= 6 and board.test_set.captions["class_path"] == "data_modules.FlickrDataModule"
    for entry in board.models:
        # a make target or the fit that makes it (the Flickr8k search heads: after a Visual Genome stage 2)
        assert "make " in entry.command or entry.command == f"python -m grounding fit --config {entry.config}"
        if entry.config:
            cfg = resolved_config(entry.config)  # parses as `python -m grounding test` would
            assert cfg["model"]["class_path"] and cfg["data"]["class_path"]
    if path.stem == "world":  # every retrieval model of the suite
        names = {m.name for m in board.models}
        assert {"VG-BERT stage 1", "VG-BERT search heads", "CLIP-style dual encoder", "COMPOSER", "VSE", "ViLBERT-style",
                "ViLBERT + MVSA", "SemCLIP on the dual encoder"} == names


@pytest.mark.parametrize("text, match", [
    ("[1, 2", "not readable YAML"),
    ("models: []", "test_set"),
    ("test_set: {captions: {init_args: {}}}\nmodels: []", "class_path"),
    ("test_set: {captions: {class_path: a.B}}\nmodels: [{name: x, command: make x}]", "config` and `ckpt"),
    ("test_set: {captions: {class_path: a.B}}\nmodels: [{name: x, command: make x, config: c, ckpt: k},"
     " {name: x, command: make y, config: c, ckpt: k}]", "distinct"),
    ("test_set: {captions: {class_path: a.B}}\nmodels: [{name: x, command: make x, config: c, ckpt: k},"
     " {name: e, command: make e, ensemble: [x]}]", "2 or more distinct row names"),
    ("test_set: {captions: {class_path: a.B}}\nmodels: [{name: x, command: make x, config: c, ckpt: k},"
     " {name: e, command: make e, ensemble: [x, y]}]", "ensemble member 'y' must name a suite model listed before"),
    ("test_set: {captions: {class_path: a.B}}\nmodels: [{name: x, command: make x, config: c, ckpt: k},"
     " {name: y, command: make y, config: c, ckpt: k}, {name: e, command: make e, ensemble: [x, y], config: c}]",
     "remove `config`"),
    ("test_set: {captions: {class_path: a.B}}\nmodels: [{name: x, command: make x, config: c, ckpt: k},"
     " {name: y, command: make y, config: c, ckpt: k}, {name: e, command: make e, ensemble: [x, y], weights: [1]}]",
     "`weights` must be 2 non-negative numbers"),
    ("test_set: {captions: {class_path: a.B}}\nmodels: [{name: x, command: make x, config: c, ckpt: k},"
     " {name: y, command: make y, config: c, ckpt: k}, {name: e, command: make e, ensemble: [x, y]},"
     " {name: z, command: make z, config: c, ckpt: k, first_stage: e, rerank_top_k: 2}]",
     "first_stage 'e' must name a suite model"),
    ("test_set: {captions: {class_path: a.B}}\nmodels: [{name: s, command: make s,"
     " semclip: {vlm: v, transform: t, ste: s, bank_images: 3}}]", "semclip.bank_images must be a path"),
])
def test_bad_leaderboard_yaml_is_one_line_and_exit_2(tmp_path, capsys, text, match):
    path = tmp_path / "board.yaml"
    path.write_text(text)
    with pytest.raises(LeaderboardError, match=match):
        load_leaderboard(path)
    assert leaderboard_main(["--config", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and not (tmp_path / "out").exists()
    assert leaderboard_main(["--config", str(tmp_path / "missing.yaml")]) == 2


def _tiny_config(tmp_path, name: str, base: str, world, net: dict, data: dict) -> str:
    cfg = {"base": str(EXPERIMENTS_DIR / base), "model": {"init_args": {"net": {"init_args": net}}},
           "data": {"init_args": data},
           "trainer": {"logger": False, "callbacks": [], "enable_progress_bar": False, "enable_model_summary": False}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def tiny_region_setup(tiny_world) -> tuple[dict, dict, dict]:
    """COMPOSER-family runs on the tiny world: offline net settings, the world's Flickr reader, the DataModule args."""
    offline = {"text_encoder": "tiny-random", "backbone": "tiny_cnn", "backbone_weights": None, "image_size": 64}
    flickr = {"class_path": "data_modules.FlickrDataModule",
              "init_args": {"root": str(tiny_world / "flickr"), "karpathy_file": None, "captions_file": None}}
    data = {"captions": flickr, "world_meta": str(tiny_world / "world.json"), "batch_size": 8,
            "transform": {"resize_size": 64}}
    return offline, flickr, data


def _tiny_vse_and_vilbert(tiny_world, tmp_path) -> tuple[dict, str, str]:
    """The world's Flickr reader and tiny VSE and ViLBERT-style configs on it (a first stage and a reranker)."""
    offline, flickr, data = tiny_region_setup(tiny_world)
    vse = _tiny_config(tmp_path, "vse", "composer/vse_world.yaml", tiny_world, {**offline, "dim": 32}, data)
    vilbert = _tiny_config(tmp_path, "vilbert", "composer/vilbert_world.yaml", tiny_world,
                           {**offline, "sizes": {"text_layers": 2, "image_layers": 1, "coattention_layers": 1,
                                                 "image_dim": 16, "image_heads": 2, "image_ffn_dim": 32, "co_dim": 16,
                                                 "co_heads": 2}}, data)
    return flickr, vse, vilbert


@pytest.fixture(scope="module")
def tiny_vse_vilbert_runs(tiny_world, tmp_path_factory) -> tuple[dict, str, str, dict[str, str], Path]:
    """``_tiny_vse_and_vilbert``'s configs and their fits, made once for this module's tests (they only read them):
    VSE seeds 0 and 1 and ViLBERT-style; (reader, vse config, vilbert config, {"vse", "vse1", "vilbert"}: last.ckpt,
    the folder holding the runs)."""
    root = tmp_path_factory.mktemp("leaderboard_runs")
    flickr, vse, vilbert = _tiny_vse_and_vilbert(tiny_world, root)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GROUNDING_CACHE", str(root / "cache"))
        ckpts = {"vse": _fit(vse, root / "seed0"), "vse1": _fit(vse, root / "seed1", "--seed_everything=1"),
                 "vilbert": _fit(vilbert, root / "run_vilbert")}
    return flickr, vse, vilbert, ckpts, root


def _fit(config: str, out, *extra) -> str:
    with contextlib.redirect_stdout(io.StringIO()):
        cli_main(["fit", "--config", config, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
                  "--trainer.limit_val_batches=0", f"--trainer.default_root_dir={out}", *extra])
    return str(out / "checkpoints" / "last.ckpt")


def _own_test(config: str, ckpt: str, out, *extra) -> dict:
    with contextlib.redirect_stdout(io.StringIO()):
        cli = cli_main(["test", "--config", config, *extra, "--ckpt_path", ckpt, f"--trainer.default_root_dir={out}"])
    return {k.removeprefix("test/"): float(v) for k, v in cli.trainer.callback_metrics.items() if k.startswith("test/")}


def test_leaderboard_numbers_equal_each_stages_own_test(tiny_world, tmp_path, monkeypatch):
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    offline = {"text_encoder": "tiny-random", "backbone": "tiny_cnn", "backbone_weights": None}
    flickr = {"class_path": "data_modules.FlickrDataModule",
              "init_args": {"root": str(tiny_world / "flickr"), "karpathy_file": None, "captions_file": None}}
    stage1 = _tiny_config(tmp_path, "stage1", "vgbert/stage1_tiny.yaml", tiny_world, {**offline, "visual_heads": 4},
                          {"root": str(tiny_world / "coco"), "batch_size": 8, "eval_batch_size": 8})
    vse = _tiny_config(tmp_path, "vse", "composer/vse_world.yaml", tiny_world, {**offline, "image_size": 64, "dim": 32},
                       {"captions": flickr, "world_meta": str(tiny_world / "world.json"), "batch_size": 8,
                        "transform": {"resize_size": 64}})
    ckpts = {"stage1": _fit(stage1, tmp_path / "run_stage1"), "vse": _fit(vse, tmp_path / "run_vse")}
    subset = str(tmp_path / "subset.yaml")
    (tmp_path / "subset.yaml").write_text(yaml.safe_dump({"base": stage1, "data": {"init_args": {"subsets": {"test": 2}}}}))
    # each stage's own `test` on the leaderboard's test set (VG-BERT's caption stage reads the world's Flickr layout)
    own = {"stage1": _own_test(stage1, ckpts["stage1"], tmp_path / "t1", "--data", "data_modules.FlickrDataModule",
                               f"--data.init_args.root={tiny_world / 'flickr'}"),
           "vse": _own_test(vse, ckpts["vse"], tmp_path / "t2")}
    # a run whose fit stopped before its max_epochs (its record says 1 epoch of 3): skipped, not published
    stopped = tmp_path / "run_stopped"
    shutil.copytree(Path(ckpts["stage1"]).parent.parent, stopped)
    (stopped / "config.yaml").write_text((stopped / "config.yaml").read_text().replace("max_epochs: 1", "max_epochs: 3"))
    board_yaml = {"test_set": {"name": "tiny", "captions": flickr, "world_meta": str(tiny_world / "world.json")},
                  "out": str(tmp_path / "board"),
                  "models": [{"name": "stage 1", "config": stage1, "ckpt": ckpts["stage1"], "command": "make stage1"},
                             # a glob (the best checkpoint's name carries its epoch): the one file it matches
                             {"name": "VSE", "config": vse, "ckpt": str(Path(ckpts["vse"]).parent / "las*.ckpt"),
                              "command": "make vse", "encoders": "tiny CNN grid | tiny BERT"},
                             {"name": "missing", "config": vse, "ckpt": str(tmp_path / "none.ckpt"),
                              "command": "make vilbert"},
                             # a stage config that keeps a test_subset of its own: not the same test set
                             {"name": "subset", "config": subset, "ckpt": ckpts["stage1"], "command": "make stage1"},
                             # another model's checkpoint: an error, never that model's numbers under this name
                             {"name": "wrong", "config": stage1, "ckpt": ckpts["vse"], "command": "make stage1"},
                             {"name": "stopped", "config": stage1, "ckpt": str(stopped / "checkpoints" / "last.ckpt"),
                              "command": "make stage1"}],
                  "published": [{"name": "m-CNN", "source": "Ma et al. 2015", "encoders": "VGG19 | word CNN",
                                 "i2t": [24.8, 53.7, 67.1], "t2i": [20.3, 47.6, 61.7]}]}
    (tmp_path / "board.yaml").write_text(yaml.safe_dump(board_yaml))
    board = load_leaderboard(tmp_path / "board.yaml")
    rows = {r["model"]: r for r in evaluate(board, log=lambda line: None)}
    for name, key in (("stage 1", "stage1"), ("VSE", "vse")):
        row = rows[name]
        assert row["status"] == "ok", row["status"]
        for metric in ("t2i_r1", "t2i_r5", "t2i_r10", "i2t_r1", "i2t_r5", "i2t_r10", "rsum"):
            assert row[metric] == pytest.approx(own[key][metric], abs=1e-3), (name, metric)
        assert row["params_m"] > row["trainable_m"] > 0 and row["ms_per_query"] > 0
        assert row["train_minutes"] is not None and row["epochs"] == 1  # fit_record.json of the run folder
        assert row["rsum_low"] <= row["rsum"] <= row["rsum_high"] and row["t2i_medr"] >= 1 and row["i2t_medr"] >= 1
    assert rows["VSE"]["ckpt"] == ckpts["vse"] and "first_stage" not in rows["VSE"]  # exhaustive: no ceiling
    # the compositional captions: the same R@1 the COMPOSER-family stage logs itself
    assert rows["VSE"]["compositional_r1"] == pytest.approx(own["vse"]["compositional/t2i_r1"], abs=1e-3)
    assert rows["missing"]["status"].startswith("skipped") and rows["missing"]["command"] == "make vilbert"
    assert rows["subset"]["status"].startswith("error") and "not the test set's" in rows["subset"]["status"]
    assert rows["wrong"]["status"].startswith("error") and "is a checkpoint of" in rows["wrong"]["status"]
    assert rows["stopped"]["status"] == "skipped: its fit stopped after 1 of 3 epochs"
    out = write_outputs(list(rows.values()), board)
    md = (out / "leaderboard.md").read_text()
    assert "| stage 1 |" in md and "skipped" in md and "`make vilbert`" in md
    assert "| m-CNN | Ma et al. 2015 | VGG19 \\| word CNN | 20.3 | 47.6 | 61.7 | 24.8 | 53.7 | 67.1 | 275.2 |" in md
    table = list(csv.DictReader((out / "leaderboard.csv").open()))
    assert [r["model"] for r in table] == ["stage 1", "VSE", "missing", "subset", "wrong", "stopped", "m-CNN"]
    assert json.loads((out / "leaderboard.json").read_text())["rows"][0]["status"] == "ok"
    assert (out / "leaderboard.png").stat().st_size > 1000

    # --only re-tests one model and keeps the other rows of the table already written
    assert leaderboard_main(["--config", str(tmp_path / "board.yaml"), "--only", "missing"]) == 0
    merged = json.loads((out / "leaderboard.json").read_text())["rows"]
    assert [r["model"] for r in merged] == ["stage 1", "VSE", "missing", "subset", "wrong", "stopped", "m-CNN"]
    assert merged[0]["status"] == "ok" and merged[-1]["status"] == "published"


def test_bad_test_set_is_one_line_before_any_model(tmp_path, capsys):
    board = {"test_set": {"captions": {"class_path": "data_modules.FlickrDataModule",
                                       "init_args": {"root": str(tmp_path / "nowhere")}}},
             "models": [{"name": "x", "config": "c.yaml", "ckpt": "k.ckpt", "command": "make x"}]}
    (tmp_path / "board.yaml").write_text(yaml.safe_dump(board))
    assert leaderboard_main(["--config", str(tmp_path / "board.yaml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: test_set") and "FlickrDataModule cannot read it" in err[-1]
    assert not (tmp_path / "out").exists()


def test_fit_record_segments_fresh_and_resumed(tmp_path):
    from types import SimpleNamespace

    from grounding.lightning import FIT_RECORD, FitRecord

    def trainer(epoch, ckpt=None):
        return SimpleNamespace(default_root_dir=str(tmp_path), ckpt_path=ckpt, current_epoch=epoch, global_step=10 * epoch,
                               is_global_zero=True, fast_dev_run=False, sanity_checking=False, num_devices=1)

    def run(first, last, ckpt=None):
        rec = FitRecord()
        rec.on_fit_start(trainer(0, ckpt), None)
        rec.on_train_start(trainer(first, ckpt), None)
        for epoch in range(first, last + 1):
            rec.on_train_epoch_end(trainer(epoch, ckpt), None)
        return json.loads((tmp_path / FIT_RECORD).read_text())

    from grounding.utils.provenance import source_commit

    assert run(0, 3)["epochs"] == 4  # a fresh fit of epochs 0-3
    resumed = run(4, 5, ckpt="last.ckpt")  # resumed after epoch 3: a second segment
    assert resumed["epochs"] == 6 and [s["first_epoch"] for s in resumed["segments"]] == [0, 4]
    assert [s["commit"] for s in resumed["segments"]] == [source_commit()] * 2  # each segment names its checkout
    earlier = run(2, 5, ckpt="epoch1.ckpt")  # resumed from epoch 1's checkpoint: epochs 2-5 retrained
    assert earlier["epochs"] == 6 and [(s["first_epoch"], s["epochs"]) for s in earlier["segments"]] == [(0, 2), (2, 4)]
    assert run(0, 0)["epochs"] == 1 and len(json.loads((tmp_path / FIT_RECORD).read_text())["segments"]) == 1  # fresh


def test_fit_record_agrees_with_last_ckpt_after_a_failed_save(tmp_path, monkeypatch):
    """A checkpoint write that fails (a full disk) stops the fit; fit_record.json then counts the epochs that
    last.ckpt holds, not one more."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.demos.boring_classes import BoringModel

    from grounding.lightning import FIT_RECORD, FitRecord, LastCheckpoint

    record = FitRecord()
    last = LastCheckpoint(record, dirpath=tmp_path / "checkpoints", monitor=None, save_top_k=1, filename="last",
                          enable_version_counter=False, save_on_train_epoch_end=True)
    trainer = pl.Trainer(max_epochs=4, callbacks=[last, record], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path, limit_train_batches=2,
                         limit_val_batches=0, accelerator="cpu")
    saves = []
    real = trainer.save_checkpoint

    def save(*args, **kwargs):
        saves.append(args[0])
        if len(saves) == 3:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "save_checkpoint", save)
    with pytest.raises(OSError, match="No space left"):
        trainer.fit(BoringModel())
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert saved["epoch"] == 1  # epochs 0 and 1 were saved, epoch 2's save failed
    assert json.loads((tmp_path / FIT_RECORD).read_text())["epochs"] == saved["epoch"] + 1 == 2


def test_a_baselines_checkpoint_tests_with_composers_table2_style_config(tiny_world, tmp_path, monkeypatch):
    """Table 2's test configs are COMPOSER's; a VSE checkpoint tested with one switches to VSETraining (the
    checkpoint carries its LightningModule) and gives the numbers of its own config's test."""
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    offline, flickr, data = tiny_region_setup(tiny_world)
    vse = _tiny_config(tmp_path, "vse", "composer/vse_world.yaml", tiny_world, {**offline, "dim": 32}, data)
    composer = _tiny_config(tmp_path, "composer", "composer/composer_world.yaml", tiny_world,
                            {**offline, "sizes": {"heads": 2, "co_heads": 2, "co_dim": 16, "dim": 32}}, data)
    ckpt = _fit(vse, tmp_path / "run")
    own = _own_test(vse, ckpt, tmp_path / "t1")
    with contextlib.redirect_stdout(io.StringIO()):
        cli = cli_main(["test", "--config", composer, "--ckpt_path", ckpt, f"--trainer.default_root_dir={tmp_path / 't2'}"])
    assert type(cli.model).__name__ == "VSETraining"
    switched = {k.removeprefix("test/"): float(v) for k, v in cli.trainer.callback_metrics.items()}
    assert switched["rsum"] == pytest.approx(own["rsum"]) and switched["t2i_r1"] == pytest.approx(own["t2i_r1"])


def test_compositional_split_path_is_absolute_for_the_reader(tmp_path, monkeypatch):
    """The caption reader resolves a relative karpathy_file under its root: the split file must reach it absolute."""
    from grounding.leaderboard.board import split_captions

    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mcd.json").write_text("{}")
    captions = {"class_path": "data_modules.FlickrDataModule", "init_args": {"root": "../elsewhere", "captions_file": "x"}}
    args = split_captions(captions, "out/mcd.json")["init_args"]
    assert args["karpathy_file"] == str(tmp_path / "out" / "mcd.json") and args["test_only"] and args["captions_file"] is None
    assert captions["init_args"] == {"root": "../elsewhere", "captions_file": "x"}  # the test set is not changed


def test_a_cross_encoder_reranks_another_rows_first_stage(tiny_vse_vilbert_runs, tmp_path, monkeypatch):
    """``first_stage: VSE`` + ``rerank_top_k: 2``: ViLBERT-style cross-encodes each test caption with VSE's top 2 of
    the 5 test images only. Reranking inside the top 2 moves no image across rank 2, and the rest keep VSE's order,
    so text->image R@5 and R@10 are VSE's; the logged ceiling is VSE's R@2 on the same queries."""
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    flickr, vse, vilbert, ckpts, _ = tiny_vse_vilbert_runs
    board_yaml = {"test_set": {"name": "tiny", "captions": flickr}, "out": str(tmp_path / "board"),
                  "models": [{"name": "VSE", "config": vse, "ckpt": ckpts["vse"], "command": "make vse"},
                             {"name": "ViLBERT-style", "config": vilbert, "ckpt": ckpts["vilbert"],
                              "command": "make vilbert", "first_stage": "VSE", "rerank_top_k": 2}]}
    (tmp_path / "board.yaml").write_text(yaml.safe_dump(board_yaml))
    rows = {r["model"]: r for r in evaluate(load_leaderboard(tmp_path / "board.yaml"), only=["ViLBERT-style"],
                                             log=lambda line: None)}
    assert set(rows) == {"VSE", "ViLBERT-style"}  # --only of a reranker tests its first stage too
    row, first = rows["ViLBERT-style"], rows["VSE"]
    assert row["status"] == "ok", row["status"]
    ceiling = row["logged"]["first_stage/t2i_r2"]
    assert first["t2i_r1"] - 1e-3 <= ceiling <= first["t2i_r5"] + 1e-3 and row["t2i_r1"] <= ceiling + 1e-3
    for key in ("t2i_r5", "t2i_r10"):
        assert row[key] == pytest.approx(first[key], abs=1e-3)
    assert row["first_stage"] == f"VSE, R@2 {ceiling:.1f}"
    # a first stage must be a suite row listed before the reranker
    board_yaml["models"].reverse()
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(board_yaml))
    with pytest.raises(LeaderboardError, match="first_stage 'VSE' must name a suite model listed before it"):
        load_leaderboard(tmp_path / "bad.yaml")


def test_a_seed_whose_fit_stopped_early_is_not_counted(tmp_path):
    from grounding.leaderboard.board import ModelEntry, fit_progress

    runs = {}
    for name, epochs in (("done", 3), ("stopped", 1), ("unrecorded", None)):
        run = tmp_path / name
        (run / "checkpoints").mkdir(parents=True)
        (run / "checkpoints" / "best-epoch000.ckpt").write_bytes(b"x")
        (run / "config.yaml").write_text("trainer:\n  max_epochs: 3\n")
        if epochs is not None:
            (run / "fit_record.json").write_text(json.dumps({"epochs": epochs, "seconds": 1.0}))
        runs[name] = run / "checkpoints" / "best-*.ckpt"
    entry = ModelEntry(name="m", command="make m", config="c.yaml", ckpt=str(runs["done"]),
                       other_seeds=[str(p) for p in runs.values()])
    assert [c.parent.parent.name for c in entry.seed_checkpoints()] == ["done", "unrecorded"]
    assert [c.parent.parent.name for c in entry.seed_checkpoints(finished=False)] == ["stopped"]
    assert fit_progress(tmp_path / "stopped") == (1, 3) and fit_progress(tmp_path / "done") is None


def test_other_seeds_give_mean_sd_and_the_interval_of_the_mean(tiny_world, tiny_vse_vilbert_runs, tmp_path,
                                                                monkeypatch):
    """A row with ``other_seeds``: its recalls are the runs' means, rsum's sd is theirs, and the interval is that of
    the mean rsum; each run alone (its own row) gives the numbers averaged."""
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    flickr, vse, _, ckpts, runs = tiny_vse_vilbert_runs
    first, second = ckpts["vse"], ckpts["vse1"]
    board_yaml = {"test_set": {"name": "tiny", "captions": flickr, "world_meta": str(tiny_world / "world.json")},
                  "out": str(tmp_path / "board"),
                  "models": [{"name": "VSE", "config": vse, "ckpt": first, "command": "make vse",
                              "other_seeds": [str(runs / "seed1" / "checkpoints" / "last*.ckpt"),
                                              str(tmp_path / "seed2" / "checkpoints" / "last.ckpt")]},  # not made
                             {"name": "seed 0", "config": vse, "ckpt": first, "command": "make vse"},
                             {"name": "seed 1", "config": vse, "ckpt": second, "command": "make vse"},
                             # ensembles: two seeds fused; a model fused with itself (its rankings, its seeds paired)
                             {"name": "fused seeds", "ensemble": ["seed 0", "seed 1"], "command": "make vse"},
                             {"name": "VSE again", "config": vse, "ckpt": first, "command": "make vse",
                              "other_seeds": [str(runs / "seed1" / "checkpoints" / "last*.ckpt")]},
                             {"name": "VSE twice", "ensemble": ["VSE", "VSE again"], "command": "make vse"}]}
    (tmp_path / "board.yaml").write_text(yaml.safe_dump(board_yaml))
    from grounding.leaderboard import board as board_module

    given = []  # without a compositional split, every seed's held-out-pair R@1 comes from its own scores
    original = board_module.seed_mean_row
    monkeypatch.setattr(board_module, "seed_mean_row", lambda runs, comp_r1, *a: given.append(comp_r1) or original(
        runs, comp_r1, *a))
    rows = {r["model"]: r for r in evaluate(load_leaderboard(tmp_path / "board.yaml"), log=lambda line: None)}
    assert given[:2] == [[None, None]] * 2 and len(given) == 3  # VSE, VSE again, then the paired ensemble
    mean, a, b = rows["VSE"], rows["seed 0"], rows["seed 1"]
    assert mean["status"] == "ok" and mean["seeds"] == 2 and a["rsum"] != b["rsum"]
    for key in ("t2i_r1", "i2t_r5", "rsum", "compositional_r1"):  # the held-out-pair R@1 too, over both seeds
        assert mean[key] == pytest.approx((a[key] + b[key]) / 2)
    assert mean["rsum_sd"] == pytest.approx(abs(a["rsum"] - b["rsum"]) / 2 ** 0.5)
    assert mean["rsum_low"] <= mean["rsum"] <= mean["rsum_high"]
    # an ensemble of a model with itself ranks as the model: seed i fused with seed i, the same mean, sd and seeds
    twice, fused = rows["VSE twice"], rows["fused seeds"]
    assert twice["status"] == "ok" and twice["seeds"] == 2
    for key in ("t2i_r1", "i2t_r5", "rsum", "rsum_sd", "compositional_r1"):
        assert twice[key] == pytest.approx(mean[key], abs=1e-6), key
    assert twice["params_m"] == pytest.approx(2 * mean["params_m"]) and twice["epochs"] is None
    assert twice["ms_per_query"] == pytest.approx(mean["ms_per_query"] + rows["VSE again"]["ms_per_query"])
    # two seeds fused: one run (no seeds), its own interval, every column of a row
    assert fused["status"] == "ok" and "seeds" not in fused and fused["rsum_low"] <= fused["rsum"] <= fused["rsum_high"]
    assert fused["train_minutes"] == pytest.approx(a["train_minutes"] + b["train_minutes"])
    test_set = load_leaderboard(tmp_path / "board.yaml").test_set
    assert f"± {mean['rsum_sd']:.1f} (2 seeds)" in markdown_table(list(rows.values()), test_set)
    # the median ranks' mean over seeds to one decimal (a mean of 3 seeds once printed 5.66667)
    three_seeds = {**mean, "t2i_medr": 17 / 3, "i2t_medr": 5.0}
    assert "| 5.7 / 5 |" in markdown_table([three_seeds], test_set)


def _world_splits(tiny_world, tmp_path, stray: bool = False) -> Path:
    """An MCD folder over the tiny world's 5 test images: mcd.json (4 images) and two graded splits; ``stray``: a
    graded split with a training image (not a test image)."""
    from grounding.composer import read_captions, write_karpathy_split

    test = read_captions(tiny_world / "flickr" / "dataset_flickr30k.json", splits=["test"])
    out = tmp_path / ("stray_splits" if stray else "splits")
    write_karpathy_split(out / "mcd.json", test, [0, 1, 2, 3], {"compound_divergence": 0.3, "atom_divergence": 0.1})
    write_karpathy_split(out / "graded" / "cd_0.2000_start1.json", test, [1, 2, 3, 4], {"compound_divergence": 0.2})
    write_karpathy_split(out / "graded" / "cd_0.1000_start0.json", test, [0, 2, 4], {"compound_divergence": 0.1})
    if stray:
        train = read_captions(tiny_world / "flickr" / "dataset_flickr30k.json", splits=["train"])
        write_karpathy_split(out / "graded" / "cd_0.0500_start9.json", train, [0, 1], {"compound_divergence": 0.05})
    return out


def test_graded_splits_restrict_exhaustive_rows_and_rerun_rerankers(tiny_world, tiny_vse_vilbert_runs, tmp_path,
                                                                     monkeypatch):
    """``--graded`` (Fig. 4 with every row): a row that reranks nothing (a model with seeds, one run, an ensemble)
    gets its test matrix restricted to each split, which equals its own `test` on that split file; a reranker runs its
    test loop on each split. On the MCD split both equal the row's compositional column."""
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    flickr, vse, vilbert, ckpts, _ = tiny_vse_vilbert_runs
    splits = _world_splits(tiny_world, tmp_path)
    board_yaml = {"test_set": {"name": "tiny", "captions": flickr, "compositional_split": str(splits / "mcd.json")},
                  "out": str(tmp_path / "board"),
                  "models": [{"name": "VSE", "config": vse, "ckpt": ckpts["vse"], "command": "make vse",
                              "other_seeds": [ckpts["vse1"]]},
                             {"name": "seed 1", "config": vse, "ckpt": ckpts["vse1"], "command": "make vse"},
                             {"name": "fused", "ensemble": ["VSE", "seed 1"], "command": "make vse"},
                             {"name": "ViLBERT-style", "config": vilbert, "ckpt": ckpts["vilbert"],
                              "command": "make vilbert", "first_stage": "VSE", "rerank_top_k": 2}]}
    (tmp_path / "board.yaml").write_text(yaml.safe_dump(board_yaml))
    rows = {r["model"]: r for r in evaluate(load_leaderboard(tmp_path / "board.yaml"), log=lambda line: None,
                                             graded=True)}
    assert all(r["status"] == "ok" for r in rows.values()), {k: r["status"] for k, r in rows.items()}
    for name, runs, scored_by in (("VSE", 2, "restricted"), ("seed 1", 1, "restricted"), ("fused", 1, "restricted"),
                                  ("ViLBERT-style", 1, "reranking VSE's top 2")):
        graded = rows[name]["graded"]
        assert [g["split"] for g in graded] == ["mcd", "cd_0.2000_start1", "cd_0.1000_start0"], name
        assert [g["images"] for g in graded] == [4, 4, 3] and [g["captions"] for g in graded] == [20, 20, 15]
        assert all(g["runs"] == runs and scored_by in g["scored_by"] for g in graded), name
        assert graded[0]["mcd"] and graded[0]["t2i_r1"] == pytest.approx(rows[name]["compositional_r1"], abs=1e-3)
    # the restriction is what the model's own test on the split file gives
    for g in rows["seed 1"]["graded"][1:]:
        split_file = splits / "graded" / f"{g['split']}.json"
        own = _own_test(vse, ckpts["vse1"], tmp_path / f"own_{g['split']}",
                        f"--data.init_args.captions.init_args.karpathy_file={split_file}",
                        "--data.init_args.captions.init_args.test_only=true")
        for metric in ("t2i_r1", "t2i_r5", "i2t_r1", "rsum"):
            assert g[metric] == pytest.approx(own[metric], abs=1e-3), (g["split"], metric)
    out = write_outputs(list(rows.values()), load_leaderboard(tmp_path / "board.yaml"))
    table = list(csv.DictReader((out / "graded.csv").open()))
    assert len(table) == 4 * 3 and table[0]["model"] == "VSE" and table[0]["mcd"] == "True"
    assert (out / "graded.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trends = json.loads((out / "graded.json").read_text())["trends"]
    assert set(trends) == set(rows) and trends["VSE"]["splits"] == 2 and "| ViLBERT-style | 1 | 2 |" in (
        out / "graded.md").read_text()
    # a table whose rows have no graded results any more (re-tested without --graded): no stale graded files
    write_outputs([{k: v for k, v in r.items() if k != "graded"} for r in rows.values()],
                  load_leaderboard(tmp_path / "board.yaml"))
    assert not list(out.glob("graded.*")) and (out / "leaderboard.md").is_file()
    # graded_splits_kept (--graded-splits) 1: the reranker tests the MCD split and the first graded split (the most
    # divergent) only; its first stage, which costs no test run per split, still gets every split
    kept = {r["model"]: r for r in evaluate(load_leaderboard(tmp_path / "board.yaml"), only=["ViLBERT-style"],
                                            log=lambda line: None, graded=True, graded_splits_kept=1)}
    assert [g["split"] for g in kept["ViLBERT-style"]["graded"]] == ["mcd", "cd_0.2000_start1"]
    assert kept["ViLBERT-style"]["graded"] == rows["ViLBERT-style"]["graded"][:2]
    assert kept["VSE"]["graded"] == rows["VSE"]["graded"]
    # a graded split with an image the test set lacks: one line naming it, before any model is tested
    board_yaml["test_set"]["compositional_split"] = str(_world_splits(tiny_world, tmp_path, stray=True) / "mcd.json")
    (tmp_path / "stray.yaml").write_text(yaml.safe_dump(board_yaml))
    with pytest.raises(LeaderboardError, match=r"graded split cd_0.0500_start9: its image .* is not a test image"):
        evaluate(load_leaderboard(tmp_path / "stray.yaml"), log=lambda line: None, graded=True)


def test_graded_trend_by_hand():
    """R@1 30, 20, 10 at divergence 0.1, 0.2, 0.3 (the MCD split aside): slope -10 per 0.1, Spearman rho -1."""
    from grounding.leaderboard.graded import markdown, trend

    results = [{"mcd": True, "compound_divergence": 0.3, "t2i_r1": 12.0, "runs": 2}] + [
        {"mcd": False, "compound_divergence": cd, "t2i_r1": r1, "runs": 2} for cd, r1 in ((0.3, 10.0), (0.1, 30.0), (0.2, 20.0))]
    t = trend(results)
    assert t["splits"] == 3 and t["mcd_t2i_r1"] == 12.0 and (t["least_t2i_r1"], t["most_t2i_r1"]) == (30.0, 10.0)
    assert t["slope_per_0_1"] == pytest.approx(-10.0) and t["spearman_rho"] == pytest.approx(-1.0)
    assert "| m | 2 | 3 | 30.0 (0.100) | 10.0 (0.300) | 12.0 | -10.0 | -1.00 |" in markdown([{"model": "m", "graded": results}])


def test_paired_trend_of_rerankers_sharing_a_first_stage_by_hand(tmp_path, capsys):
    """Two rerankers of VSE: A − B is -2, 0, +2 at divergence 0.1, 0.2, 0.3 (slope +2 per 0.1, rho +1, mean 0); a
    row of another first stage and an exhaustive row are not paired. ``--rewrite`` writes the same files again from
    leaderboard.json alone, testing nothing."""
    from grounding.leaderboard.graded import paired_markdown, paired_trends

    def graded(r1s):
        rest = {"images": 5, "captions": 25, "runs": 1, "t2i_r1_sd": None, "scored_by": "test", "t2i_r10": 60.0,
                "i2t_r1": 1.0, "i2t_r5": 2.0, "i2t_r10": 3.0, "rsum": 100.0}
        return [{"split": f"s{i}", "mcd": False, "compound_divergence": cd, "t2i_r1": r1, "t2i_r5": 50.0, **rest}
                for i, (cd, r1) in enumerate(zip((0.1, 0.3, 0.2), r1s))] + [
                {"split": "mcd", "mcd": True, "compound_divergence": 0.3, "t2i_r1": 0.0, "t2i_r5": 0.0, **rest}]

    rows = [{"model": "A", "first_stage": "VSE, R@20 70.0", "graded": graded((18.0, 22.0, 20.0))},
            {"model": "exhaustive", "graded": graded((40.0, 30.0, 35.0))},
            {"model": "B", "first_stage": "VSE, R@20 70.0", "graded": graded((20.0, 20.0, 20.0))},
            {"model": "C", "first_stage": "other, R@20 60.0", "graded": graded((1.0, 2.0, 3.0))}]
    r1, r5 = paired_trends(rows)
    assert r1["models"] == ["A", "B"] and r1["first_stage"] == "VSE" and r1["metric"] == "t2i_r1" and r1["splits"] == 3
    assert (r1["least_diff"], r1["most_diff"], r1["mean_diff"]) == (-2.0, 2.0, 0.0)
    assert r1["slope_per_0_1"] == pytest.approx(2.0) and r1["spearman_rho"] == pytest.approx(1.0)
    assert r5["metric"] == "t2i_r5" and r5["mean_diff"] == 0.0 and r5["spearman_rho"] is None  # no difference at all
    assert "| A − B | VSE | t2i_r1 | 3 | -2.0 (0.100) | +2.0 (0.300) | +0.00 | +2.0 | +1.00 |" in paired_markdown([r1, r5])
    assert paired_markdown(paired_trends(rows[:2])) == ""

    board = {"test_set": {"name": "tiny", "captions": {"class_path": "data_modules.FlickrDataModule",
                                                       "init_args": {"root": str(tmp_path)}}},
             "out": str(tmp_path / "out"), "models": [{"name": m, "config": "x.yaml", "ckpt": "x.ckpt",
                                                     "command": "make x"} for m in "ABC"]}
    (tmp_path / "board.yaml").write_text(yaml.safe_dump(board))
    assert leaderboard_main(["--config", str(tmp_path / "board.yaml"), "--rewrite"]) == 2  # nothing to rewrite yet
    assert "no " in capsys.readouterr().err
    write_outputs([{**r, "status": "ok", "rsum": 100.0} for r in rows if r["model"] != "exhaustive"],
                  load_leaderboard(str(tmp_path / "board.yaml")))
    before = {f.name: f.read_bytes() for f in (tmp_path / "out").iterdir() if f.suffix != ".png"}
    assert "| A − B | VSE | t2i_r1 |" in before["graded.md"].decode()
    (tmp_path / "out" / "graded.md").unlink()
    assert leaderboard_main(["--config", str(tmp_path / "board.yaml"), "--rewrite"]) == 0
    assert {f.name: f.read_bytes() for f in (tmp_path / "out").iterdir() if f.suffix != ".png"} == before


def test_semclip_row_refuses_a_transform_fitted_on_another_vlm(tiny_world, tmp_path, monkeypatch):
    """The row's VLM must be the one Γ_t was fitted on (the transform file records it): else the row is an error
    naming both, not a store whose images and queries live in another space."""
    from semclip_helpers import tiny_baseline_ckpt, tiny_world_ste

    from grounding.semclip.alignment import AlignmentTransform, save_transform

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    fitted_on, other = tiny_baseline_ckpt(tmp_path / "vlm_a"), tiny_baseline_ckpt(tmp_path / "vlm_b", seed=1)
    ste = tiny_world_ste(tmp_path / "ste")
    transform = save_transform(AlignmentTransform(384, 16, hidden=8), tmp_path / "transform.pt",
                               vlm=f"suite:{fitted_on}")
    flickr = {"class_path": "data_modules.FlickrDataModule",
              "init_args": {"root": str(tiny_world / "flickr"), "karpathy_file": None, "captions_file": None}}
    path = tmp_path / "board.yaml"
    path.write_text(yaml.safe_dump({"test_set": {"name": "tiny", "captions": flickr}, "out": str(tmp_path / "out"),
                                    "models": [{"name": "SemCLIP", "command": "make semclip", "semclip": {
                                        "vlm": f"suite:{other}", "transform": str(transform), "ste": str(ste)}}]}))
    (row,) = evaluate(load_leaderboard(str(path)), log=lambda line: None)
    expected = (f"error: Γ_t {transform} was fitted on the VLM suite:{fitted_on}, but it is queried through "
                f"suite:{other}: name the same checkpoint (semclip.vlm) or refit Γ_t on this VLM.")
    assert row["status"] == expected[:len("error: ") + 300]  # (a row's error line keeps 300 characters)


@pytest.mark.parametrize(("train", "fits"), [
    # a cross-encoder reranks VSE's top 20: VSE (seed 0 only) is fit first when missing
    ("vilbert-mvsa", ["vse_flickr8k_full.yaml --trainer.default_root_dir outputs/composer/vse_flickr8k_full\n",
                      "vilbert_mvsa_flickr8k_full.yaml"]),
    # VSE itself named: its seeds too
    ("vse", ["vse_flickr8k_full.yaml --trainer.default_root_dir outputs/composer/vse_flickr8k_full\n",
             "--seed_everything 1", "--seed_everything 2"]),
])
def test_full_benchmark_target_fits_what_its_rows_need(tmp_path, train, fits):
    """`make leaderboard-flickr8k-full FULL_TRAIN=...` run where no model exists (fits and tests replaced by echo):
    it fits the named model and what its row needs, in order, and nothing else."""
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    makefile = Path(__file__).resolve().parent.parent / "Makefile"
    out = subprocess.run(["make", "--no-print-directory", "-f", str(makefile), "-o", ".venv/.grounding-installed",
                          "leaderboard-flickr8k-full", f"FULL_TRAIN={train}", "CLI=echo CLI", "PY=echo PY"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    fit_lines = [line + "\n" for line in out.stdout.splitlines() if line.startswith("CLI fit")]
    assert len(fit_lines) == len(fits), fit_lines
    for line, expected in zip(fit_lines, fits):
        assert expected in line, (expected, line)
    assert "PY -m grounding.leaderboard --config experiments/leaderboard/flickr8k_full.yaml" in out.stdout

"""The LightningCLI entry point and the shared trainer configuration."""

from __future__ import annotations

import sys

import pytest
import yaml

from grounding.cli import resolve_precision, trainer_config_file
from grounding.paths import REPO_ROOT


def test_help_lists_the_four_subcommands(monkeypatch, capsys):
    """``python -m grounding --help``, in this process (a fresh interpreter's imports took ~25 s of `make test` on 2
    loaded cores; the fast tier still starts `python -m grounding fit` as a subprocess in tests/test_scaling.py)."""
    from grounding.__main__ import main as module_main

    monkeypatch.setattr(sys, "argv", ["grounding", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        module_main()
    assert exit_info.value.code in (0, None)
    out = capsys.readouterr().out
    for sub in ("fit", "validate", "test", "predict"):
        assert f"    {sub} " in out, out


def test_a_command_that_names_its_subcommand_builds_only_that_parser(monkeypatch, capsys):
    """`test --config ...` builds the test subcommand's parser alone (each of the four costs ~0.2 s, and tests and
    tools run the CLI from Python hundreds of times); the config it resolves is the one the four-parser CLI gave
    (every section, the shared trainer config's defaults included), and an unknown subcommand still lists all four."""
    from grounding.cli import GroundingCLI, main

    built = []
    every = GroundingCLI.subcommands

    def recording(self):
        built.append(sorted(every(self)))
        return every(self)

    monkeypatch.setattr(GroundingCLI, "subcommands", recording)
    with pytest.raises(SystemExit):
        main(["test", "--config", str(REPO_ROOT / "experiments" / "composer" / "composer_world.yaml"), "--print_config"])
    assert built and all(names == ["test"] for names in built)
    config = yaml.safe_load(capsys.readouterr().out)
    assert {"model", "data", "trainer", "ckpt_path"} <= set(config)
    assert config["trainer"]["accelerator"] == yaml.safe_load(open(trainer_config_file()))["trainer"]["accelerator"]
    built.clear()
    with pytest.raises(SystemExit) as exit_info:
        main(["tset", "--config", "x.yaml"])
    assert exit_info.value.code == 2 and built[-1] == ["fit", "predict", "test", "validate"]
    assert "tset" in capsys.readouterr().err


def test_precision_policy():
    assert resolve_precision("16-mixed", "gpu") == "16-mixed"  # an explicit choice always wins
    assert resolve_precision(None, "cpu") == "32-true"
    import torch

    expected = "bf16-mixed" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "32-true"
    assert resolve_precision(None, "auto") == expected


def test_shared_trainer_config_has_the_policy():
    cfg = yaml.safe_load(open(trainer_config_file()))
    t = cfg["trainer"]
    assert (t["accelerator"], t["devices"], t["strategy"], t["precision"]) == ("auto", "auto", "auto", None)
    assert t["logger"]["class_path"] == "grounding.loggers.WandbLogger"
    assert any("LearningRateMonitor" in c["class_path"] for c in t["callbacks"])
    assert cfg["seed_everything"] == 0


@pytest.mark.parametrize("env, offline", [({}, True), ({"WANDB_MODE": "online"}, False)])
def test_wandb_logger_is_offline_unless_wandb_mode_says_otherwise(monkeypatch, tmp_path, env, offline):
    from grounding.loggers import WandbLogger

    monkeypatch.delenv("WANDB_MODE", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert WandbLogger(save_dir=str(tmp_path))._offline is offline


def test_data_follows_the_models_network(monkeypatch):
    """The tokenizer, crop size and image normalisation are written once, in the model's net (links)."""
    from lightning.pytorch import LightningDataModule, LightningModule

    from grounding.cli import GroundingCLI

    net = "--model.init_args.net.init_args"
    cli = GroundingCLI(LightningModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
                       auto_configure_optimizers=False, run=False,
                       args=["--config", str(REPO_ROOT / "experiments" / "vgbert" / "stage1_tiny.yaml"),
                             f"{net}.text_encoder=tiny-random", f"{net}.visual_heads=4", f"{net}.backbone=tiny_cnn",
                             f"{net}.backbone_weights=null", f"{net}.image_size=64", "--trainer.logger=false"])
    dm = cli.datamodule
    assert (dm.text_encoder, dm.image_size) == ("tiny-random", 64)
    assert tuple(dm.mean) == cli.model.model.visual.backbone.mean == (0.485, 0.456, 0.406)  # tiny_cnn: ImageNet's
    assert cli.model.hparams.net["init_args"]["text_encoder"] == "tiny-random"


def test_no_logger_drops_the_learning_rate_monitor(tmp_path):
    """`--trainer.logger false`: the shared trainer config's LearningRateMonitor (which refuses a trainer without a
    logger) is dropped, so the fit runs; with the default logger it stays."""
    from lightning.pytorch import LightningDataModule, LightningModule

    from grounding.cli import GroundingCLI, trainer_config_file

    net = "--model.init_args.net.init_args"

    def monitors(*extra):
        cli = GroundingCLI(LightningModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
                           auto_configure_optimizers=False, run=False,
                           args=["--config", trainer_config_file(),
                                 "--config", str(REPO_ROOT / "experiments" / "vgbert" / "stage1_tiny.yaml"),
                                 f"{net}.text_encoder=tiny-random", f"{net}.visual_heads=4", f"{net}.backbone=tiny_cnn",
                                 f"{net}.backbone_weights=null", f"--trainer.default_root_dir={tmp_path}", *extra])
        return [type(c).__name__ for c in cli.trainer.callbacks if type(c).__name__ == "LearningRateMonitor"]

    assert monitors() == ["LearningRateMonitor"]
    assert monitors("--trainer.logger=false") == []


def test_backbone_normalisation_matches_the_built_backbones():
    from grounding.encoders import backbone_normalisation, load_visual_backbone

    for name in ("tiny_cnn", "efficientnet_lite0"):
        backbone = load_visual_backbone(name, weights=None)
        assert backbone_normalisation(name) == (backbone.mean, backbone.std)
    assert backbone_normalisation("efficientnet_lite0")[0] == (0.5, 0.5, 0.5)


def test_ckpt_path_last_resumes_and_best_or_last_test_the_runs_files(tiny_world, tmp_path, monkeypatch, capsys):
    """`fit --ckpt_path last` continues from <default_root_dir>/checkpoints/last.ckpt (Lightning alone restarts from
    epoch 0: the stages' checkpoint callbacks come after it resolves "last"); `test --ckpt_path last|best` tests
    the run's files, and stops with one line and exit 2 when there are none."""
    import contextlib
    import io
    import json

    import torch
    from run_helpers import tiny_stage1_config

    from grounding.cli import main
    from grounding.docs_tables import validate_record

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    config = tiny_stage1_config(tmp_path / "stage1.yaml", tiny_world, tmp_path / "run", limit_train_batches=2,
                                limit_val_batches=1)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"

    def run(*args):
        with contextlib.redirect_stdout(io.StringIO()):
            return main([args[0], "--config", str(config), *args[1:]])

    run("fit", "--trainer.max_epochs=1", "--ckpt_path=last")  # nothing to resume yet: a fresh fit, said so
    assert "starting a fresh fit" in capsys.readouterr().err
    assert torch.load(last, weights_only=True)["global_step"] == 2
    run("fit", "--trainer.max_epochs=2", "--ckpt_path=last")  # resumes after epoch 0: epoch 1 only
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["epoch"] == 1 and ckpt["global_step"] == 4
    # one more epoch, not two from scratch: the run's record holds both segments
    segments = json.loads((tmp_path / "run" / "fit_record.json").read_text())["segments"]
    assert [(seg["first_epoch"], seg["epochs"]) for seg in segments] == [(0, 1), (1, 1)]
    by_name = run("test", "--ckpt_path=last").trainer.callback_metrics["test/rsum"]
    record = tmp_path / "records" / "stage1_test.json"
    by_path = run("test", f"--ckpt_path={last}", f"--record={record}").trainer.callback_metrics["test/rsum"]
    assert float(by_name) == float(by_path)
    # --record: the metrics it wrote, as one row of a record (grounding/docs_tables.py) naming the config as given
    written = json.loads(record.read_text())
    validate_record(written, str(record))
    assert written["config"] == str(config) and written["rows"][0]["checkpoint"] == str(last)
    assert written["rows"][0]["rsum"] == pytest.approx(float(by_path)) and "rsum" in written["columns"]
    assert written["rows"][0] == {"run": str(tmp_path / "run"), "checkpoint": str(last), **{
        k.split("/", 1)[1]: v for k, v in json.loads((tmp_path / "run" / "metrics.test.json").read_text()).items()}}
    assert run("test", "--ckpt_path=best").trainer.callback_metrics["test/rsum"] is not None
    with pytest.raises(SystemExit) as exit_info:
        run("test", "--ckpt_path=best", f"--trainer.default_root_dir={tmp_path / 'empty'}")
    assert exit_info.value.code == 2 and "no best-*.ckpt in" in capsys.readouterr().err


def test_evaluation_commands_fix_the_mmap_threshold(monkeypatch):
    """`python -m grounding test` fixes glibc's mmap threshold before anything runs (grounding.utils.memory); a
    user's MALLOC_MMAP_THRESHOLD_ wins; fit leaves the allocator as it is."""
    import grounding.cli as cli
    from grounding.utils import memory

    calls = []
    monkeypatch.setattr(cli, "fix_mmap_threshold", lambda: calls.append(True))
    monkeypatch.setattr(cli, "main", lambda args: None)
    cli.run_command(["test", "--config", "x.yaml"])
    cli.run_command(["fit", "--config", "x.yaml"])
    assert calls == [True]
    monkeypatch.setenv(memory.ENV, "65536")
    assert memory.fix_mmap_threshold() is False  # the user's setting stays
    monkeypatch.delenv(memory.ENV)
    import ctypes.util

    if ctypes.util.find_library("c") and "glibc" in " ".join(__import__("platform").libc_ver()).lower():
        assert memory.fix_mmap_threshold() is True


def test_an_evaluation_command_without_the_models_loop_is_one_line():
    """`test` on a stage with only fit / validate loops (Γ_t's SemCLIPAlignment) is a ConfigError naming the loops it
    has, not Lightning's MisconfigurationException traceback."""
    from types import SimpleNamespace

    from lightning.pytorch import LightningModule

    from grounding.cli import GroundingCLI
    from grounding.stage_config import ConfigError

    class FitAndValidateOnly(LightningModule):
        def training_step(self, batch, batch_idx):
            return None

        def validation_step(self, batch, batch_idx):
            return None

    cli = SimpleNamespace(subcommand="test", model=FitAndValidateOnly(), config={"test": {}, "validate": {}})
    with pytest.raises(ConfigError, match=r"FitAndValidateOnly has no test loop \(no test_step\); its commands are "
                                          r"fit / validate$"):
        GroundingCLI.after_instantiate_classes(cli)
    cli.subcommand = "validate"
    GroundingCLI.after_instantiate_classes(cli)  # it has that one

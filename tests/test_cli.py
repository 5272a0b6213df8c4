"""The LightningCLI entry point and the shared trainer configuration."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from grounding.cli import resolve_precision, trainer_config_file
from grounding.paths import REPO_ROOT


def test_help_lists_the_four_subcommands():
    out = subprocess.run([sys.executable, "-m", "grounding", "--help"], capture_output=True, text=True,
                         cwd=REPO_ROOT, check=True).stdout
    for sub in ("fit", "validate", "test", "predict"):
        assert f"    {sub} " in out, out


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


def test_backbone_normalisation_matches_the_built_backbones():
    from grounding.encoders import backbone_normalisation, load_visual_backbone

    for name in ("tiny_cnn", "efficientnet_lite0"):
        backbone = load_visual_backbone(name, weights=None)
        assert backbone_normalisation(name) == (backbone.mean, backbone.std)
    assert backbone_normalisation("efficientnet_lite0")[0] == (0.5, 0.5, 0.5)

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

"""A fit killed mid-epoch (SIGKILL: no cleanup at all) resumes with `--ckpt_path last` and ends where an
uninterrupted run of the same seed ends: the same weights and the same test metrics. Twice: from the last epoch's
end, and from a mid-epoch last.ckpt (`--checkpoint_every_minutes`), which goes on with the epoch's next batch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch import Callback
from run_helpers import tiny_stage1_config

from grounding.paths import REPO_ROOT

KILL_EPOCH, KILL_BATCH, EPOCHS, BATCHES = 1, 2, 3, 4


class KillMidEpoch(Callback):
    """SIGKILLs its own process at a given (epoch, batch) of training: a crash with no cleanup."""

    def __init__(self, epoch: int, batch: int):
        self.epoch, self.batch = epoch, batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.current_epoch == self.epoch and batch_idx == self.batch:
            os.kill(os.getpid(), signal.SIGKILL)


def _fit(config: Path, root: Path, env: dict, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grounding", "fit", "--config", str(config),
                           f"--trainer.default_root_dir={root}", *extra],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("mid_epoch_saves", [False, True], ids=["from-epoch-end", "from-mid-epoch"])
def test_sigkill_mid_epoch_then_resume_matches_an_uninterrupted_run(tiny_world, tmp_path, mid_epoch_saves):
    # no dropout: Lightning does not restore the global RNG, so masks after a resume would differ
    config = tiny_stage1_config(tmp_path / "stage1.yaml", tiny_world, net={"dropout": 0.0, "attention_dropout": 0.0},
                                max_epochs=EPOCHS, limit_train_batches=BATCHES, limit_val_batches=2)
    env = {**os.environ, "GROUNDING_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    straight, killed = tmp_path / "straight", tmp_path / "killed"

    done = _fit(config, straight, env)
    assert done.returncode == 0, done.stderr[-2000:]

    kill = yaml.safe_dump({"trainer": {"callbacks": [{"class_path": "test_resume_kill.KillMidEpoch",
                                                      "init_args": {"epoch": KILL_EPOCH, "batch": KILL_BATCH}}]}})
    # every batch (a minute's billionth): last.ckpt after the batch before the kill
    every = ["--checkpoint_every_minutes", "1e-9"] if mid_epoch_saves else ["--checkpoint_every_minutes", "0"]
    crashed = _fit(config, killed, env, "--config", kill, *every)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    last = torch.load(killed / "checkpoints" / "last.ckpt", weights_only=True)
    if mid_epoch_saves:  # saved inside the killed epoch, with the loader's position
        assert (last["epoch"], last["global_step"]) == (KILL_EPOCH, KILL_EPOCH * BATCHES + KILL_BATCH)
        assert last["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"epoch": KILL_EPOCH, "batches": KILL_BATCH}]
        record = json.loads((killed / "fit_record.json").read_text())
        assert (record["epochs"], record["steps"]) == (KILL_EPOCH, KILL_EPOCH * BATCHES + KILL_BATCH)
    else:
        assert last["epoch"] == KILL_EPOCH - 1  # the last finished epoch
    assert (killed / ".lock").is_file()  # the killed run could not release its folder

    resumed = _fit(config, killed, env, "--ckpt_path", "last", *every)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "not resumable" not in resumed.stderr  # Lightning's warning for a loader that cannot go on mid-epoch
    assert "the run that held it is gone" in resumed.stderr  # its stale lock was taken over

    a, b = (torch.load(d / "checkpoints" / "last.ckpt", weights_only=True) for d in (straight, killed))
    assert a["epoch"] == b["epoch"] == EPOCHS - 1 and a["global_step"] == b["global_step"]
    for key, value in a["state_dict"].items():
        assert torch.allclose(value, b["state_dict"][key], atol=1e-6), key
    test = [subprocess.run([sys.executable, "-m", "grounding", "test", "--config", str(config),
                            f"--trainer.default_root_dir={d}", "--ckpt_path", "last"],
                           cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900) for d in (straight, killed)]
    assert all(t.returncode == 0 for t in test), test[1].stderr[-2000:]
    metrics = [yaml.safe_load((d / "metrics.test.json").read_text()) for d in (straight, killed)]
    assert metrics[0]["test/rsum"] == pytest.approx(metrics[1]["test/rsum"], abs=1e-4)
    assert metrics[0] == pytest.approx(metrics[1], abs=1e-4)

"""What a run prints for batch jobs (grounding/lightning.py): one line per training epoch when stdout is not a
terminal or the bar is off, the best checkpoint and its score at the end of a fit, and test/validate tables
with values rounded for display only: the metrics themselves are never rounded."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from grounding.lightning import GroundingModule, display_number, results_table, scalar_metrics

# float32 values whose Python floats carry noise: 60.0000038 -> 60.000003814697266, 245.63 -> 245.6300048828125
NOISY_60 = torch.tensor(60.0000038).item()
NOISY_245 = torch.tensor(245.63).item()


class Logs(GroundingModule):
    """Logs known values: ``train/loss`` per step only (1, 2, 4 plus 10 per epoch), ``train/accuracy`` per
    epoch only (0.5), ``train/both`` per step and per epoch (the batch index), ``val/score`` per epoch
    (60.0000038 then 245.63: the second epoch is the best) and ``test/score`` (60.0000038)."""

    monitor = "val/score"
    monitor_mode = "max"

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))

    def training_step(self, batch, batch_idx):
        self.log("train/loss", torch.tensor([1.0, 2.0, 4.0][batch_idx] + 10 * self.current_epoch))
        self.log("train/accuracy", 0.5, on_step=False, on_epoch=True)
        self.log("train/both", float(batch_idx), on_step=True, on_epoch=True)
        return (self.w * batch[0].mean()).sum() ** 2

    def validation_step(self, batch, batch_idx):
        self.log("val/score", torch.tensor([60.0000038, 245.63][min(self.current_epoch, 1)]))

    def test_step(self, batch, batch_idx):
        self.log("test/score", torch.tensor(60.0000038))


def _loader(batches: int = 3) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(2.0 * batches).reshape(-1, 1)), batch_size=2)


def _trainer(root: Path, **kw) -> Trainer:
    kw = {"max_epochs": 2, "enable_progress_bar": False, **kw}
    return Trainer(default_root_dir=str(root), accelerator="cpu", devices=1, logger=False, enable_model_summary=False,
                   num_sanity_val_steps=0, **kw)


def _lines(text: str, start: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(start)]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """One 2-epoch fit (3 training batches, 1 validation batch) with its printed output."""
    capture = pytest.MonkeyPatch()
    out = []
    capture.setattr(sys, "stdout", _Capture(out))
    try:
        module, trainer = Logs(), _trainer(tmp_path_factory.mktemp("fit"))
        trainer.fit(module, _loader(), _loader(1))
    finally:
        capture.undo()
    return module, trainer, "".join(out)


class _Capture:
    """A non-terminal stdout that keeps what is written (a module-scoped fixture cannot use capsys)."""

    def __init__(self, out: list[str]):
        self.out = out

    def write(self, text: str) -> int:
        self.out.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_display_number_rounds_for_display():
    assert display_number(NOISY_60) == "60"
    assert display_number(NOISY_245) == "245.6"
    assert display_number(1.23456) == "1.235"
    assert display_number(0.5) == "0.5"
    assert display_number(0.000123456) == "0.0001235"
    assert display_number(0.0000123456) == "1.235e-05"
    assert display_number(12345.6) == "12346"  # whole numbers from 10,000 up, never an exponent
    assert display_number(9999.7) == "10000"
    assert display_number(-0.00001) == "-1e-05"
    assert display_number(torch.tensor(-0.0)) == "0"
    assert display_number(float("nan")) == "nan"


def test_an_epoch_line_per_training_epoch(fitted):
    _, _, text = fitted
    lines = _lines(text, "epoch ")
    assert len(lines) == 2, text
    # train/loss: logged per step only -> its mean over the epoch's 3 steps: (1+2+4)/3, (11+12+14)/3;
    # train/both: Lightning's epoch mean of 0, 1, 2 (its _step/_epoch twins are not shown); sorted by name
    assert re.fullmatch(r"epoch 1/2  train/accuracy 0\.5  train/both 1  train/loss 2\.333  val/score 60  \(\d+(\.\d)? s\)",
                        lines[0]), lines[0]
    assert re.fullmatch(r"epoch 2/2  train/accuracy 0\.5  train/both 1  train/loss 12\.33  val/score 245\.6  \(\d+(\.\d)? s\)",
                        lines[1]), lines[1]


def test_end_of_fit_line_names_the_best_checkpoint_and_its_score(fitted):
    _, trainer, text = fitted
    [line] = _lines(text, "best checkpoint: ")
    match = re.fullmatch(r"best checkpoint: (\S+) \(val/score (\S+), epoch 2\); last: (\S+)", line)
    assert match, line
    best = next(cb for cb in trainer.checkpoint_callbacks if cb.monitor == "val/score")
    assert match[1] == best.best_model_path and Path(match[1]).is_file()
    assert match[2] == display_number(best.best_model_score) == "245.6"
    assert Path(match[3]).name == "last.ckpt" and Path(match[3]).is_file()
    assert text.rstrip().endswith(line)  # the fit's last line


def test_display_never_rounds_the_metrics(fitted):
    _, trainer, _ = fitted
    metrics = trainer.callback_metrics
    assert metrics["val/score"].item() == NOISY_245  # the float32 value, not 245.6
    assert metrics["train/loss"].item() == 14.0  # Lightning's last step value, not the printed mean
    best = next(cb for cb in trainer.checkpoint_callbacks if cb.monitor == "val/score")
    assert best.best_model_score.item() == NOISY_245


def test_test_table_is_rounded_and_lightnings_is_not_printed(fitted, capsys):
    module, trainer, _ = fitted
    trainer.test(module, _loader(1), verbose=True)
    out = capsys.readouterr().out
    assert "60.000003814697266" not in out and "60.0000" not in out
    assert "Test metric" not in out  # Lightning's own table
    assert re.search(r"^test metric\s+DataLoader 0\n-+\s+-+\ntest/score\s+60$", out, re.M), out
    assert trainer.callback_metrics["test/score"].item() == NOISY_60  # the value itself is untouched


def test_verbose_false_prints_no_table(fitted, capsys):
    module, trainer, _ = fitted
    trainer.validate(module, _loader(1), verbose=False)
    assert "metric" not in capsys.readouterr().out
    trainer.validate(module, _loader(1), verbose=True)  # and the next call with verbose prints ours again
    assert re.search(r"^validate metric\s+DataLoader 0\n-+\s+-+\nval/score\s+\S+$", capsys.readouterr().out, re.M)


def test_no_epoch_lines_on_a_terminal_with_the_bar_on(tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    _trainer(tmp_path, enable_progress_bar=True, max_epochs=1).fit(Logs(), _loader(), _loader(1))
    out = capfd.readouterr().out
    assert not re.search(r"epoch \d+/\d+  ", out)  # the bar shows the epochs (its own header is "Epoch 0/0")
    assert "best checkpoint: " in out  # always printed (the Rich console wraps it at the terminal's width)


class LowerIsBetter(Logs):
    monitor_mode = "min"  # the first epoch's 60 stays the best


def test_a_resumed_fit_names_the_epoch_of_a_best_from_before_the_resume(tmp_path, capsys):
    _trainer(tmp_path, max_epochs=1).fit(LowerIsBetter(), _loader(), _loader(1))
    capsys.readouterr()
    last = tmp_path / "checkpoints" / "last.ckpt"
    _trainer(tmp_path, max_epochs=2).fit(LowerIsBetter(), _loader(), _loader(1), ckpt_path=str(last))
    out = capsys.readouterr().out
    assert [line.split("  ")[0] for line in _lines(out, "epoch ")] == ["epoch 2/2"]
    [line] = _lines(out, "best checkpoint: ")
    assert re.fullmatch(r"best checkpoint: \S+best-epoch000-step3\.ckpt \(val/score 60, epoch 1\); last: \S+", line), line


def test_without_a_monitored_score_the_line_names_the_last_checkpoint(tmp_path, capsys):
    _trainer(tmp_path, max_epochs=1, limit_val_batches=0).fit(Logs(), _loader())
    [line] = _lines(capsys.readouterr().out, "best checkpoint: ")
    assert re.fullmatch(r"best checkpoint: none \(val/score was never logged\); last: \S+last\.ckpt", line), line


def test_fast_dev_run_prints_no_checkpoint_line(tmp_path, capsys):
    _trainer(tmp_path, fast_dev_run=1).fit(Logs(), _loader(), _loader(1))
    out = capsys.readouterr().out
    assert "checkpoint" not in out
    assert len(_lines(out, "epoch 1/1")) == 1


def test_scalar_metrics_and_results_table():
    metrics = {"a/x": torch.tensor(NOISY_60), "a/x_epoch": torch.tensor(NOISY_60), "a/y_step": torch.tensor(1.0),
               "a/y": torch.tensor(2.0), "a/map": torch.ones(3), "b/z/dataloader_idx_1": torch.tensor(0.123456),
               "b/z/dataloader_idx_0": torch.tensor(12345.6), "b/z_epoch/dataloader_idx_0": torch.tensor(12345.6)}
    assert list(scalar_metrics(metrics)) == ["a/x", "a/y", "b/z/dataloader_idx_0", "b/z/dataloader_idx_1"]
    assert results_table(metrics, "test").splitlines() == [
        "test metric   DataLoader 0   DataLoader 1",
        "-----------   ------------   ------------",
        "a/x                     60",
        "a/y                      2",
        "b/z                  12346         0.1235",
    ]
    assert results_table({}, "test") == ""

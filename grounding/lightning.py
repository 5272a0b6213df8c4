"""The one base class every stage's LightningModule derives from.

It holds what is the same for all stages: optimizer/scheduler injection from the config
(``optimizer`` / ``lr_scheduler`` callables, jsonargparse's dependency-injection pattern), an
optimizer over trainable parameters only, and checkpointing by the stage's own monitored metric
(``monitor`` / ``monitor_mode`` class attributes) and ``last.ckpt`` for ``--ckpt_path last`` resumes,
and the frozen-backbone feature cache as a callback for stages that set ``feature_cache`` and
implement ``frozen_backbone()``.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable

import torch
from lightning.pytorch import Callback, LightningModule
from lightning.pytorch.callbacks import ModelCheckpoint

from grounding.feature_cache import FeatureCache
from grounding.nets import as_net, net_spec
from grounding.utils.io import atomic_write_json

FIT_RECORD = "fit_record.json"

OptimizerCallable = Callable[[Iterable], torch.optim.Optimizer]
LRSchedulerCallable = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


def default_optimizer(params: Iterable) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=1e-4)


class GroundingModule(LightningModule):
    """Base LightningModule: subclasses set ``monitor``/``monitor_mode`` and call
    ``super().__init__(optimizer, lr_scheduler)``; the maths lives in plain nn.Modules, injected as
    ``net`` (see :mod:`grounding.nets`) and kept with :meth:`adopt_net`."""

    monitor: str = "val/loss"
    monitor_mode: str = "min"
    # Stages with a frozen CNN take these as init args and implement ``frozen_backbone()``.
    feature_cache: bool = False
    feature_cache_dir: str | None = None

    def __init__(self, optimizer: OptimizerCallable = default_optimizer,
                 lr_scheduler: LRSchedulerCallable | None = None):
        super().__init__()
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler

    def adopt_net(self, net):
        """The stage's injected network (built, or its spec when a checkpoint is reloaded outside the
        CLI); its spec goes into the hyperparameters so the checkpoint can rebuild it."""
        net = as_net(net)
        self.hparams["net"] = net_spec(net)
        return net

    def trainable_parameters(self):
        return [p for p in self.parameters() if p.requires_grad]

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.trainable_parameters())
        if self.lr_scheduler_factory is None:
            return optimizer
        scheduler = self.lr_scheduler_factory(optimizer)
        interval = getattr(scheduler, "interval", "epoch")  # per-step schedules (warm-up) say so
        if hasattr(scheduler, "set_steps_per_epoch") and self._trainer is not None:
            epochs = max(int(self.trainer.max_epochs or 1), 1)
            scheduler.set_steps_per_epoch(int(self.trainer.estimated_stepping_batches) // epochs)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": interval}}

    def configure_callbacks(self):
        # Replaces the trainer config's ModelCheckpoint, in <default_root_dir>/checkpoints so the next
        # stage's config can name the files: the best by this stage's metric, and last.ckpt rewritten
        # every epoch as the resume point (`--ckpt_path last`). Two callbacks, because Lightning's
        # save_last refreshes last.ckpt only when a new top-k file is written.
        dirpath = os.path.join(self.trainer.default_root_dir, "checkpoints")
        best = ModelCheckpoint(dirpath=dirpath, monitor=self.monitor, mode=self.monitor_mode, save_top_k=1,
                               filename="best-epoch{epoch:03d}-step{step}", auto_insert_metric_name=False)
        # save_on_train_epoch_end: every epoch, also those without a validation (check_val_every_n_epoch > 1)
        last = ModelCheckpoint(dirpath=dirpath, monitor=None, save_top_k=1, filename="last",
                               enable_version_counter=False, save_on_train_epoch_end=True)
        callbacks = [best, last, FitRecord()]
        return callbacks + ([FeatureCache(self.feature_cache_dir)] if self.feature_cache else [])


class FitRecord(Callback):
    """``<default_root_dir>/fit_record.json``: the wall time and epochs of the run's training, rewritten
    (atomically) after every training epoch. A resumed fit (``--ckpt_path``) continues the record: segments
    from the restored epoch on are dropped (a resume from an earlier checkpoint retrains them) and a new one
    added; a fresh fit starts a new record at its first epoch. The leaderboard reads it for its training-time
    column. Only global rank 0 writes."""

    def __init__(self):
        self.started: float | None = None
        self.segments: list[dict] = []

    def on_fit_start(self, trainer, pl_module) -> None:
        self.started = time.perf_counter()  # before the restore and the feature cache: all of the fit's time

    def on_train_start(self, trainer, pl_module) -> None:
        # after the checkpoint's restore: current_epoch is the epoch this segment starts at
        path = Path(trainer.default_root_dir) / FIT_RECORD
        first = int(trainer.current_epoch)
        self.segments = []
        if trainer.ckpt_path and path.is_file():
            try:
                old = json.loads(path.read_text(encoding="utf-8")).get("segments") or []
                self.segments = [_until_epoch(seg, first) for seg in old if int(seg.get("first_epoch", 0)) < first]
            except (OSError, ValueError, AttributeError, TypeError, KeyError):
                self.segments = []
        self.segments.append({"started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              "first_epoch": first, "seconds": 0.0, "epochs": 0})
        self._write(trainer)  # a fresh fit replaces an older run's record at once

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self.started is None or not self.segments or trainer.sanity_checking:
            return
        segment = self.segments[-1]
        segment.update(seconds=round(time.perf_counter() - self.started, 1), epochs=int(trainer.current_epoch) + 1
                       - segment["first_epoch"], last_epoch=int(trainer.current_epoch), steps=int(trainer.global_step))
        self._write(trainer)

    def _write(self, trainer) -> None:
        if not trainer.is_global_zero or trainer.fast_dev_run:
            return
        atomic_write_json(Path(trainer.default_root_dir) / FIT_RECORD, {
            "seconds": round(sum(s["seconds"] for s in self.segments), 1),
            "epochs": sum(int(s.get("epochs", 0)) for s in self.segments), "steps": int(trainer.global_step),
            "devices": int(trainer.num_devices), "segments": self.segments}, indent=2)


def _until_epoch(segment: dict, epoch: int) -> dict:
    """A recorded training segment cut before ``epoch`` (a resume from an earlier checkpoint retrains the rest):
    its epochs and, in proportion, its seconds."""
    done = int(segment.get("epochs", 0))
    keep = min(done, epoch - int(segment["first_epoch"]))
    if keep >= done:
        return segment
    return dict(segment, epochs=keep, last_epoch=epoch - 1, seconds=round(float(segment["seconds"]) * keep / max(done, 1), 1))

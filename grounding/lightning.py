"""The one base class every stage's LightningModule derives from.

It holds what is the same for all stages: optimizer/scheduler injection from the config
(``optimizer`` / ``lr_scheduler`` callables, jsonargparse's dependency-injection pattern), an
optimizer over trainable parameters only, and checkpointing by the stage's own monitored metric
(``monitor`` / ``monitor_mode`` class attributes) and ``last.ckpt`` for ``--ckpt_path last`` resumes,
and the frozen-backbone feature cache as a callback for stages that set ``feature_cache`` and
implement ``frozen_backbone()``.
"""

from __future__ import annotations

import os
from typing import Callable, Iterable

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.callbacks import ModelCheckpoint

from grounding.feature_cache import FeatureCache
from grounding.nets import as_net, net_spec

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
        last = ModelCheckpoint(dirpath=dirpath, monitor=None, save_top_k=1, filename="last",
                               enable_version_counter=False)
        return [best, last] + ([FeatureCache(self.feature_cache_dir)] if self.feature_cache else [])

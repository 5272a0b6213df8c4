"""Learning-rate schedules the papers use that torch does not ship as one class.

:class:`WarmupStepDecay` — ViLBERT's fine-tuning schedule as COMPOSER states it (App. D): linear warm-up
from 0 over the first epochs, then a step decay at milestone epochs. It steps every optimizer step;
:class:`grounding.lightning.GroundingModule` tells it the number of steps an epoch has.
"""

from __future__ import annotations

from typing import Sequence

import torch


class WarmupStepDecay(torch.optim.lr_scheduler.LambdaLR):
    """lr × (e / warmup_epochs) during warm-up, then lr × gamma^(milestones passed), e = fractional epoch."""

    interval = "step"

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_epochs: float = 2.0, milestones: Sequence[int] = (10, 15),
                 gamma: float = 0.1, steps_per_epoch: int = 1):
        self.warmup_epochs, self.milestones, self.gamma = float(warmup_epochs), tuple(milestones), gamma
        self.steps_per_epoch = max(int(steps_per_epoch), 1)
        super().__init__(optimizer, self.factor)

    def set_steps_per_epoch(self, steps: int) -> None:
        self.steps_per_epoch = max(int(steps), 1)

    def factor(self, step: int) -> float:
        epoch = step / self.steps_per_epoch
        if epoch < self.warmup_epochs:
            return epoch / self.warmup_epochs
        return self.gamma ** sum(epoch >= m for m in self.milestones)

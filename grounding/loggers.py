"""Logger defaults shared by every stage."""

from __future__ import annotations

import os

from lightning.pytorch.loggers import CSVLogger as _CSVLogger
from lightning.pytorch.loggers import WandbLogger as _WandbLogger


class WandbLogger(_WandbLogger):
    """Lightning's WandbLogger, offline unless ``WANDB_MODE`` says otherwise.

    Researchers run on machines without network as often as with it: offline runs land in
    ``save_dir/wandb`` and can be pushed later with ``wandb sync``. Set ``WANDB_MODE=online`` (or
    ``disabled``) to change it; an explicit ``offline`` argument wins over both.
    """

    def __init__(self, project: str = "grounding", save_dir: str | None = None, offline: bool | None = None, **kwargs):
        if offline is None:
            offline = "WANDB_MODE" not in os.environ  # wandb itself honours WANDB_MODE when it is set
        save_dir = save_dir or "outputs"
        os.makedirs(save_dir, exist_ok=True)
        super().__init__(project=project, save_dir=save_dir, offline=offline, **kwargs)


class CSVLogger(_CSVLogger):
    """Lightning's CSVLogger whose ``save_dir`` may be left to the trainer's ``default_root_dir``."""

    def __init__(self, save_dir: str | None = None, name: str = "csv", **kwargs):
        super().__init__(save_dir=save_dir or "outputs", name=name, **kwargs)

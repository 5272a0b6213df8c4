"""``python -m grounding {fit,validate,test,predict} --config experiments/<stage>/<name>.yaml``.

A LightningCLI over every LightningModule and DataModule of the suite (selectable by class name).
The shared trainer setup in ``experiments/trainer/default.yaml`` is loaded before the stage
config, so every stage trains with the same accelerator/DDP/precision/checkpoint/logging policy
and a stage config holds only what is specific to it.
"""

from __future__ import annotations

import importlib
import os
import sys

from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

from grounding.encoders import backbone_normalisation
from grounding.paths import EXPERIMENTS_DIR

# Packages whose LightningModules / DataModules the CLI can select by class name.
STAGE_PACKAGES = tuple(p for p in os.environ.get("GROUNDING_STAGE_PACKAGES",
                                                 "data_modules,grounding.vgbert,grounding.semclip").split(",") if p)
SUBCOMMANDS = ("fit", "validate", "test", "predict")


def trainer_config_file() -> str:
    """The shared trainer config: ``$GROUNDING_TRAINER_CONFIG`` or ``experiments/trainer/default.yaml``."""
    return os.environ.get("GROUNDING_TRAINER_CONFIG", str(EXPERIMENTS_DIR / "trainer" / "default.yaml"))


def backbone_mean(backbone: str) -> tuple[float, ...]:
    return backbone_normalisation(backbone)[0]


def backbone_std(backbone: str) -> tuple[float, ...]:
    return backbone_normalisation(backbone)[1]


def resolve_precision(precision, accelerator) -> str:
    """``null`` precision means: bf16-mixed on a bf16-capable GPU, full 32-bit otherwise."""
    if precision is not None:
        return precision
    import torch

    on_gpu = accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
    return "bf16-mixed" if on_gpu and torch.cuda.is_bf16_supported() else "32-true"


class GroundingCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        # Values the model and the data must share are written once, in the model's network: the
        # tokenizer is the text encoder's, the crop size the visual stream's, the image normalisation
        # the backbone's. (Stages that build their network from a checkpoint still give them twice.)
        net = "model.init_args.net.init_args"
        parser.link_arguments(f"{net}.text_encoder", "data.init_args.text_encoder")
        parser.link_arguments(f"{net}.image_size", "data.init_args.image_size")
        parser.link_arguments(f"{net}.backbone", "data.init_args.mean", compute_fn=backbone_mean)
        parser.link_arguments(f"{net}.backbone", "data.init_args.std", compute_fn=backbone_std)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        trainer = config.trainer
        trainer.precision = resolve_precision(trainer.precision, trainer.accelerator)
        # Loggers without a save_dir write beside the checkpoints, under the stage's default_root_dir.
        loggers = trainer.logger if isinstance(trainer.logger, list) else [trainer.logger]
        for logger in loggers:
            init_args = getattr(logger, "init_args", None)
            if init_args is not None and "save_dir" in init_args and init_args.save_dir is None:
                init_args.save_dir = trainer.default_root_dir or "outputs"


def main(args=None) -> GroundingCLI:
    for package in STAGE_PACKAGES:
        module = importlib.import_module(package)
        for sub in getattr(module, "DATAMODULE_MODULES", ()):  # lazy packages: import the class modules
            importlib.import_module(f"{package}.{sub}")
    defaults = [trainer_config_file()] if os.path.isfile(trainer_config_file()) else []
    return GroundingCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        auto_configure_optimizers=False,  # each stage's optimizer is injected through its init args
        parser_kwargs={cmd: {"default_config_files": defaults} for cmd in SUBCOMMANDS},
        save_config_kwargs={"overwrite": True},
        args=args,
    )


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])

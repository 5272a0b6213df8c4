"""``python -m grounding {fit,validate,test,predict} --config experiments/<stage>/<name>.yaml``.

A LightningCLI over every LightningModule and DataModule of the suite (selectable by class name).
The shared trainer setup in ``experiments/trainer/default.yaml`` is loaded before the stage
config, so every stage trains with the same accelerator/DDP/precision/checkpoint/logging policy
and a stage config holds only what is specific to it. A stage config may name another as its
``base:`` (a path relative to it): the base is loaded first and the config holds only what differs,
so a tiny config is the paper config plus overrides.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Optional, Sequence

import torch
import yaml
from jsonargparse import ArgumentParser
from jsonargparse._common import debug_mode_active
from jsonargparse.typing import NonNegativeFloat
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.rank_zero import rank_zero_only

# The stages the CLI selects by class name (``--model GroundingPretrain``, ``--data FlickrDataModule``) must be imported
# for jsonargparse to find them; COMPOSER's are named by full class path in its configs. Imported here, explicitly: the
# CLI is the top floor (tests/test_architecture.py), above every package it runs.
import data_modules.coco  # noqa: F401, I001 - registers the DataModules
import data_modules.flickr  # noqa: F401
import data_modules.glue  # noqa: F401
import data_modules.image_folder  # noqa: F401
import data_modules.similarity_lists  # noqa: F401
import data_modules.visual_genome  # noqa: F401
import grounding.semclip  # noqa: F401 - registers the STE and alignment stages
import grounding.vgbert  # noqa: F401 - registers VG-BERT's stages
from grounding.checkpoints import check_stage_checkpoint, checkpoint_class, load_checkpoint_file, require_checkpoint_file
from grounding.docs_tables import DocsTableError, provenance, record_option, record_path, write_record
from grounding.encoders import backbone_normalisation
from grounding.errors import EXIT_BAD_INPUT, UserInputError, at_most_three_lines, user_errors_exit
from grounding.nets import class_of, moved_options, regrouped_spec
from grounding.paths import EXPERIMENTS_DIR
from grounding.renamed_options import check_renamed_options
from grounding.run_folder import (
    RunFolderError,
    RunLock,
    best_checkpoint,
    check_evaluation_target,
    check_fit_target,
    check_writable_folder,
    config_differences,
    flatten_config,
    moved_checkpoint,
    write_run_config,
    write_run_metrics,
)
from grounding.stage_config import (
    ConfigError,
    expand_config_bases,
    nested_nulls_as_config,
)
from grounding.training_images import EVAL_SPLITS, check_evaluation, checkpoint_entries, init_checkpoints
from grounding.utils.memory import fix_mmap_threshold

SUBCOMMANDS = ("fit", "validate", "test", "predict")


def trainer_config_file() -> str:
    """The shared trainer config: ``$GROUNDING_TRAINER_CONFIG`` or ``experiments/trainer/default.yaml``."""
    return os.environ.get("GROUNDING_TRAINER_CONFIG", str(EXPERIMENTS_DIR / "trainer" / "default.yaml"))


def backbone_mean(backbone: str) -> tuple[float, ...]:
    return backbone_normalisation(backbone)[0]


def backbone_std(backbone: str) -> tuple[float, ...]:
    return backbone_normalisation(backbone)[1]


def weights_unless_init_from(init_from: str | None) -> str | None:
    return None if init_from else "default"


def resolve_precision(precision, accelerator) -> str:
    """``null`` precision means: bf16-mixed on a bf16-capable GPU, full 32-bit otherwise."""
    if precision is not None:
        return precision
    import torch

    on_gpu = accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
    return "bf16-mixed" if on_gpu and torch.cuda.is_bf16_supported() else "32-true"


class RunConfigCallback(SaveConfigCallback):
    """The run's record in its folder (``trainer.default_root_dir``, where the checkpoints are, whatever the
    logger; grounding.run_folder), atomic, rank 0: a fit's ``config.yaml`` comes with its first checkpoint, and
    test / validate / predict write ``config.<command>.yaml`` and ``metrics.<command>.json`` together when they
    end, so a run that fails part-way leaves the folder's earlier record as it was."""

    stage: str = "fit"

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.stage = getattr(stage, "value", stage)  # a TrainerFn (a str enum)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if not self.already_saved:
            self._write(trainer)

    def on_test_end(self, trainer, pl_module) -> None:
        self._write(trainer, "test")

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.state.fn == "validate":
            self._write(trainer, "validate")

    def on_predict_end(self, trainer, pl_module) -> None:
        self._write(trainer)

    def _write(self, trainer, metrics_of: str | None = None) -> None:
        if trainer.is_global_zero:
            root = trainer.default_root_dir
            write_run_config(root, self.stage, self.parser.dump(self.config, skip_none=False))
            if metrics_of is not None:
                metrics = write_run_metrics(root, metrics_of, dict(trainer.callback_metrics))
                if metrics_of in RECORDED_COMMANDS and self.config.get("record"):
                    write_metrics_record(self.config, metrics, root, getattr(self, "config_files", []))
        self.already_saved = True


RECORDED_COMMANDS = ("test", "validate")


def write_metrics_record(config, metrics_file: Path, root: str, configs: list[str]) -> Path:
    """``test`` / ``validate`` with ``--record NAME``: the metrics they wrote (``metrics.<command>.json``) as one row of a
    record (grounding/docs_tables.py): ``run`` (the run folder), ``checkpoint``, then each metric without its
    ``test/`` or ``val/`` prefix; provenance: this command line, ``configs`` (the ``--config`` files as given),
    ``seed_everything``."""
    import json

    metrics = json.loads(Path(metrics_file).read_text(encoding="utf-8"))
    columns = {name.split("/", 1)[-1]: name for name in metrics}
    row = {"run": str(root), "checkpoint": config.get("ckpt_path"), **{c: metrics[name] for c, name in columns.items()}}
    seed = config.get("seed_everything")
    keys = provenance(config=configs[0] if len(configs) == 1 else configs or None,
                      seeds=[seed] if isinstance(seed, int) and not isinstance(seed, bool) else None)
    path = write_record(record_path(config.get("record")), ["run", *columns], [row], keys,
                        title=f"{Path(metrics_file).stem.split('.')[-1]} metrics of {root}",
                        labels={"run": "run", **columns})
    print(f"wrote the record {path}")
    return path


EVALUATION_COMMANDS = ("test", "validate", "predict")
# each evaluation subcommand's LightningModule hook
EVALUATION_STEPS = {"validate": "validation_step", "test": "test_step", "predict": "predict_step"}


# the classes whose arguments moved into option groups (grounding/nets.py): a config or flag with an old name gets a hint
GROUPED_CLASSES = ("grounding.composer.model.Composer", "grounding.vgbert.relational.VGBertRelational",
                   "data_modules.visual_genome.VisualGenomeDataModule", "grounding.composer.data.ComposerDataModule")
MOVED_HINT = "Fix: these options moved into option groups"


def moved_option_hint(message: str) -> str:
    """A ``Fix:`` line for a parse error that names an option which moved into an option group, else ''."""
    names = set(re.findall(r"Option '(\w+)' is not accepted", message))
    names |= set(re.findall(r"NestedArg\(key='(?:[\w.]*\.)?(\w+)'", message))
    hints = []
    for path in GROUPED_CLASSES:
        cls = class_of(path)
        moved = moved_options(cls) if cls is not None else {}
        hints += [f"{name} -> {moved[name]} ({cls.__name__})" for name in sorted(names) if name in moved]
    if not hints:
        return ""
    return f"\n{MOVED_HINT} (docs/configs.md, \"Option groups\"): " + "; ".join(hints)


class GroundingArgumentParser(LightningArgumentParser):
    def error(self, message: str, ex: Exception | None = None):
        # a subcommand's parser adds the hint too, and its message is nested in this one's: one hint, at the end
        message = re.sub(rf"\n[ \t]*{MOVED_HINT}[^\n]*", "", message)
        message += moved_option_hint(message)
        if not self.exit_on_error or debug_mode_active():  # a parse attempt inside jsonargparse, or its debug mode
            super().error(message, ex)
        # one message of at most three lines, not the 50-line usage: what, where, the fix (the usage is --help's)
        parser = getattr(ex, "subcommand_parser", None) or self
        prog = parser.prog.replace(" [options]", "")
        if "Fix:" not in message:
            message += f"\nFix: `{prog} --help` lists the options and their types"
        sys.stderr.write(at_most_three_lines(f"{prog}: error: {message}") + "\n")
        raise SystemExit(EXIT_BAD_INPUT)


class GroundingCLI(LightningCLI):
    run_lock: RunLock | None = None

    def __init__(self, *args, only_subcommand: str | None = None, **kwargs):
        # LightningCLI builds a parser for each of its four subcommands (~0.2 s each, every time a test or tool runs
        # one from Python); a command line that names its subcommand first needs only that one. Without it (--help,
        # a typo, no subcommand) all four are built, so help and errors list them.
        self.only_subcommand = only_subcommand
        try:
            super().__init__(*args, **kwargs)  # parses, builds and runs the subcommand
        finally:  # the run folder is free again, also after an error (and for the next run in this process)
            if self.run_lock is not None:
                self.run_lock.release()

    def subcommands(self) -> dict[str, set[str]]:
        every = LightningCLI.subcommands()
        return {self.only_subcommand: every[self.only_subcommand]} if self.only_subcommand in every else every

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--overwrite", type=bool, default=False,
                            help="fit: replace the run in --trainer.default_root_dir even when its config.yaml differs "
                                 "(with --ckpt_path: resume its weights under model/data values that differ, on purpose; the run's "
                                 "earlier records are moved to <root>/replaced/)")
        parser.add_argument("--allow_eval_overlap", type=bool, default=False,
                            help="evaluate even on images that a checkpoint of the init_from chain trained on (a "
                                 "warning instead of the error; grounding/training_images.py)")
        parser.add_argument("--record", type=Optional[str], default=None,
                            help="test / validate: also write the metrics as a record (grounding/docs_tables.py), "
                                 "docs/records/NAME.json or this path ending in .json: one row, the run folder, the "
                                 "checkpoint and each metric, with this command line, the configs, commit, date, machine")
        parser.add_argument("--checkpoint_every_minutes", type=NonNegativeFloat, default=15.0,
                            help="fit: also rewrite last.ckpt mid-epoch every this many minutes of training, with the "
                                 "training loader's position, so a long epoch killed resumes (--ckpt_path last) at "
                                 "its next batch; 0: at epoch ends only")
        # Values the model and the data must share are written once, in the model's network: the
        # tokenizer is the text encoder's, the crop size the visual stream's, the image normalisation
        # the backbone's. (Stages that build their network from a checkpoint still give them twice.)
        net = "model.init_args.net.init_args"
        parser.link_arguments(f"{net}.text_encoder", "data.init_args.text_encoder")
        parser.link_arguments(f"{net}.image_size", "data.init_args.transform.image_size")
        parser.link_arguments(f"{net}.backbone", "data.init_args.transform.mean", compute_fn=backbone_mean)
        parser.link_arguments(f"{net}.backbone", "data.init_args.transform.std", compute_fn=backbone_std)
        # A stage that starts from a checkpoint (init_from) takes its frozen CNN from it: no ImageNet file.
        parser.link_arguments("model.init_args.init_from", f"{net}.backbone_weights", compute_fn=weights_unless_init_from)
        # COMPOSER's hard negatives: the model's choice; the DataModule adds the pool's captions to each batch.
        parser.link_arguments("model.init_args.hard_negatives", "data.init_args.hard_negatives")
        # Stage 2's label sets are the DataModule's (its Visual Genome cleaning / mapping) and size the
        # network; jsonargparse skips these links for a DataModule without the attribute.
        for labels, size in (("relation_labels", "num_relations"), ("object_classes", "num_object_classes")):
            parser.link_arguments(f"data.{labels}", f"model.init_args.{labels}", compute_fn=list, apply_on="instantiate")
            parser.link_arguments(f"data.{labels}", f"{net}.{size}", compute_fn=len, apply_on="instantiate")
        # Stage 0's classes are the image folders' (ImageFolderDataModule.class_names) and size the classifier.
        parser.link_arguments("data.class_names", "model.init_args.class_names", compute_fn=list, apply_on="instantiate")
        parser.link_arguments("data.class_names", f"{net}.num_classes", compute_fn=len, apply_on="instantiate")
        # The STE's vocabulary is the similarity lists'; SemCLIP's Γ_t maps the pairs' VLM width to the STE's.
        parser.link_arguments("data.vocab", f"{net}.vocab_size", compute_fn=len, apply_on="instantiate")
        parser.link_arguments("data.vlm_dim", f"{net}.in_dim", apply_on="instantiate")
        parser.link_arguments("data.ste_dim", f"{net}.out_dim", apply_on="instantiate")

    def parse_arguments(self, parser, args) -> None:
        # A stage config's `base:` is loaded before it (see expand_config_bases).
        given = sys.argv[1:] if args is None else args
        # the config files as the user named them (a record's `config`), before their bases are expanded
        self.config_files = [a.split("=", 1)[1] if a.startswith("--config=") else b for a, b in zip(given, [*given[1:], ""])
                             if isinstance(a, str) and (a.startswith("--config=") or a == "--config")] \
            if isinstance(given, (list, tuple)) else []
        if args is None:
            sys.argv[1:] = nested_nulls_as_config(expand_config_bases(sys.argv[1:]))
        elif isinstance(args, (list, tuple)):
            args = nested_nulls_as_config(expand_config_bases(list(args)))
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if subcommand:  # before LightningCLI reads the checkpoint's hyperparameters
            section = self.config[subcommand]
            section.ckpt_path = resolve_run_checkpoint(section.get("ckpt_path"), section.trainer.default_root_dir,
                                                       subcommand)
            if section.ckpt_path is not None:
                require_checkpoint_file(section.ckpt_path, "--ckpt_path",
                                        "give a .ckpt file of the run (outputs/<run>/checkpoints/last.ckpt), or `last` / "
                                        "`best` with the run's --trainer.default_root_dir")
                load_checkpoint_file(section.ckpt_path, "--ckpt_path", mmap=True)  # plain data, or one line and exit 2
                model = section.get("model")
                check_checkpoint_class(section.ckpt_path, model.get("class_path") if model is not None else None)
                if subcommand in EVALUATION_COMMANDS:
                    check_evaluation_target(section.trainer.default_root_dir, section.ckpt_path, subcommand)

    def _parse_ckpt_path(self) -> None:
        # LightningCLI merges the checkpoint's hyperparameters into the config (its own version of this method, with
        # one step added): a network recorded before its options were grouped holds them flat, and is regrouped
        # first (grounding.nets.regrouped_spec), so checkpoints of either layout test, validate and resume.
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not ckpt_path or not Path(ckpt_path).is_file():
            return
        hparams = load_checkpoint_file(ckpt_path, "--ckpt_path", mmap=True).get("hyper_parameters", {})
        hparams.pop("_instantiator", None)
        if not hparams:
            return
        if isinstance(hparams.get("net"), dict):
            hparams["net"] = regrouped_spec(hparams["net"])
        if "_class_path" in hparams:
            hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
        try:
            merged = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)
        except SystemExit:
            sys.stderr.write("Parsing of ckpt_path hyperparameters failed!\n")
            raise
        shown = self._model_differences(subcommand, merged)
        if shown and subcommand == "fit" and self._given_model_values_win(ckpt_path, shown):
            return
        if shown:  # test / validate / predict: the checkpoint's network is the one evaluated; said, not silent
            print(f"{ckpt_path}: the checkpoint's model values are used where the config's differ: {shown}",
                  file=sys.stderr)
        self.config = merged

    def _model_differences(self, subcommand: str, merged) -> str:
        """The model values the checkpoint's hyperparameters change in the given config, as text ('' if none)."""
        def model_of(config) -> dict:
            dumped = yaml.safe_load(self.parser.dump(config, skip_none=False, skip_validation=True))
            return {"model": dumped.get(subcommand, dumped).get("model")}

        recorded, given = model_of(merged), model_of(self.config)
        diff = config_differences(recorded, given)
        flat_recorded, flat_given = flatten_config(recorded), flatten_config(given)
        shown = ", ".join(f"{k} ({flat_recorded[k]!r} in the checkpoint, {flat_given[k]!r} given)" for k in diff[:3])
        return shown + (f" and {len(diff) - 3} more" if len(diff) > 3 else "")

    def _given_model_values_win(self, ckpt_path: str, shown: str) -> bool:
        """A resume whose model values differ from the checkpoint's: refused (the run's later epochs would train
        another model than its first, and its records would name the checkpoint's values); with ``--overwrite
        true`` the given values win (the run's earlier records are moved aside by check_fit_target)."""
        if not self.config["fit"].get("overwrite"):
            raise RunFolderError(
                f"Resuming {ckpt_path} with model values that differ from the checkpoint's: {shown}.\n"
                "Fix: resume with the run's own values, fit into a new --trainer.default_root_dir, or pass --overwrite "
                "true to resume its weights under the given values (the run's earlier records are moved aside).")
        print(f"--overwrite: resuming {ckpt_path} under model values that differ from the checkpoint's: {shown}",
              file=sys.stderr)
        return True

    def after_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        step = EVALUATION_STEPS.get(self.subcommand)
        if step is not None and not is_overridden(step, self.model):  # Lightning's own error is a traceback
            loops = ["fit"] + [c for c in ("validate", "test") if is_overridden(EVALUATION_STEPS[c], self.model)]
            raise ConfigError(f"{type(self.model).__name__} has no {self.subcommand} loop (no {step}); its commands "
                              f"are {' / '.join(loops)}")
        if config.get("allow_eval_overlap") and hasattr(self.model, "allow_eval_overlap"):
            self.model.allow_eval_overlap = True  # read by grounding.training_images.TrainingImages
        if hasattr(self.model, "checkpoint_every_minutes"):
            self.model.checkpoint_every_minutes = float(config.get("checkpoint_every_minutes") or 0.0)  # LastCheckpoint
        for callback in getattr(getattr(self, "trainer", None), "callbacks", []):  # a record names the configs as given
            if isinstance(callback, RunConfigCallback):
                callback.config_files = list(getattr(self, "config_files", []))

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if self.subcommand:  # a command that will read the data (run=False only builds the objects)
            check_values(config)
            check_inputs_early(config, self.subcommand)
            check_record_option(config, self.subcommand)
        trainer = config.trainer
        trainer.precision = resolve_precision(trainer.precision, trainer.accelerator)
        if trainer.logger in (False, None) and isinstance(trainer.get("callbacks"), list):
            # Lightning's LearningRateMonitor refuses a trainer without a logger: `--trainer.logger false` drops it
            trainer.callbacks = [c for c in trainer.callbacks if not str(getattr(c, "class_path", "")).endswith(
                ".LearningRateMonitor")]
        # Loggers without a save_dir write beside the checkpoints, under the stage's default_root_dir.
        loggers = trainer.logger if isinstance(trainer.logger, list) else [trainer.logger]
        for logger in loggers:
            init_args = getattr(logger, "init_args", None)
            if init_args is not None and "save_dir" in init_args and init_args.save_dir is None:
                init_args.save_dir = trainer.default_root_dir or "outputs"
        # (after the settings above, so the config compared is the one config.yaml will hold)
        first_process = rank_zero_only.rank == 0 and os.environ.get("NODE_RANK", "0") == "0"
        if first_process and not config.trainer.get("fast_dev_run"):
            # fit / test / validate write into it: a file in the way or a read-only place is one line, exit 2
            check_writable_folder(config.trainer.default_root_dir or "outputs")
        if self.subcommand == "fit" and first_process and not config.trainer.get("fast_dev_run"):
            # the run folder: refused when another run owns it (grounding/run_folder.py); DDP ranks > 0 skip this
            root = config.trainer.default_root_dir or "outputs"
            dumped = yaml.safe_load(self.parser.dump(self.config, skip_none=False, skip_validation=True))
            moved = check_fit_target(root, dumped.get("fit", dumped), config.get("ckpt_path") is not None,
                                     bool(config.get("overwrite")))
            if moved is not None and config.get("ckpt_path"):  # resumed from where the run's checkpoints went
                config.ckpt_path = str(moved_checkpoint(config.ckpt_path, root, moved))
            self.run_lock = RunLock(root).acquire()


def check_record_option(config, subcommand: str) -> None:
    """``--record`` is for test / validate and names a record or a ``.json`` path that can be written
    (:func:`grounding.docs_tables.record_option`): else one line, before any data is read."""
    name = config.get("record")
    if not name:
        return
    if subcommand not in RECORDED_COMMANDS:
        raise ConfigError(f"--record {name}: only {' / '.join(RECORDED_COMMANDS)} write a record (their metrics); "
                          f"drop it from `{subcommand}`")
    try:
        record_option(name)
    except DocsTableError as e:
        raise ConfigError(str(e)) from None


def checkpoint_compatible(recorded: str, named: str) -> bool:
    """A checkpoint of class ``recorded`` may run under a config naming ``named``: the same class, or two classes of
    one declared ``checkpoint_family`` (COMPOSER and its baselines share their data and evaluation: Table 2's test
    configs are COMPOSER's and test any of them)."""
    if recorded == named:
        return True
    classes = [class_of(c) for c in (recorded, named)]
    if classes[0] is not None and classes[0] is classes[1]:  # one class under a renamed module's old path
        return True
    family = [getattr(c, "checkpoint_family", None) for c in classes]
    return family[0] is not None and family[0] == family[1]


def check_checkpoint_class(path: str | Path, named: str | None) -> None:
    """``--ckpt_path`` of another model is refused (LightningCLI would swap in the checkpoint's class and write its
    numbers into this run's folder): one :class:`ConfigError` naming both classes."""
    recorded = checkpoint_class(path)
    if recorded is None or named is None or checkpoint_compatible(recorded, named):
        return
    raise ConfigError(f"--ckpt_path {path} is a checkpoint of {recorded}, but the config names {named}; give a "
                      f"checkpoint of {named.rpartition('.')[2]} (or the config {recorded.rpartition('.')[2]} was "
                      "trained with)")


def checkpoint_options(module_class) -> dict[str, tuple[str, tuple[str, ...]] | None]:
    """The model's options naming a checkpoint to start from, each with (stage name, weight prefixes it must hold)
    or None: ``init_from`` always; the class attribute ``init_from_checkpoint`` is that pair for ``init_from``, or a
    dict of option -> pair (GroundingPretrain's ``visual_init_from``: a stage-0 checkpoint)."""
    declared = getattr(module_class, "init_from_checkpoint", None)
    return {"init_from": None, **(declared if isinstance(declared, dict) else {"init_from": declared})}


# Option values refused when parsed, before anything is built: key name -> (the test, what is expected). A key is
# matched by its last name anywhere under model / data (``eval_batch_size`` by its ``batch_size`` ending).
VALUE_RULES = {
    "batch_size": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
    "num_workers": (lambda v: isinstance(v, int) and v >= 0, "an integer >= 0"),
    "temperature": (lambda v: isinstance(v, (int, float)) and v > 0, "a number > 0"),
    "lr": (lambda v: isinstance(v, (int, float)) and v > 0, "a number > 0"),
    "rerank_top_k": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1 (or null: every pair)"),
    "max_epochs": (lambda v: isinstance(v, int) and (v >= 1 or v == -1), "an integer >= 1 (-1: no limit)"),
}


def _value_rule(key: str):
    return VALUE_RULES.get("batch_size" if key.endswith("batch_size") else key)


def check_values(config) -> None:
    """Values no run can use, refused as one line before any model is built: batch sizes < 1, ``num_workers`` < 0, a
    temperature or learning rate <= 0, ``rerank_top_k`` < 1, ``max_epochs`` < 1, a GPU accelerator on a machine
    without one. Null values are left alone (they mean "off" or "the default")."""
    def walk(node, path: str):
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{path}.{key}")
            return
        rule = _value_rule(path.rsplit(".", 1)[-1])
        if rule is not None and node is not None and not (not isinstance(node, bool) and rule[0](node)):
            raise ConfigError(f"--{path.lstrip('.')} {node!r}: expected {rule[1]}; fix the config or the option")

    for section in ("model", "data"):
        if config.get(section) is not None:
            walk(config[section].as_dict() if hasattr(config[section], "as_dict") else config[section], section)
    trainer = config.get("trainer")
    if trainer is not None:
        walk({"max_epochs": trainer.get("max_epochs")}, "trainer")
        accelerator = str(trainer.get("accelerator") or "auto").lower()
        if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
            raise ConfigError(f"--trainer.accelerator {accelerator}: this machine has no CUDA GPU; use "
                              "--trainer.accelerator cpu (or auto)")


def check_inputs_early(config, subcommand: str | None) -> None:
    """Inputs validated before any model is built (loading a text encoder takes 20-100 s): the model's
    ``init_from`` (or other :func:`checkpoint_options`) checkpoint exists, and the DataModule, built alone from
    the config, passes its own ``check_inputs()`` (roots, annotation and caption files, STE / VLM files). Raises the
    suite's :class:`~grounding.errors.UserInputError`; anything else is left to the normal run to report."""
    if config.get("model") and subcommand == "fit" and config.get("ckpt_path") is None:  # read only then
        init_args = config.model.get("init_args") or {}
        for option, stage in checkpoint_options(class_of(config.model.get("class_path"))).items():
            path = init_args.get(option)
            if not isinstance(path, str):
                continue
            require_checkpoint_file(path, option, "train the stage it starts from first (the README's `make` targets "
                                    f"chain them), or set {option} to its .ckpt file (outputs/<run>/checkpoints/last.ckpt)")
            if stage is not None:
                check_stage_checkpoint(path, *stage, option=option)
    if not config.get("data"):
        return
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(LightningDataModule, "data", required=True)
    try:
        datamodule = parser.instantiate_classes(parser.parse_object({"data": config.data.as_dict()})).data
    except UserInputError:
        raise
    except Exception:  # noqa: BLE001 - not the suite's own input error: the real instantiation reports it
        return
    check = getattr(datamodule, "check_inputs", None)
    if callable(check):
        check()
    init_args = (config.model.get("init_args") or {}) if config.get("model") else {}
    earlier = init_checkpoints(init_args)
    if earlier and subcommand == "fit" and config.get("ckpt_path") is None and not config.get("allow_eval_overlap") \
            and callable(getattr(datamodule, "image_keys", None)):
        # the evaluation splits against the training images recorded along the init_from chain (the fit's
        # TrainingImages callback checks again; here it costs one DataModule setup instead of a model build)
        try:
            check_evaluation([e for path in earlier for e in checkpoint_entries(path)], datamodule, EVAL_SPLITS["fit"],
                             what=f"the run in {config.trainer.get('default_root_dir') or 'outputs'}")
        except UserInputError:
            raise
        except Exception:  # noqa: BLE001 - not the suite's own input error: the real run reports it
            return


def resolve_run_checkpoint(ckpt_path: str | None, root_dir: str | None, subcommand: str) -> str | None:
    """``--ckpt_path last`` / ``best`` as files of the run folder: ``<default_root_dir>/checkpoints/last.ckpt`` and the
    newest ``best-*.ckpt`` (the stages' checkpoint callbacks are attached after Lightning would resolve these names,
    so Lightning alone restarts a fit from scratch and tests an untrained model). A fit with no ``last.ckpt`` yet
    starts fresh (a line says so); ``test``/``validate``/``predict`` without the file stop with one line, exit 2."""
    if ckpt_path not in ("last", "best"):
        return ckpt_path
    folder = Path(root_dir or ".") / "checkpoints"
    if ckpt_path == "last":
        found = folder / "last.ckpt"
        found = found if found.is_file() else None
    else:
        found = best_checkpoint(folder.parent)
    if found is not None:
        return str(found)
    if subcommand == "fit" and ckpt_path == "last":
        print(f"--ckpt_path last: no {folder / 'last.ckpt'} yet; starting a fresh fit", file=sys.stderr)
        return None
    what = "last.ckpt" if ckpt_path == "last" else "best-*.ckpt"
    print(f"--ckpt_path {ckpt_path}: no {what} in {folder}; give the run's --trainer.default_root_dir (or a checkpoint "
          "path), or train it first with `python -m grounding fit --config ...`", file=sys.stderr)
    raise SystemExit(2)


QUIET_LOGGERS = ("lightning.pytorch", "lightning.fabric", "lightning")
# Lightning warnings every programmatic test run would repeat: the checkpoint's callback folder differs from
# the run's (nothing is saved there), and a torch-version deprecation inside Lightning
QUIET_WARNINGS = ("The dirpath has changed", r"`isinstance\(treespec, LeafSpec\)` is deprecated")


@contextlib.contextmanager
def quiet_cli():
    """A subcommand run from Python: Lightning's info lines (devices, tips) and the warnings of
    :data:`QUIET_WARNINGS` off, and the calling command's own arguments hidden from LightningCLI (which
    warns when it sees both ``args`` and ``sys.argv``)."""
    loggers = [logging.getLogger(n) for n in QUIET_LOGGERS]
    levels = [lg.level for lg in loggers]
    argv = sys.argv
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    sys.argv = argv[:1]
    try:
        with warnings.catch_warnings():
            for message in QUIET_WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        sys.argv = argv
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def resolved_config(config: str | Path, overrides: Sequence[dict] = ()) -> dict:
    """A stage config as ``python -m grounding test`` resolves it (``base:`` chain, shared trainer config,
    links, then ``overrides`` as further configs), parsed only: nothing is built. Raises :class:`ConfigError`."""
    config = Path(config)
    if not config.is_file():
        raise ConfigError(f"{config}: no such config file")
    out, err = io.StringIO(), io.StringIO()
    args = ["test", "--config", str(config)]
    for extra in overrides:
        args += ["--config", yaml.safe_dump(extra)]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), quiet_cli():
        try:
            main([*args, "--print_config"])
            code = 0
        except SystemExit as e:
            code = e.code or 0
    if code:
        last = next((ln for ln in reversed(err.getvalue().splitlines()) if ln.strip()), "parse failed")
        raise ConfigError(f"{config}: `python -m grounding test` cannot parse it: {last.strip()}")
    return yaml.safe_load(out.getvalue())


def run_test_subcommand(config: str | Path, ckpt: str | Path, workdir: str | Path, overrides: Sequence[dict] = (),
                    extra_args: Sequence[str] = ()) -> GroundingCLI:
    """``python -m grounding test --config <config> [--config <override>...] --ckpt_path <ckpt>`` from Python, on
    one device, over the whole test split, without a logger or callbacks, writing nothing but its config under
    ``workdir``. The returned
    CLI holds the trainer (``callback_metrics``), the model and the DataModule of the run."""
    args = ["test", "--config", str(config)]
    for extra in overrides:
        args += ["--config", yaml.safe_dump(extra)]
    args += ["--ckpt_path", str(ckpt), "--trainer.logger=false", "--trainer.callbacks=[]", "--trainer.devices=1",
             "--trainer.num_nodes=1", "--trainer.strategy=auto", "--trainer.enable_progress_bar=false",
             "--trainer.enable_model_summary=false", "--trainer.limit_test_batches=1.0",
             f"--trainer.default_root_dir={workdir}", "--verbose=false", *extra_args]
    with quiet_cli():
        return main(args)


def main(args=None, run: bool = True) -> GroundingCLI:
    """The LightningCLI of every stage; ``run=False`` parses a config (no subcommand) and builds its model, DataModule
    and trainer without running anything (:func:`build_stage`)."""
    defaults = [trainer_config_file()] if os.path.isfile(trainer_config_file()) else []
    argv = sys.argv[1:] if args is None else args
    check_renamed_options(argv)  # an option under a former name: one line naming its new place, before the parse
    named = argv[0] if isinstance(argv, (list, tuple)) and argv and argv[0] in SUBCOMMANDS else None
    return GroundingCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        auto_configure_optimizers=False,  # each stage's optimizer is injected through its init args
        # allow_abbrev off: a typo such as --trainer.max_epoch is an error, not a silent prefix match
        parser_kwargs={"allow_abbrev": False, "prog": "python -m grounding",
                       **{cmd: {"default_config_files": defaults, "allow_abbrev": False}
                          for cmd in ((named,) if named else SUBCOMMANDS)}},
        save_config_callback=RunConfigCallback,
        save_config_kwargs={"overwrite": True},
        parser_class=GroundingArgumentParser,
        args=args,
        run=run,
        only_subcommand=named,
    )


def build_stage(config: str | Path, overrides: Sequence[dict] = (), workdir: str | Path | None = None) -> GroundingCLI:
    """A stage config's model and DataModule, built as ``python -m grounding`` builds them (links, defaults and
    ``base:`` layering included) but not run: for tools that load a checkpoint into the model themselves (the
    retrieval explorer). ``overrides``: further config mappings, applied in order; ``workdir``: the trainer's
    default_root_dir (nothing is written there)."""
    args = ["--config", str(config)]
    for extra in overrides:
        args += ["--config", yaml.safe_dump(extra)]
    args += ["--trainer.logger=false", "--trainer.callbacks=[]", "--trainer.enable_progress_bar=false",
             "--trainer.enable_model_summary=false", "--trainer.devices=1", "--trainer.num_nodes=1",
             "--trainer.strategy=auto"]
    if workdir is not None:
        args.append(f"--trainer.default_root_dir={workdir}")
    with quiet_cli():
        return main(args, run=False)



def run_command(args=None) -> None:
    """``python -m grounding``: :func:`main` with the suite's input errors as one message and exit status 2. An
    evaluation command first fixes glibc's mmap threshold (grounding.utils.memory: the test loop's peak memory the
    same in every run; ``MALLOC_MMAP_THRESHOLD_`` set by the user wins)."""
    argv = sys.argv[1:] if args is None else list(args)
    if argv and argv[0] in EVALUATION_COMMANDS:
        fix_mmap_threshold()
    with user_errors_exit("python -m grounding"):
        main(args)


if __name__ == "__main__":  # pragma: no cover
    run_command(sys.argv[1:])

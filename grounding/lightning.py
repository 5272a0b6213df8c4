"""The one base class every stage's LightningModule derives from.

It holds what is the same for all stages: optimizer/scheduler injection from the config
(``optimizer`` / ``lr_scheduler`` callables, jsonargparse's dependency-injection pattern), an
optimizer over trainable parameters only, and checkpointing by the stage's own monitored metric
(``monitor`` / ``monitor_mode`` class attributes) and ``last.ckpt`` for ``--ckpt_path last`` resumes (rewritten
at every epoch's end and, every ``checkpoint_every_minutes`` of training, mid-epoch),
the frozen-backbone feature cache as a callback for stages that set ``feature_cache`` and
implement ``frozen_backbone()``, the record of the images a fit trained on (inherited along ``init_from``) with
the check that no evaluation uses an earlier stage's training images (:mod:`grounding.training_images`), and the
run's printed record for batch jobs: one line per training epoch
when stdout is not a terminal (:class:`EpochSummary`), the best checkpoint and its score at the end of a fit,
and test/validate result tables with values rounded for display only (:class:`ResultsTable`).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Mapping

import torch
from lightning.pytorch import Callback, LightningModule
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.trainer.states import TrainerFn

from grounding.feature_cache import FeatureCache
from grounding.nets import as_net, net_spec, regroup_init
from grounding.training_images import TrainingImages
from grounding.utils.io import atomic_path, atomic_write_json, remove_stale_temporaries
from grounding.utils.provenance import source_commit

FIT_RECORD = "fit_record.json"


def read_fit_record(run: str | os.PathLike) -> dict | None:
    """A run folder's ``fit_record.json`` (see :class:`FitRecord`) with ``epochs`` an int and ``seconds`` a float (None
    when it records none); None when the folder has none or it does not parse."""
    try:
        record = json.loads((Path(run) / FIT_RECORD).read_text(encoding="utf-8"))
        seconds = record.get("seconds")
        return {**record, "epochs": int(record["epochs"]), "seconds": None if seconds is None else float(seconds)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


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
    # Evaluating on images a checkpoint of the init_from chain trained on: an error unless this is set
    # (`python -m grounding ... --allow_eval_overlap true`); the record of the fit's training images
    # (grounding.training_images.TrainingImages keeps it here between a fit and a test in one process).
    allow_eval_overlap: bool = False
    training_images: list | None = None
    # `python -m grounding fit --checkpoint_every_minutes M` (cli.py): last.ckpt also rewritten mid-epoch every M
    # minutes of training (0: at epoch ends only), so a long epoch killed resumes where it was saved
    checkpoint_every_minutes: float = 0.0

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # option groups (ComposerTraining's ``losses``) given as mappings (a checkpoint's hyperparameters) or flat (a
        # checkpoint of before the group) become their dataclasses; the hyperparameters record them as mappings
        regroup_init(cls, record_as_mappings=True)

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
        """The parameters the optimizer updates: a list, or parameter groups (dicts) where a group's ``lr_scale``
        multiplies the optimizer's learning rate for it (before any schedule, which then scales every group)."""
        return [p for p in self.parameters() if p.requires_grad]

    def configure_optimizers(self):
        optimizer = scale_group_lrs(self.optimizer_factory(self.trainable_parameters()))
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
        record = FitRecord()
        last = LastCheckpoint(record, every_minutes=self.checkpoint_every_minutes, dirpath=dirpath, monitor=None,
                              save_top_k=1, filename="last", enable_version_counter=False, save_on_train_epoch_end=True)
        callbacks = [best, last, record, EpochSummary(), ResultsTable(), TrainingImages()]
        return callbacks + ([FeatureCache(self.feature_cache_dir)] if self.feature_cache else [])


def scale_group_lrs(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Each parameter group's lr times its ``lr_scale`` (groups without one keep the optimizer's lr)."""
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * group.get("lr_scale", 1.0)
    return optimizer


class FitRecord(Callback):
    """``<default_root_dir>/fit_record.json``: the wall time and epochs of the run's training, rewritten
    (atomically) after every training epoch, by :class:`LastCheckpoint` once that epoch's ``last.ckpt`` is saved
    (alone, when no LastCheckpoint holds it), so a failed checkpoint write leaves the record at the checkpoint's
    epoch. A resumed fit (``--ckpt_path``) continues the record: segments
    from the restored epoch on are dropped (a resume from an earlier checkpoint retrains them) and a new one
    added (each segment names the checkout's commit it ran at); a fresh fit starts a new record, written when its first
    epoch ends. The leaderboard reads it for its training-time
    column. Only global rank 0 writes."""

    def __init__(self):
        self.started: float | None = None
        self.segments: list[dict] = []

    def on_fit_start(self, trainer, pl_module) -> None:
        self.started = time.perf_counter()  # before the restore and the feature cache: all of the fit's time

    def on_train_start(self, trainer, pl_module) -> None:
        # after the checkpoint's restore: current_epoch and global_step are where this segment starts (mid-epoch
        # when the checkpoint was a mid-epoch last.ckpt)
        path = Path(trainer.default_root_dir) / FIT_RECORD
        first, step = int(trainer.current_epoch), int(trainer.global_step)
        self.segments = []
        if trainer.ckpt_path and path.is_file():
            try:
                old = json.loads(path.read_text(encoding="utf-8")).get("segments") or []
                self.segments = [cut for seg in old if (cut := _until(seg, first, step)) is not None]
            except (OSError, ValueError, AttributeError, TypeError, KeyError):
                self.segments = []
        self.segments.append({"started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              "commit": source_commit() if trainer.is_global_zero else None,
                              "first_epoch": first, "first_step": step, "seconds": 0.0, "epochs": 0, "steps": step})
        # written at the first epoch's end, with the first checkpoint: a fit that fails before leaves the folder's
        # earlier record as it was

    held: bool = False  # set by a LastCheckpoint that writes the record after its save

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self.started is None or not self.segments or trainer.sanity_checking:
            return
        self.update(trainer, epochs_done=int(trainer.current_epoch) + 1)
        if not self.held:
            self.write(trainer)

    def update(self, trainer, epochs_done: int) -> None:
        """The current segment up to now: its seconds, the epochs it finished (``epochs_done``: the fit's count
        of finished epochs) and the global step (a mid-epoch save: the epoch in progress is not counted)."""
        segment = self.segments[-1]
        epochs = max(epochs_done - segment["first_epoch"], 0)
        segment.update(seconds=round(time.perf_counter() - self.started, 1), epochs=epochs,
                       steps=int(trainer.global_step))
        if epochs:
            segment["last_epoch"] = epochs_done - 1

    def write(self, trainer) -> None:
        """The record as it stands (after the epoch's update), atomically; rank 0 only, never in fast_dev_run."""
        segment = self.segments[-1] if self.segments else None
        if (segment is None or (segment["epochs"] == 0 and segment.get("steps", 0) <= segment.get("first_step", 0))
                or not trainer.is_global_zero or trainer.fast_dev_run):
            return
        atomic_write_json(Path(trainer.default_root_dir) / FIT_RECORD, {
            "seconds": round(sum(s["seconds"] for s in self.segments), 1),
            "epochs": sum(int(s.get("epochs", 0)) for s in self.segments), "steps": int(trainer.global_step),
            "devices": int(trainer.num_devices), "segments": self.segments}, indent=2)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written under a temporary name beside the target, renamed when whole
    (:func:`grounding.utils.io.atomic_path`). Lightning's default goes through fsspec's transaction, which writes in
    the system temp folder and moves the file at the end: a killed save leaves a half-written file there, and a
    move across file systems is a copy, not atomic at the target. Remote URLs keep Lightning's writer."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        with atomic_path(path) as tmp:
            torch.save(checkpoint, tmp)


class LastCheckpoint(ModelCheckpoint):
    """``last.ckpt`` at every training epoch's end (a ModelCheckpoint), then the run's :class:`FitRecord`: written
    only after the checkpoint's save returned, so ``fit_record.json`` never counts an epoch that ``last.ckpt`` lacks
    (a full disk or an unwritable folder stops the fit with the two in agreement). Lightning runs checkpoint
    callbacks after the others, so the record already holds the epoch."""

    def __init__(self, record: FitRecord, every_minutes: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.record = record
        record.held = True
        self.every_seconds = max(float(every_minutes or 0.0), 0.0) * 60.0
        self.saved_at = time.monotonic()

    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # Lightning's default, not a user's plugin
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        if stage == "fit" and trainer.is_global_zero and self.dirpath:
            # a save killed part-way left its temporary beside the target; the run folder has one fit at a time
            # (grounding.run_folder.RunLock), so any temporary there now is stale
            remove_stale_temporaries(self.dirpath)

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        self.saved_at = time.monotonic()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """Mid-epoch: last.ckpt (and the record) once ``every_minutes`` of training have passed since the last save,
        except at an epoch's last batch (its end-of-epoch save follows). Rank 0's clock decides for every rank
        (the save is collective under DDP), read at every 16th batch there. The checkpoint holds the training loader's position
        (data_modules.captions.ResumableLoader), so ``--ckpt_path last`` goes on with the epoch's next batch."""
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if not self.every_seconds or trainer.sanity_checking or trainer.fast_dev_run:
            return
        if trainer.world_size > 1 and (batch_idx + 1) % 16:
            return  # under DDP the clock is read every 16th batch: the broadcast below is a collective and a sync
        due = trainer.strategy.broadcast(time.monotonic() - self.saved_at >= self.every_seconds)
        if not due or batch_idx + 1 >= trainer.num_training_batches:
            return
        self._save_checkpoint(trainer, os.path.join(self.dirpath, self.filename + self.FILE_EXTENSION))
        self.saved_at = time.monotonic()
        self.record.update(trainer, epochs_done=int(trainer.current_epoch))
        self.record.write(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if not trainer.sanity_checking:
            self.saved_at = time.monotonic()
            self.record.write(trainer)


def _until(segment: dict, epoch: int, step: int) -> dict | None:
    """A recorded training segment cut where a resumed fit starts (``epoch``, global ``step``; a resume from an
    earlier checkpoint retrains the rest), None when it started there or later: its finished epochs and, in
    proportion to its steps (to its epochs in records without steps), its seconds."""
    first_epoch = int(segment["first_epoch"])
    if "first_step" in segment and "steps" in segment:
        first, last = int(segment["first_step"]), int(segment["steps"])
        if first >= step:
            return None
        if last <= step:
            return segment
        kept = (step - first) / max(last - first, 1)
    else:  # a record written before segments kept their steps: by epochs
        done = int(segment.get("epochs", 0))
        if first_epoch >= epoch:
            return None
        if done <= epoch - first_epoch:
            return segment
        kept = (epoch - first_epoch) / max(done, 1)
    out = dict(segment, epochs=max(epoch - first_epoch, 0), seconds=round(float(segment["seconds"]) * kept, 1), steps=step)
    out.pop("last_epoch", None)
    if out["epochs"]:
        out["last_epoch"] = epoch - 1
    return out


# --- What a run prints: epoch lines, the end-of-fit checkpoint line, rounded result tables --------------------
# Display only: every value is read from trainer.callback_metrics and formatted; the metrics themselves (what
# checkpoints monitor, loggers record and the leaderboard reads) are never rounded.

DATALOADER_SUFFIX = "/dataloader_idx_"


def display_number(value) -> str:
    """A metric for display: 4 significant digits without trailing zeros (``1.23456 -> 1.235``,
    ``245.63 -> 245.6``, ``60.000003814697266 -> 60``), whole numbers from 10,000 up (``12345.6 -> 12346``,
    never an exponent), an exponent only below 0.0001 (``1.235e-05``)."""
    v = float(value)
    if not math.isfinite(v):
        return str(v)  # nan, inf, -inf
    if abs(v) >= 9999.5:
        return f"{v:.0f}"
    text = f"{v:.4g}"
    return "0" if text == "-0" else text


def scalar_metrics(metrics: Mapping) -> dict[str, float]:
    """The scalar entries of ``trainer.callback_metrics`` (or any mapping) as floats, without Lightning's
    ``name_step`` / ``name_epoch`` twins of a metric logged both per step and per epoch (``name`` holds the
    epoch value), sorted by name. Reads the values; changes nothing."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                continue
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue
        name, sep, loader = key.partition(DATALOADER_SUFFIX)
        twin = next((name[: -len(end)] for end in ("_step", "_epoch") if name.endswith(end)), None)
        if twin is not None and twin + sep + loader in metrics:
            continue
        out[key] = float(value)
    return dict(sorted(out.items()))


def _stdout_is_terminal() -> bool:
    try:
        return bool(sys.stdout.isatty())
    except (AttributeError, ValueError):  # a replaced or closed stdout: not a terminal
        return False


def _say(line: str) -> None:
    print(line, flush=True)  # flushed: a batch job's log file shows each line when it happens


class EpochSummary(Callback):
    """One line per training epoch, after its validation, when stdout is not a terminal or the progress bar
    is off (a log file keeps only the Rich bar's last frame), and at the end of every fit one line naming the
    best checkpoint, its monitored score and epoch, and ``last.ckpt``. Global rank 0 prints; nothing else::

        epoch 3/15  train/loss 1.234  val/rsum 245.6  (41 s)
        best checkpoint: outputs/x/checkpoints/best-epoch006-step70.ckpt (val/rsum 245.6, epoch 7); last: ...

    The metrics are ``trainer.callback_metrics`` at the epoch's end, rounded by :func:`display_number`. A
    training metric logged per step only (Lightning's default in ``training_step``; the callback metrics
    then hold the last step's value) is shown as its mean over the epoch's steps, counted on rank 0. Epochs
    are counted from 1 here; checkpoint file names carry Lightning's epoch index, which counts from 0."""

    def __init__(self):
        self.lines = False  # this epoch is printed
        self.started = 0.0
        # the callback metrics' storages at the last step: which ones each step renews (callback_metrics gives new
        # detached views at every read, so identity cannot tell; the kept references keep the pointers unique)
        self.previous: dict[str, torch.Tensor] = {}
        self.validated = False  # validation ran in this epoch (else the val/ values are an earlier epoch's)
        self.sums: dict[str, torch.Tensor] = {}
        self.renewed: dict[str, int] = {}
        self.steps = 0
        self.best_epochs: dict[str, int] = {}  # best checkpoint path -> the epoch it was saved in (from 1)
        self.best_paths: dict[str, str] = {}  # ModelCheckpoint monitor -> its best path when last looked at

    # -- per epoch
    def on_train_epoch_start(self, trainer, pl_module) -> None:
        bar = trainer.progress_bar_callback
        bar_off = bar is None or bool(getattr(bar, "is_disabled", False))
        self.lines = trainer.is_global_zero and (bar_off or not _stdout_is_terminal())
        self.started = time.perf_counter()
        self.previous = dict(trainer.callback_metrics) if self.lines else {}
        self.sums, self.renewed, self.steps, self.validated = {}, {}, 0, False

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.validated = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.lines:
            return
        self.steps += 1
        for key, value in trainer.callback_metrics.items():  # here: this step's values of per-step metrics
            before = self.previous.get(key)
            if isinstance(value, torch.Tensor) and isinstance(before, torch.Tensor) and value.data_ptr() == before.data_ptr():
                continue
            self.previous[key] = value
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                self.renewed[key] = self.renewed.get(key, 0) + 1
                # summed on its device without a sync; read once at the epoch's end
                self.sums[key] = self.sums.get(key, 0.0) + value.detach().float().reshape(())

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if not self.lines:
            return
        metrics = scalar_metrics(trainer.callback_metrics)
        if not self.validated:  # no validation this epoch (check_val_every_n_epoch): no stale val/ values
            metrics = {k: v for k, v in metrics.items() if not k.startswith("val")}
        for key in metrics:  # renewed at every step and without an epoch value: logged per step only
            if self.steps and self.renewed.get(key) == self.steps and not self._has_epoch_value(key, trainer):
                metrics[key] = float(self.sums[key]) / self.steps
        epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None
        head = f"epoch {trainer.current_epoch + 1}" + (f"/{epochs}" if epochs else "")
        shown = "  ".join(f"{k} {display_number(v)}" for k, v in metrics.items())
        seconds = time.perf_counter() - self.started
        _say("  ".join(p for p in (head, shown, f"({seconds:.0f} s)" if seconds >= 10 else f"({seconds:.1f} s)") if p))

    @staticmethod
    def _has_epoch_value(key: str, trainer) -> bool:
        name, sep, loader = key.partition(DATALOADER_SUFFIX)
        return f"{name}_step{sep}{loader}" in trainer.callback_metrics

    # -- the best checkpoint's epoch: noted when a monitored ModelCheckpoint saves a new best
    def on_train_start(self, trainer, pl_module) -> None:
        # after a resume's restore: the restored best is not this fit's news (its epoch comes from state_dict)
        self.best_paths = {cb.monitor: str(cb.best_model_path or "") for cb in _monitored_checkpoints(trainer)}
        # a fit resumed from a mid-epoch checkpoint gets no on_train_epoch_start for the epoch it goes on with
        self.on_train_epoch_start(trainer, pl_module)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        for cb in _monitored_checkpoints(trainer):
            path = str(cb.best_model_path or "")
            if path and self.best_paths.get(cb.monitor) != path:  # ModelCheckpoint names its new best first
                self.best_paths[cb.monitor] = path
                self.best_epochs[path] = int(checkpoint.get("epoch", trainer.current_epoch)) + 1

    def state_dict(self) -> dict:
        return {"best_epochs": dict(self.best_epochs)}  # a resumed fit still knows its best's epoch

    def load_state_dict(self, state_dict: dict) -> None:
        self.best_epochs.update(state_dict.get("best_epochs") or {})

    # -- end of fit
    def on_fit_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            line = self.checkpoint_line(trainer)
            if line:
                _say(line)

    def checkpoint_line(self, trainer) -> str | None:
        """``best checkpoint: <path> (<monitor> <score>, epoch <n>); last: <path>``; ``last checkpoint: <path>``
        without a monitored checkpoint; None when the fit saved none (``fast_dev_run``)."""
        checkpoints = [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint)]
        last = next((p for cb in checkpoints for p in (cb.last_model_path, "" if cb.monitor else cb.best_model_path) if p), "")
        best, saved = [], bool(last)
        for cb in _monitored_checkpoints(trainer):
            path = str(cb.best_model_path or "")
            if not path or cb.best_model_score is None:
                best.append(f"best checkpoint: none ({cb.monitor} was never logged)")
                continue
            saved, epoch = True, self.best_epochs.get(path)
            score = f"{cb.monitor} {display_number(cb.best_model_score)}" + (f", epoch {epoch}" if epoch else "")
            best.append(f"best checkpoint: {path} ({score})")
        if not saved:
            return None
        if not best:
            return f"last checkpoint: {last}"
        return "; ".join(best) + (f"; last: {last}" if last else "")


def _monitored_checkpoints(trainer) -> list[ModelCheckpoint]:
    return [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint) and cb.monitor]


class ResultsTable(Callback):
    """``validate`` / ``test`` results printed with values rounded for display (:func:`display_number`):
    Lightning prints the float32 metrics converted to Python floats (``60.000003814697266``). When Lightning
    would print its table (``verbose``, the default; ``--verbose=false`` keeps both quiet) this callback turns
    it off for the run, through the trainer's public ``validate_loop`` / ``test_loop`` ``verbose`` attribute
    (``trainer.validate()`` / ``trainer.test()`` set it again on every call), and prints its own table from
    ``trainer.callback_metrics`` on global rank 0: one column per dataloader, metric names sorted::

        test metric     DataLoader 0
        -----------     ------------
        test/R@1                  60
        test/rsum              245.6

    The metrics themselves are untouched. Validation inside ``fit`` is not affected (it prints no table)."""

    def __init__(self):
        self.printing = False

    def on_validation_start(self, trainer, pl_module) -> None:
        self._take_over(trainer, TrainerFn.VALIDATING, trainer.validate_loop)

    def on_test_start(self, trainer, pl_module) -> None:
        self._take_over(trainer, TrainerFn.TESTING, trainer.test_loop)

    def on_validation_end(self, trainer, pl_module) -> None:
        self._print(trainer, "validate")

    def on_test_end(self, trainer, pl_module) -> None:
        self._print(trainer, "test")

    def _take_over(self, trainer, fn: TrainerFn, loop) -> None:
        self.printing = False
        if trainer.state.fn != fn or trainer.sanity_checking:
            return
        if getattr(loop, "verbose", None) is True:
            loop.verbose = False
            self.printing = True

    def _print(self, trainer, stage: str) -> None:
        if self.printing and trainer.is_global_zero:
            self.printing = False
            table = results_table(trainer.callback_metrics, stage)
            if table:
                _say(table)


def results_table(metrics: Mapping, stage: str) -> str:
    """The scalar metrics as a plain-text table (no colour codes: it reads the same in a log file), one row
    per metric and one column per dataloader, values rounded for display; "" when there is none."""
    columns: dict[int, dict[str, str]] = {}
    for key, value in scalar_metrics(metrics).items():
        name, _, loader = key.partition(DATALOADER_SUFFIX)
        columns.setdefault(int(loader) if loader.isdigit() else 0, {})[name] = display_number(value)
    if not columns:
        return ""
    loaders = sorted(columns)
    names = sorted({name for column in columns.values() for name in column})
    header = [f"{stage} metric"] + [f"DataLoader {i}" for i in loaders]
    rows = [[name] + [columns[i].get(name, "") for i in loaders] for name in names]
    widths = [max(len(row[c]) for row in [header, *rows]) for c in range(len(header))]

    def line(cells: list[str]) -> str:
        return "   ".join([cells[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in zip(cells[1:], widths[1:])]).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(row) for row in rows)])

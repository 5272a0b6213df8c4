"""VG-BERT's GLUE probe (App. B.6, Table 12): how much general language understanding a language stream keeps.

The text encoder is frozen; only a pooling layer shared by every task and one linear layer per task train, on all
tasks jointly (jiant's multi-task setup, ``transfer_paradigm = frozen``), and each task is scored by its GLUE metric
on its dev set (the test here: GLUE's test labels are not public; see data_modules/glue.py).

The pieces, as plain modules and functions:

* :class:`SharedPooler`: jiant's pooler, a linear projection of every token (``proj_dim``, jiant's ``d_proj`` = 512)
  followed by a pooling over the real tokens. The default pooling is the **mean**: the frozen encoders this probe
  compares carry the sentence in their token states, not in ``[CLS]`` (the offline MiniLM was trained as a
  mean-pooled sentence encoder; VG-BERT's grounding trains the language stream through word-level match maps and
  never trains ``[CLS]``), and the mean adds no parameters beyond the projection, so the probe has the same
  capacity whatever the encoder. Mean then linear is one linear map of the mean-pooled states: a linear probe.
  ``first`` (``[CLS]``: jiant's ``pool_type = auto`` for a plain BERT, to reproduce jiant), ``max`` (jiant's default
  for other encoders) and ``attention`` (a learned score a token, softmax over the real tokens) are options.
* :class:`GlueProbeNet`: the frozen encoder (any ``grounding.encoders`` name; a VG-BERT checkpoint's language stream
  is loaded into it by :class:`GlueProbe`'s ``init_from``), the shared pooler, dropout, and a linear head per GLUE
  task (all nine by default: a head no batch reaches stays untrained and unused).
* :func:`task_loss`: cross-entropy for the classification tasks; STS-B regresses its score / 5 (jiant's scaling)
  with the mean squared error.
* :func:`task_metrics`: CoLA Matthews correlation; SST-2, QNLI, RTE, WNLI, MNLI-m and MNLI-mm accuracy; MRPC and QQP
  F1 (of class 1) and accuracy; STS-B Pearson and Spearman (scikit-learn and SciPy; a correlation of a constant
  is taken as 0, not NaN). :func:`glue_score` is the GLUE average: a task's metrics are averaged first (MRPC's F1
  and accuracy; MNLI's matched and mismatched accuracy, as the GLUE leaderboard does), then the tasks present.
  Metrics are logged in percent (``test/cola_mcc``, ``test/mnli_m_acc``, ``test/glue``), as Table 12 gives them.

Token states are computed once per encoder: the encoder is frozen and the inputs fixed, so :func:`token_states`
encodes each task file once and stores its last hidden states on disk (float16, packed over the real tokens,
memory-mapped: MNLI's 393k pairs stay off the RAM) under ``<cache_dir()>/glue_states/<task>-<key>``, keyed by a
hash of the encoder's weights and of the file's token ids (so a new checkpoint, tokenizer or ``max_length`` gets its
own states, and a copied data folder keeps them). Written under a temporary name and renamed when complete. The
batches then carry the states (``batch["states"]``) and a training step costs the pooler and a head only. With the
mean (or ``first``) pooling the batches carry each example's mean state instead (``batch["summary_states"]``, (B, d):
:func:`summarise_states`, once a file), since the projection commutes with the mean: the same probe, a step of two
small matrix products.
grounding/feature_cache.py does not fit: it caches fixed-shape maps of images behind a dataset's ``load_image``,
while these are variable-length token sequences of pre-tokenized files. ``cache_states: false`` encodes every batch.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats
from sklearn import metrics as sk_metrics
from torch import nn

from data_modules.glue import STSB_RANGE, TASKS, TASKS_BY_KEY, GlueFile, GlueTask, glue_task
from grounding.encoders import load_text_encoder
from grounding.lightning import GroundingModule, LRSchedulerCallable, OptimizerCallable, default_optimizer
from grounding.nets import RecordedNet
from grounding.paths import cache_dir
from grounding.semantic_space.embeddings import LanguageStreamError, load_language_stream
from grounding.stage_config import ConfigError
from grounding.utils.io import atomic_path, atomic_write_csv, atomic_write_json, sha1_of_json, state_dict_sha1

POOLS = ("mean", "first", "max", "attention")
PREDICTIONS_FILE = "glue_predictions.test.csv"  # a test's per-example predictions, in the run folder
STATES_VERSION = 1


class SharedPooler(nn.Module):
    """Token states (B, T, d) and their mask (B, T) -> one vector (B, proj_dim): a linear projection of every token,
    then the ``pool`` over the real tokens (see the module docstring)."""

    def __init__(self, width: int, proj_dim: int = 512, pool: str = "mean"):
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}; got {pool!r}")
        self.pool = pool
        self.project = nn.Linear(width, proj_dim)
        self.score = nn.Linear(proj_dim, 1) if pool == "attention" else None

    @property
    def summary(self) -> str | None:
        """The per-example summary of the token states this pooling can start from (``mean``: the mean state;
        ``first``: the first token's), or None (``max``, ``attention``: they need every token). The projection is
        affine, so project-then-mean equals mean-then-project (and likewise for the first token): a probe can pool
        each example's states once and train on (B, d) vectors, exactly (up to float rounding)."""
        return self.pool if self.pool in ("mean", "first") else None

    def forward_summary(self, summary_states: torch.Tensor) -> torch.Tensor:
        """The pooled vector (B, proj_dim) from each example's :attr:`summary` of its token states (B, d)."""
        if self.summary is None:
            raise ValueError(f"the {self.pool!r} pooling needs every token's state, not a summary")
        return self.project(summary_states)

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.project(states)
        real = mask.bool().unsqueeze(-1)
        if self.pool == "first":
            return x[:, 0]
        if self.pool == "max":
            return x.masked_fill(~real, torch.finfo(x.dtype).min).amax(1)
        if self.pool == "attention":
            weights = self.score(torch.tanh(x)).masked_fill(~real, torch.finfo(x.dtype).min).softmax(1)
            return (weights * x).sum(1)
        w = real.to(x.dtype)
        return (x * w).sum(1) / w.sum(1).clamp_min(1.0)


class GlueProbeNet(RecordedNet):
    """The frozen text encoder, the :class:`SharedPooler`, dropout and one linear head per task (``tasks``: names or
    keys; None: every GLUE task)."""

    def __init__(self, text_encoder: str = "minilm", proj_dim: int = 512, pool: str = "mean", dropout: float = 0.1,
                 tasks: list[str] | None = None):
        super().__init__()
        self.text_encoder = text_encoder
        self.encoder = load_text_encoder(text_encoder)
        self.encoder.requires_grad_(False)
        self.encoder.eval()
        self.pooler = SharedPooler(self.encoder.config.hidden_size, proj_dim, pool)
        self.dropout = nn.Dropout(dropout)
        chosen = [glue_task(t) for t in tasks] if tasks else list(TASKS.values())
        self.heads = nn.ModuleDict({t.key: nn.Linear(proj_dim, t.num_outputs) for t in chosen})

    def train(self, mode: bool = True):
        super().train(mode)
        self.encoder.eval()  # frozen: no dropout in the states the probe reads
        return self

    @torch.no_grad()
    def token_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The encoder's last hidden states (B, T, d)."""
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=token_type_ids).last_hidden_state

    def forward(self, states: torch.Tensor, attention_mask: torch.Tensor, task: str) -> torch.Tensor:
        """Logits (B, classes), or the regression output (B,) for STS-B, from the token states (B, T, d)."""
        return self.task_outputs(self.pooler(states, attention_mask), task)

    def forward_summary(self, summary_states: torch.Tensor, task: str) -> torch.Tensor:
        """As :meth:`forward`, from each example's summary of its token states (B, d) (:attr:`SharedPooler.summary`)."""
        return self.task_outputs(self.pooler.forward_summary(summary_states), task)

    def task_outputs(self, pooled: torch.Tensor, task: str) -> torch.Tensor:
        if task not in self.heads:
            raise ConfigError(f"the GLUE probe has no head for task {task!r} (its heads: {', '.join(self.heads)}); "
                              "add it to model.init_args.net.init_args.tasks or drop it from data.init_args.tasks")
        out = self.heads[task](self.dropout(pooled))
        return out.squeeze(-1) if TASKS_BY_KEY[task].regression else out


# ---------------------------------------------------------------------------------------------------------------
# Losses and metrics
# ---------------------------------------------------------------------------------------------------------------
def task_loss(task: GlueTask, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the task's classes; STS-B: the squared error against score / 5."""
    if task.regression:
        return F.mse_loss(outputs.float(), labels.float() / STSB_RANGE[1])
    return F.cross_entropy(outputs.float(), labels)


def task_predictions(task: GlueTask, outputs: torch.Tensor) -> torch.Tensor:
    """Class ids, or STS-B scores on the 0-5 scale."""
    return outputs.float() * STSB_RANGE[1] if task.regression else outputs.argmax(-1)


def _correlation(kind: str, predictions: np.ndarray, targets: np.ndarray) -> float:
    if len(predictions) < 2 or np.ptp(predictions) == 0 or np.ptp(targets) == 0:
        return 0.0  # undefined for a constant: counted as no correlation
    return float((stats.pearsonr if kind == "pearson" else stats.spearmanr)(predictions, targets)[0])


def task_metrics(task: GlueTask, predictions, targets) -> dict[str, float]:
    """The task's GLUE metrics (fractions, not percent) of ``predictions`` (class ids; STS-B scores) against
    ``targets``."""
    predictions, targets = np.asarray(predictions), np.asarray(targets)
    out = {}
    for name in task.metrics:
        if name in ("pearson", "spearman"):
            out[name] = _correlation(name, predictions.astype(np.float64), targets.astype(np.float64))
        elif name == "mcc":
            out[name] = float(sk_metrics.matthews_corrcoef(targets.astype(int), predictions.astype(int)))
        elif name == "f1":
            out[name] = float(sk_metrics.f1_score(targets.astype(int), predictions.astype(int), pos_label=1,
                                               zero_division=0.0))
        else:
            out[name] = float(sk_metrics.accuracy_score(targets.astype(int), predictions.astype(int)))
    return out


def task_of_set(name: str) -> GlueTask:
    """The task an evaluation set belongs to (``mnli_mm`` -> MNLI; a task's own key -> the task)."""
    for task in TASKS.values():
        if name == task.key or name in dict(task.eval_sets):
            return task
    raise KeyError(f"no GLUE task has the evaluation set {name!r}")


def glue_score(results: dict[str, dict[str, float]]) -> float:
    """The GLUE average of ``results`` (evaluation set -> its metrics): each task's metrics averaged over its
    evaluation sets and metrics first (MRPC: F1 and accuracy; MNLI: matched and mismatched accuracy), then the
    tasks present averaged."""
    by_task: dict[str, list[float]] = defaultdict(list)
    for name, metrics in results.items():
        by_task[task_of_set(name).key].extend(metrics.values())
    if not by_task:
        return float("nan")
    return float(np.mean([np.mean(values) for values in by_task.values()]))


# ---------------------------------------------------------------------------------------------------------------
# Token states, once per encoder
# ---------------------------------------------------------------------------------------------------------------
SUMMARY_ROWS = 1 << 16  # token rows summed at once while summarising a file (float32: 100 MB at d = 384)


class TokenStates:
    """A file's token states on disk (``states.npy``: (real tokens, d) float16; ``offsets.npy``: example i's rows
    ``offsets[i]:offsets[i+1]``), memory-mapped when first read; pickles as its folder (DataLoader workers map it
    again). ``encoder``: the hash of the encoder's weights the states are of.

    ``summary`` (``mean`` or ``first``; :attr:`SharedPooler.summary`): item i is example i's mean state (or its first
    token's), float32 (d,), all computed once in memory when first read (a pass over the file); None: its (T_i, d)
    token states."""

    def __init__(self, folder: str | Path, encoder: str = "", summary: str | None = None):
        if summary not in (None, "mean", "first"):
            raise ValueError(f"summary must be None, 'mean' or 'first'; got {summary!r}")
        self.folder, self.encoder, self.summary = Path(folder), encoder, summary
        self._states = self._offsets = self._summaries = None

    def __getstate__(self):
        return {"folder": str(self.folder), "encoder": self.encoder, "summary": self.summary}

    def __setstate__(self, state):
        self.__init__(state["folder"], state["encoder"], state.get("summary"))

    def _open(self) -> None:
        if self._states is None:
            self._states = np.load(self.folder / "states.npy", mmap_mode="r")
            self._offsets = np.load(self.folder / "offsets.npy")
        if self.summary is not None and self._summaries is None:
            self._summaries = summarise_states(self._states, self._offsets, self.summary)

    def __len__(self) -> int:
        self._open()
        return len(self._offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        self._open()
        if self._summaries is not None:
            return self._summaries[i]
        return self._states[self._offsets[i]:self._offsets[i + 1]]


def summarise_states(states: np.ndarray, offsets: np.ndarray, summary: str) -> np.ndarray:
    """Every example's mean token state (``mean``) or first token state (``first``): float32 (examples, d), from the
    packed ``states`` (tokens, d) and their ``offsets`` (examples + 1); summed in float32 a block of examples at a
    time, so a memory-mapped MNLI never sits in RAM whole."""
    starts, lengths = offsets[:-1], np.diff(offsets)
    if summary == "first":
        return np.asarray(states[starts], dtype=np.float32)
    if (lengths < 1).any():
        raise ValueError("an example without tokens has no mean state")
    out = np.empty((len(starts), states.shape[1]), np.float32)
    begin = 0
    while begin < len(starts):  # blocks of whole examples, about SUMMARY_ROWS token rows each
        end = max(begin + 1, int(np.searchsorted(offsets, offsets[begin] + SUMMARY_ROWS, side="right")) - 1)
        end = min(end, len(starts))
        block = np.asarray(states[offsets[begin]:offsets[end]], dtype=np.float32)
        out[begin:end] = np.add.reduceat(block, starts[begin:end] - offsets[begin], axis=0)
        begin = end
    return out / lengths[:, None]


def _complete(folder: Path, n_tokens: int) -> bool:
    try:
        states = np.load(folder / "states.npy", mmap_mode="r")
        return (folder / "meta.json").is_file() and states.shape[0] == n_tokens
    except (OSError, ValueError):
        return False


def encode_file(net: GlueProbeNet, file: GlueFile, out: np.ndarray, batch_size: int, device) -> None:
    """Every example's real-token states into ``out`` at the file's offsets (longest first, batch by batch)."""
    lengths = file.lengths()
    order = np.argsort(-lengths, kind="stable")
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        width = int(lengths[rows].max())
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        types = torch.zeros(len(rows), width, dtype=torch.long)
        for j, r in enumerate(rows):
            tokens, segments = file.example(r)
            ids[j, :len(tokens)], types[j, :len(tokens)] = torch.from_numpy(tokens.astype(np.int64)), \
                torch.from_numpy(segments.astype(np.int64))
        mask = (torch.arange(width)[None] < torch.from_numpy(lengths[rows])[:, None]).long()
        states = net.token_states(ids.to(device), mask.to(device), types.to(device)).float().cpu().numpy()
        for j, r in enumerate(rows):
            out[file.offsets[r]:file.offsets[r + 1]] = states[j, :lengths[r]]


def token_states(net: GlueProbeNet, file: GlueFile, root: str | Path, encoder_sha1: str, batch_size: int = 128,
                 device="cpu") -> TokenStates:
    """The file's token states under ``root``: read when stored, else computed (a line to stderr before and after)
    and stored atomically."""
    key = sha1_of_json({"version": STATES_VERSION, "encoder": encoder_sha1, "inputs": file.fingerprint()})[:16]
    folder = Path(root) / f"{file.task.key}-{key}"
    n_tokens, width = int(file.offsets[-1]), net.encoder.config.hidden_size
    if _complete(folder, n_tokens):
        return TokenStates(folder, encoder_sha1)
    print(f"GLUE token states: encoding {file.path} ({len(file):,} examples) -> {folder}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    with atomic_path(folder) as tmp:
        tmp.mkdir(parents=True)
        out = np.lib.format.open_memmap(tmp / "states.npy", mode="w+", dtype=np.float16, shape=(n_tokens, width))
        encode_file(net, file, out, batch_size, device)
        out.flush()
        del out
        np.save(tmp / "offsets.npy", file.offsets)
        atomic_write_json(tmp / "meta.json", {"version": STATES_VERSION, "encoder": encoder_sha1,
                                              "file": str(file.path), "examples": len(file), "tokens": n_tokens,
                                              "width": width})
    print(f"GLUE token states: {file.task.name} {file.path.name} done in {time.perf_counter() - started:.1f} s "
          f"({n_tokens * width * 2 / 2**20:.1f} MB)", file=sys.stderr, flush=True)
    return TokenStates(folder, encoder_sha1)


# ---------------------------------------------------------------------------------------------------------------
# The LightningModule
# ---------------------------------------------------------------------------------------------------------------
class GlueProbe(GroundingModule):
    """Train the shared pooler and the task heads of a :class:`GlueProbeNet` on a ``GlueDataModule``'s tasks
    jointly; report each task's GLUE metrics and the GLUE average (``val/glue`` selects the checkpoint).

    Args:
        net: the :class:`GlueProbeNet` (its ``text_encoder`` is the architecture and the tokenizer).
        init_from: a suite checkpoint (VG-BERT stage 1 or 2, any ``.ckpt`` with one BERT) whose language stream is
            the encoder probed (loaded when a fit starts; grounding.semantic_space.embeddings.load_language_stream);
            None: the ``text_encoder``'s own weights.
        cache_states: encode each task file once and train from the stored states (module docstring); false: every
            batch runs the encoder. cache_dir: where (None: ``<cache_dir()>/glue_states``).
        summarise_states: with cached states and a pooling that commutes with the projection (``mean``, ``first``:
            :attr:`SharedPooler.summary`), reduce each example's states to its summary once and train on (B, d)
            vectors: the same probe (equal up to float rounding; tested), a batch about 14x cheaper to load and a
            step about 6x cheaper on 2 CPU cores (benchmarks/bench_glue_probe.py).
            false: pool the padded token states every step.
        train_threads: CPU threads while the probe trains from cached states (set after the states are computed,
            restored when the fit ends): its step is a few small matrix products, which more threads slow down on a
            busy CPU (on 2 cores shared with other jobs: 13.8 ms a step on 1 thread, 37.4 ms on 2). None: torch's
            setting throughout. The encoder's forwards (the token states) always use torch's setting.
        encode_batch_size: examples an encoder forward while computing the states.
    """

    monitor = "val/glue"
    monitor_mode = "max"

    def __init__(self, net: GlueProbeNet, init_from: str | None = None, cache_states: bool = True,
                 cache_dir: str | None = None, encode_batch_size: int = 128, summarise_states: bool = True,
                 train_threads: int | None = 1,
                 optimizer: OptimizerCallable = default_optimizer, lr_scheduler: LRSchedulerCallable | None = None):
        super().__init__(optimizer, lr_scheduler)
        self.save_hyperparameters(ignore=["net", "optimizer", "lr_scheduler"])
        self.net = self.adopt_net(net)
        self._init_loaded = False
        self._encoder_sha1: str | None = None
        self._eval: dict[str, dict[str, list]] = {}
        self._threads_before: int | None = None

    # -- the encoder ----------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        if self.trainer.world_size > 1:  # the DataModule's task batches are not split across ranks
            raise ConfigError(f"the GLUE probe runs on one device, not {self.trainer.world_size}; give "
                              "--trainer.devices 1 --trainer.num_nodes 1 (a frozen encoder's probe is small)")
        if stage == "fit" and self.hparams.init_from and not self._init_loaded and not self.trainer.ckpt_path:
            self.load_stream(self.hparams.init_from)

    def load_stream(self, path: str | Path) -> None:
        """The language stream of the checkpoint at ``path`` as the frozen encoder."""
        try:
            stream = load_language_stream(str(path), text_encoder=self.net.text_encoder)
        except (LanguageStreamError, RuntimeError) as e:  # RuntimeError: weights of other shapes than the encoder's
            first = str(e).strip().splitlines()[0].rstrip(":")
            raise LanguageStreamError(f"init_from {path}: {first} (the probe's text_encoder is "
                                      f"{self.net.text_encoder!r}); fix: set model.init_args.net.init_args.text_encoder "
                                      "to the architecture the checkpoint was trained with") from e
        self.net.encoder.load_state_dict(stream.model.state_dict())
        self._init_loaded, self._encoder_sha1 = True, None

    def on_load_checkpoint(self, checkpoint) -> None:
        self._encoder_sha1 = None  # the restored weights are another encoder's, maybe

    def attach_states(self, splits: tuple[str, ...]) -> None:
        """Token states for every file the ``splits`` of the DataModule read (computed or read from the cache)."""
        datamodule = getattr(self.trainer, "datamodule", None)
        if not self.hparams.cache_states or not callable(getattr(datamodule, "split_files", None)):
            return
        if self._encoder_sha1 is None:
            self._encoder_sha1 = state_dict_sha1(self.net.encoder)
        root = Path(self.hparams.cache_dir) if self.hparams.cache_dir else cache_dir() / "glue_states"
        summary = self.net.pooler.summary if self.hparams.get("summarise_states", True) else None
        for split in splits:
            for file in datamodule.split_files(split):
                if getattr(file.states, "encoder", None) != self._encoder_sha1:
                    file.states = token_states(self.net, file, root, self._encoder_sha1,
                                               self.hparams.encode_batch_size, self.device)
                if file.states.summary != summary:
                    file.states = TokenStates(file.states.folder, file.states.encoder, summary)

    def on_fit_start(self) -> None:
        self.attach_states(("train", "val"))
        self._threads_before = None
        if self.hparams.get("train_threads") and self.hparams.cache_states and self.device.type == "cpu":
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(self.hparams.train_threads)

    def on_fit_end(self) -> None:
        if getattr(self, "_threads_before", None):
            torch.set_num_threads(self._threads_before)
            self._threads_before = None

    def on_validation_start(self) -> None:
        self.attach_states(("val",))

    def on_test_start(self) -> None:
        self.attach_states(("test",))

    # -- steps ----------------------------------------------------------------------------------------------
    def outputs(self, batch: dict) -> torch.Tensor:
        if "summary_states" in batch:
            return self.net.forward_summary(batch["summary_states"].float(), batch["task"])
        states = batch.get("states")
        if states is None:
            states = self.net.token_states(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))
        return self.net(states.float(), batch["attention_mask"], batch["task"])

    def training_step(self, batch, batch_idx):
        loss = task_loss(TASKS_BY_KEY[batch["task"]], self.outputs(batch), batch["labels"])
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["labels"]))
        return loss

    def _eval_step(self, batch, split: str) -> None:
        task = TASKS_BY_KEY[batch["task"]]
        out = self.outputs(batch)
        self.log(f"{split}/loss", task_loss(task, out, batch["labels"]), batch_size=len(batch["labels"]))
        self._eval.setdefault(split, {}).setdefault(batch["eval_set"], []).append(
            (task_predictions(task, out).float().cpu(), batch["labels"].float().cpu(), batch["rows"].cpu()))

    def validation_step(self, batch, batch_idx, dataloader_idx: int = 0):
        self._eval_step(batch, "val")

    def test_step(self, batch, batch_idx, dataloader_idx: int = 0):
        self._eval_step(batch, "test")

    def on_validation_epoch_end(self) -> None:
        self._eval_end("val")

    def on_test_epoch_end(self) -> None:
        self._eval_end("test")

    def _eval_end(self, split: str) -> None:
        store = self._eval.pop(split, {})
        if not store:
            return
        results, table = {}, []
        for name, parts in store.items():
            predictions, targets, rows = (torch.cat(x).numpy() for x in zip(*parts))
            results[name] = task_metrics(task_of_set(name), predictions, targets)
            for metric, value in results[name].items():
                self.log(f"{split}/{name}_{metric}", 100.0 * value)
            table += [{"eval_set": name, "row": int(r), "prediction": float(p), "label": float(t)}
                      for r, p, t in sorted(zip(rows, predictions, targets))]
        self.log(f"{split}/glue", 100.0 * glue_score(results), prog_bar=True)
        if split == "test" and self.trainer.is_global_zero and not self.trainer.sanity_checking:
            # every dev example's prediction, for intervals (python -m grounding.vgbert.glue_report)
            atomic_write_csv(Path(self.trainer.default_root_dir) / PREDICTIONS_FILE, table,
                             ["eval_set", "row", "prediction", "label"], digits=6)


__all__ = ["PREDICTIONS_FILE", "GlueProbe", "GlueProbeNet", "SharedPooler", "TokenStates", "glue_score", "task_loss", "task_metrics",
           "task_of_set", "task_predictions", "summarise_states", "token_states"]

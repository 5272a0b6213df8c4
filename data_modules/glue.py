"""GLUE (Wang et al. 2018) as a LightningDataModule, for VG-BERT's GLUE probe (App. B.6, Table 12).

The layout is the one the GLUE download script writes (``glue_data/``), read unchanged: ``<root>/<TASK>/train.tsv``
and ``dev.tsv`` (MNLI: ``dev_matched.tsv`` and ``dev_mismatched.tsv``), tab-separated, read with :mod:`csv` and
quoting off (``csv.QUOTE_NONE``: the files are not CSV-quoted; MRPC's and MNLI's sentences hold bare ``"``), a UTF-8
byte-order mark ignored (MRPC has one). Columns are found by their header names, except CoLA's, whose files have no
header (source, label, the original acceptability mark, sentence). :data:`TASKS` lists each task's columns, labels,
evaluation files and GLUE metrics.

Splits: ``train`` is ``train.tsv`` less a seeded held-out part of it, ``val`` that part (checkpoint selection), and
``test`` the dev sets: GLUE's test labels are not public, so the dev sets are the test here (jiant validates on them;
this suite keeps them for the final numbers only). A task whose files are missing is skipped with one log line; a
row that does not parse stops the run with one line naming the file and line (``MalformedDataError``: exit 2 from
``python -m grounding``). The one exception is QQP: early copies of its ``train.tsv`` hold a few rows with a stray
tab (GLUE-baselines issue 5; jiant and Hugging Face skip them), which are skipped and counted in one line.

Every example is tokenized once, at setup, with the text encoder's tokenizer (sentence pairs as ``[CLS] a [SEP] b
[SEP]`` with segment ids), truncated to ``max_length``. A batch holds examples of one task's split only
(:class:`TaskBatchSampler`; training batches of all tasks shuffled together: each task's share of the steps is its
share of the examples, jiant's ``proportional`` weighting):

``{"task": "mrpc", "eval_set": "mrpc", "input_ids": long (B, T), "attention_mask": long (B, T), "token_type_ids":
long (B, T), "labels": long (B,) class ids or float (B,) STS-B scores in [0, 5], "rows": long (B,) rows of the file}``
plus ``"states"`` float (B, T, d) when a token-state store is attached to the file (:attr:`GlueFile.states`: the
frozen encoder's last hidden states, computed once by the probe; see grounding/vgbert/glue_probe.py), or
``"summary_states"`` float (B, d) when the store gives one vector an example (its mean state).
"""

from __future__ import annotations

import csv
import hashlib
import logging
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset, Sampler

from grounding.encoders import load_tokenizer
from grounding.paths import resolve_path

from .file_checks import MalformedDataError, MissingDataError, require_root

log = logging.getLogger(__name__)

LAYOUT = ("<root>/<TASK>/train.tsv and dev.tsv (MNLI: dev_matched.tsv, dev_mismatched.tsv), as the GLUE download "
          "script writes them; TASK in CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI")
FIX = "download GLUE again with its download script (glue_data/), or fix the row"
STSB_RANGE = (0.0, 5.0)


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task: its folder, its columns (header names; indices for a headerless file), its label strings in
    class order (none: a regression on scores), its GLUE metrics and its evaluation files ``(suffix, file)``, each
    an evaluation set named ``key + suffix`` (MNLI's ``mnli_m`` and ``mnli_mm``)."""

    name: str
    key: str
    text_a: str | int
    text_b: str | int | None
    label: str | int
    labels: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ("acc",)
    eval_files: tuple[tuple[str, str], ...] = (("", "dev.tsv"),)
    columns: int | None = None  # a headerless file: the number of fields a row has
    skip_broken_rows: bool = False

    @property
    def regression(self) -> bool:
        return not self.labels

    @property
    def num_outputs(self) -> int:
        return len(self.labels) or 1

    @property
    def eval_sets(self) -> list[tuple[str, str]]:
        """``(evaluation-set name, file name)`` of each dev set."""
        return [(self.key + suffix, file) for suffix, file in self.eval_files]

    def files(self) -> list[str]:
        return ["train.tsv", *(file for _, file in self.eval_files)]


BINARY = ("0", "1")
NLI = ("entailment", "not_entailment")
TASKS: dict[str, GlueTask] = {t.name: t for t in (
    GlueTask("CoLA", "cola", 3, None, 1, BINARY, ("mcc",), columns=4),
    GlueTask("SST-2", "sst2", "sentence", None, "label", BINARY),
    GlueTask("MRPC", "mrpc", "#1 String", "#2 String", "Quality", BINARY, ("f1", "acc")),
    GlueTask("STS-B", "stsb", "sentence1", "sentence2", "score", (), ("pearson", "spearman")),
    GlueTask("QQP", "qqp", "question1", "question2", "is_duplicate", BINARY, ("f1", "acc"), skip_broken_rows=True),
    GlueTask("MNLI", "mnli", "sentence1", "sentence2", "gold_label", ("entailment", "neutral", "contradiction"),
             eval_files=(("_m", "dev_matched.tsv"), ("_mm", "dev_mismatched.tsv"))),
    GlueTask("QNLI", "qnli", "question", "sentence", "label", NLI),
    GlueTask("RTE", "rte", "sentence1", "sentence2", "label", NLI),
    GlueTask("WNLI", "wnli", "sentence1", "sentence2", "label", BINARY),
)}
TASKS_BY_KEY = {t.key: t for t in TASKS.values()}


def glue_task(name: str) -> GlueTask:
    """A task by folder name or key, any case, with or without the hyphen (``SST-2``, ``sst2``, ``sts-b``)."""
    wanted = name.strip().lower().replace("-", "")
    for task in TASKS.values():
        if wanted in (task.key, task.name.lower().replace("-", "")):
            return task
    raise ValueError(f"unknown GLUE task {name!r}; the tasks are {', '.join(TASKS)}")


def _bad_row(task: GlueTask, path: Path, line: int, problem: str) -> MalformedDataError:
    return MalformedDataError(f"GLUE {task.name}: {path}:{line}: {problem}; fix: {FIX}")


@dataclass
class GlueFile:
    """One TSV of a task, parsed and tokenized: every example's token ids packed (``ids[offsets[i]:offsets[i+1]]``,
    with their segment ids in ``types``) and its label (class id; STS-B: the score). ``states``: a token-state store
    (``states[i]``: the encoder's (T_i, d) states of example i) attached by the probe, or None."""

    task: GlueTask
    path: Path
    labels: np.ndarray
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    types: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    states: object | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def example(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.ids[a:b], self.types[a:b]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def subset(self, rows: np.ndarray) -> GlueFile:
        """The file's examples ``rows`` (in that order) as a file of their own (no states)."""
        lengths = self.lengths()[rows]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        take = np.concatenate([np.arange(self.offsets[r], self.offsets[r + 1]) for r in rows]) if len(rows) else \
            np.zeros(0, np.int64)
        return GlueFile(self.task, self.path, self.labels[rows], self.ids[take], self.types[take], offsets)

    def fingerprint(self) -> str:
        """A hash of what the encoder sees (token and segment ids): the key of the file's token states."""
        h = hashlib.sha1()
        for array in (self.offsets, self.ids, self.types):
            h.update(np.ascontiguousarray(array).tobytes())
        return h.hexdigest()


def _header_columns(task: GlueTask, path: Path, header: list[str]) -> tuple[list[int | None], int]:
    """The indices of the text and label columns in the header row, and the number of fields a row has."""
    wanted = [task.text_a, task.text_b, task.label]
    missing = [c for c in wanted if c is not None and c not in header]
    if missing:
        raise _bad_row(task, path, 1, f"the header lacks column(s) {missing} (found {header})")
    return [None if c is None else header.index(c) for c in wanted], len(header)


def _label(task: GlueTask, path: Path, line: int, value: str) -> float:
    if task.regression:
        try:
            score = float(value)
        except ValueError:
            score = math.nan
        if not STSB_RANGE[0] <= score <= STSB_RANGE[1]:
            raise _bad_row(task, path, line, f"score {value!r} is not a number in [0, 5]")
        return score
    if value not in task.labels:
        raise _bad_row(task, path, line, f"label {value!r} is not one of {list(task.labels)}")
    return float(task.labels.index(value))


def read_task_file(task: GlueTask, path: Path) -> tuple[list[str], list[str] | None, np.ndarray]:
    """The first and second sentences (None for single-sentence tasks) and the labels of one GLUE TSV (class ids
    as int64; STS-B scores as float32). A row that does not parse raises :class:`MalformedDataError` naming the
    file and line."""
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 24))  # MNLI's parse-tree columns are long
    texts_a, texts_b, labels, broken = [], [], [], []
    columns, width = ([task.text_a, task.text_b, task.label], task.columns) if task.columns else (None, 0)
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            for row in reader:
                line = reader.line_num
                if not row:
                    continue
                if columns is None:
                    columns, width = _header_columns(task, path, row)
                    continue
                if len(row) != width:
                    if task.skip_broken_rows:
                        broken.append(line)
                        continue
                    raise _bad_row(task, path, line, f"{len(row)} tab-separated field(s), expected {width}")
                labels.append(_label(task, path, line, row[columns[2]].strip()))
                texts_a.append(row[columns[0]])
                if columns[1] is not None:
                    texts_b.append(row[columns[1]])
    except UnicodeDecodeError as e:
        raise MalformedDataError(f"GLUE {task.name}: {path} is not UTF-8 text (byte {e.start}); fix: {FIX}") from None
    if broken:
        log.warning("GLUE %s: %s: skipped %d row(s) with the wrong number of fields (first at line %d; a known defect "
                    "of early copies of the file)", task.name, path, len(broken), broken[0])
    dtype = np.float32 if task.regression else np.int64
    return texts_a, (texts_b if columns[1] is not None else None), np.array(labels, dtype=dtype)


def tokenize_file(task: GlueTask, path: Path, tokenizer, max_length: int) -> GlueFile:
    """:func:`read_task_file`, tokenized (pairs with segment ids, truncated longest-first to ``max_length``)."""
    texts_a, texts_b, labels = read_task_file(task, path)
    if not len(labels):
        return GlueFile(task, path, labels)
    enc = tokenizer(texts_a, texts_b, truncation=True, max_length=max_length, return_token_type_ids=True)
    lengths = np.fromiter((len(x) for x in enc["input_ids"]), dtype=np.int64, count=len(labels))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = np.fromiter((t for x in enc["input_ids"] for t in x), dtype=np.int32, count=int(offsets[-1]))
    types = np.fromiter((t for x in enc["token_type_ids"] for t in x), dtype=np.int8, count=int(offsets[-1]))
    return GlueFile(task, path, labels, ids, types, offsets)


@dataclass
class GlueSplit:
    """Rows of one task file that form one evaluation set (or the task's share of train / val)."""

    name: str
    file: GlueFile
    rows: np.ndarray

    @property
    def task(self) -> GlueTask:
        return self.file.task

    def __len__(self) -> int:
        return len(self.rows)


class GlueDataset(Dataset):
    """The examples of several :class:`GlueSplit` one after the other (item ``i`` of split ``s`` at
    ``starts[s] + i``)."""

    def __init__(self, splits: Sequence[GlueSplit]):
        self.splits = [s for s in splits if len(s)]
        self.starts = np.concatenate([[0], np.cumsum([len(s) for s in self.splits])]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def sizes(self) -> list[int]:
        return [len(s) for s in self.splits]

    def __getitem__(self, index: int) -> dict:
        s = int(np.searchsorted(self.starts, index, side="right") - 1)
        split = self.splits[s]
        row = int(split.rows[index - self.starts[s]])
        ids, types = split.file.example(row)
        item = {"split": s, "row": row, "ids": ids, "types": types, "label": split.file.labels[row]}
        if split.file.states is not None:
            item["states"] = split.file.states[row]
        return item


class TaskBatchSampler(Sampler):
    """Batches of one split each. ``shuffle``: each split's order drawn anew every epoch (seeded by seed and epoch)
    and the batches of all splits shuffled together; else each split in order, one after the other."""

    def __init__(self, sizes: Sequence[int], batch_size: int, shuffle: bool = False, seed: int = 0):
        self.sizes, self.batch_size, self.shuffle, self.seed = list(sizes), batch_size, shuffle, seed
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return sum(-(-n // self.batch_size) for n in self.sizes)

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        self.epoch += 1  # without set_epoch (plain loops) each pass still differs
        batches = []
        for start, n in zip(self.starts[:-1], self.sizes):
            order = rng.permutation(n) if self.shuffle else np.arange(n)
            batches += [(start + order[i:i + self.batch_size]).tolist() for i in range(0, n, self.batch_size)]
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        yield from batches


class GlueCollate:
    """Items of one split -> a padded batch (see the module docstring)."""

    def __init__(self, splits: Sequence[GlueSplit], pad_id: int = 0):
        self.names = [(s.task.key, s.name, s.task.regression) for s in splits]
        self.pad_id = pad_id

    def __call__(self, items: list[dict]) -> dict:
        task, eval_set, regression = self.names[items[0]["split"]]
        if any(it["split"] != items[0]["split"] for it in items):
            raise ValueError("a GLUE batch mixes tasks; batch with TaskBatchSampler")
        width = max(len(it["ids"]) for it in items)
        ids = torch.full((len(items), width), self.pad_id, dtype=torch.long)
        types = torch.zeros(len(items), width, dtype=torch.long)
        mask = torch.zeros(len(items), width, dtype=torch.long)
        for i, it in enumerate(items):
            n = len(it["ids"])
            ids[i, :n], types[i, :n], mask[i, :n] = torch.from_numpy(it["ids"].astype(np.int64)), \
                torch.from_numpy(it["types"].astype(np.int64)), 1
        labels = torch.tensor([it["label"] for it in items], dtype=torch.float32 if regression else torch.long)
        batch = {"task": task, "eval_set": eval_set, "input_ids": ids, "attention_mask": mask, "token_type_ids": types,
                 "labels": labels, "rows": torch.tensor([it["row"] for it in items], dtype=torch.long)}
        if "states" in items[0] and np.ndim(items[0]["states"]) == 1:  # a summary of each example's states
            batch["summary_states"] = torch.from_numpy(np.stack([it["states"] for it in items]).astype(np.float32))
        elif "states" in items[0]:
            states = torch.zeros(len(items), width, items[0]["states"].shape[-1])
            for i, it in enumerate(items):
                states[i, :len(it["states"])] = torch.from_numpy(np.asarray(it["states"], dtype=np.float32))
            batch["states"] = states
        return batch


class GlueDataModule(LightningDataModule):
    """The GLUE tasks found under ``root`` (see the module docstring).

    Args:
        root: the GLUE folder (``glue_data/``; ``../shared/data/glue`` here).
        tasks: the tasks to use (names or keys: ``[CoLA, sst2, STS-B]``); None: every task whose files are there.
        text_encoder: whose tokenizer (linked from the probe's network by ``python -m grounding``).
        max_length: tokens per example, pair included (truncated longest-first).
        batch_size / eval_batch_size: examples per training / evaluation batch (one task a batch).
        val_fraction: the share of each task's ``train.tsv`` held out as ``val`` (seeded), at most
            ``max_val_examples`` a task; the rest trains.
        train_limit / eval_limit: at most this many training (a seeded sample) / val and test (the first) examples a
            task: smoke runs.
        num_workers: DataLoader workers. seed: the held-out draw and the training order.
    """

    def __init__(self, root: str = "../shared/data/glue", tasks: list[str] | None = None, text_encoder: str = "minilm",
                 max_length: int = 128, batch_size: int = 32, eval_batch_size: int | None = None,
                 val_fraction: float = 0.1, max_val_examples: int | None = 2000, train_limit: int | None = None,
                 eval_limit: int | None = None, num_workers: int = 0, seed: int = 0):
        super().__init__()
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must lie in (0, 1) (the held-out part of train.tsv that selects the "
                             f"checkpoint); got {val_fraction}")
        self.root, self.text_encoder, self.max_length = root, text_encoder, max_length
        self.tasks = None if tasks is None else list(dict.fromkeys(glue_task(t) for t in tasks))
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.val_fraction, self.max_val_examples = val_fraction, max_val_examples
        self.train_limit, self.eval_limit = train_limit, eval_limit
        self.num_workers, self.seed = num_workers, seed
        self.datasets: dict[str, GlueDataset] | None = None

    @property
    def root_path(self) -> Path:
        return resolve_path(self.root)

    def present_tasks(self, report: bool = True) -> list[GlueTask]:
        """The chosen tasks whose files are all there; each other one is skipped (``report``: with a log line)."""
        root = require_root(self.root_path, "GLUE", LAYOUT, "give the glue_data folder the GLUE download script "
                            "writes (../shared/data/glue holds CoLA, SST-2, MRPC, STS-B, RTE, WNLI and QNLI's dev set)")
        found = []
        for task in self.tasks or TASKS.values():
            missing = [name for name in task.files() if not (root / task.name / name).is_file()]
            if missing and report:
                log.warning("GLUE %s: skipped (missing %s in %s)", task.name, ", ".join(missing), root / task.name)
            elif not missing:
                found.append(task)
        if not found:
            raise MissingDataError(f"GLUE at {root}: no task has all its files ({LAYOUT}); fix: point root at a "
                                   "glue_data folder")
        return found

    def check_inputs(self) -> None:
        """Every present task's files parse (``python -m grounding`` asks before it builds the model)."""
        for task in self.present_tasks(report=False):  # setup reports the skipped tasks
            for name in task.files():
                read_task_file(task, self.root_path / task.name / name)

    def setup(self, stage: str | None = None) -> None:
        if self.datasets is not None:
            return
        tokenizer = load_tokenizer(self.text_encoder)
        splits: dict[str, list[GlueSplit]] = {"train": [], "val": [], "test": []}
        for task in self.present_tasks():
            folder = self.root_path / task.name
            train = tokenize_file(task, folder / "train.tsv", tokenizer, self.max_length)
            train_rows, val_rows = self.held_out(task, len(train))
            if self.train_limit or self.eval_limit:  # only the rows used: the probe encodes whole files
                used = np.union1d(train_rows, val_rows)
                train, train_rows, val_rows = train.subset(used), np.searchsorted(used, train_rows), \
                    np.searchsorted(used, val_rows)
            splits["train"].append(GlueSplit(task.key, train, train_rows))
            splits["val"].append(GlueSplit(task.key, train, val_rows))
            for name, file in task.eval_sets:
                dev = tokenize_file(task, folder / file, tokenizer, self.max_length)
                if self.eval_limit and self.eval_limit < len(dev):
                    dev = dev.subset(np.arange(self.eval_limit))
                splits["test"].append(GlueSplit(name, dev, np.arange(len(dev))))
        self.datasets = {name: GlueDataset(s) for name, s in splits.items()}
        for name, ds in self.datasets.items():
            log.info("GLUE %s: %s", name, ", ".join(f"{s.name} {len(s)}" for s in ds.splits))

    def held_out(self, task: GlueTask, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(train rows, val rows) of a task's ``train.tsv`` of ``n`` rows: a seeded draw, the same for every
        encoder (seeded by ``seed`` and the task)."""
        rng = np.random.default_rng([self.seed, zlib.crc32(task.key.encode())])
        order = rng.permutation(n)
        n_val = min(max(1, round(self.val_fraction * n)), self.max_val_examples or n, n - 1) if n > 1 else 0
        val = np.sort(order[:n_val][: self.eval_limit or n])
        train = np.sort(order[n_val:][: self.train_limit or n])
        return train, val

    # -- the files and loaders --------------------------------------------------------------------
    def split_files(self, split: str) -> list[GlueFile]:
        """The task files a split reads, each once (what the probe attaches token states to)."""
        if self.datasets is None:
            self.setup()
        return list({id(s.file): s.file for s in self.datasets[split].splits}.values())

    def _loader(self, split: str, train: bool) -> DataLoader:
        if self.datasets is None:
            self.setup()
        ds = self.datasets[split]
        sampler = TaskBatchSampler(ds.sizes(), self.batch_size if train else self.eval_batch_size, shuffle=train,
                                   seed=self.seed)
        pad = load_tokenizer(self.text_encoder).pad_token_id or 0
        return DataLoader(ds, batch_sampler=sampler, collate_fn=GlueCollate(ds.splits, pad),
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", False)


__all__ = ["GlueDataModule", "GlueDataset", "GlueFile", "GlueSplit", "GlueTask", "TASKS", "TASKS_BY_KEY",
           "TaskBatchSampler", "glue_task", "read_task_file", "tokenize_file"]

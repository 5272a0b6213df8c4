"""The leaderboard: what it reads (a YAML of a test set and its models), how it tests each model, what it writes.

A leaderboard YAML (``experiments/leaderboard/*.yaml``)::

    test_set:
      name: world
      captions: {class_path: data_modules.FlickrDataModule, init_args: {root: data/world/flickr}}
      world_meta: data/world/world.json         # compositional: the test captions naming a held-out pair
      compositional_split: null                 # or an MCD split file (Karpathy JSON): its t2i R@1
    out: reports/leaderboard/world
    models:
      - {name: COMPOSER, paper: COMPOSER, config: experiments/composer/composer_world.yaml,
         ckpt: outputs/composer/world/checkpoints/last.ckpt, command: make composer}
      - {name: SemCLIP, paper: SemCLIP, command: make semclip,
         semclip: {vlm: suite:..., transform: .../transform.pt, ste: .../embedding}, runs: [...]}
    published:                                  # rows quoted from papers, printed below the suite's
      - {name: m-CNN, source: "Ma et al. 2015", encoders: "VGG19 | word CNN",
         i2t: [24.8, 53.7, 67.1], t2i: [20.3, 47.6, 61.7]}

``other_seeds``: checkpoints (globs allowed) of the same config trained with other seeds; those that exist are tested
too (but not one whose run's ``fit_record.json`` has fewer epochs than its ``config.yaml`` asks for: a stopped fit is
logged, not counted), the recalls are their means, rsum gets its standard deviation over the runs, and the interval
is that of the mean rsum (every run scored on the same resampled test images). A cross-encoder row may rerank another row's scores:
``first_stage: <that row's name>`` and ``rerank_top_k: K`` (the first stage is tested first; its scores of the same
test set reach the cross-encoder's test loop as ``first_stage_scores``, and its recall@K, the rerank's ceiling, is
printed beside the row). An ensemble row (``ensemble: [<row>, <row>, ...]``, optional ``weights``) fuses the test
scores of earlier rows that rerank nothing (each member's matrix z-scored, then averaged:
:func:`grounding.retrieval_metrics.fuse_scores`); with seeds, ensemble i fuses seed i of every member. A model's ``ckpt`` may
be a glob (``outputs/x/checkpoints/best-*.ckpt``: the checkpoint selected on the validation split, whose name
carries its epoch); it must match exactly one file. ``encoders`` (optional): the row's image and
text encoders, printed in the table.

A LightningModule's row: ``python -m grounding test --config <config> --ckpt_path <ckpt>`` with one override, the
test set's caption DataModule as the stage's ``data`` (VG-BERT's caption stages) or as COMPOSER's
``data.init_args.captions`` (COMPOSER and its baselines), so every model reads the same images and captions; its
batch sizes and the linked text/image settings stay the stage's. Recalls come from the score matrix the module
kept (``module.scored["test"]``) through :func:`grounding.retrieval_metrics.retrieval_metrics`, the function the stage's
own ``test`` logs with, and are checked against what it logged. Compositional R@1: text->image R@1 of the test
captions naming one of the world's held-out attribute–object pairs, or, with ``compositional_split``, of a second
test run on that split (an MCD split of real data). SemCLIP's row: its content store (the test set's training
captions as the text bank, the test images ingested by Eq. 7, each test caption a query) on its VLM; optional keys:
``query_mode`` (``ste``), ``bank_images`` (a file of training image names: only their captions form the bank). A
SemCLIP row's ``config`` (optional) names its Γ_t's fit config, which the scaling curve refits at every size.

Columns: the recalls and rsum with its 95 % bootstrap interval (:func:`grounding.retrieval_metrics.rsum_interval`: test
images resampled with their captions), the median ranks, the rerank's ceiling for a cross-encoder that reranks a
first stage's top K (``first_stage/t2i_r{K}``, logged by its test loop), compositional R@1, training time and
epochs (``fit_record.json`` of the model's run folders, summed), parameters (all, and trainable when trained by
the suite), and milliseconds per text query (the whole test run's wall time over its captions: image encoding
included, caches warm after a first run). A model whose files are missing is a skipped row naming the command that makes them.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import math
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import yaml
from lightning.pytorch import Callback
from matplotlib.figure import Figure

from grounding.checkpoints import checkpoint_class
from grounding.cli import resolved_config, run_test_subcommand
from grounding.composer.data import held_out_pair_mask
from grounding.docs_tables import provenance, write_record
from grounding.errors import UserInputError
from grounding.leaderboard.graded import GradedSplitError, Selection, restrict, select, split_result, write_graded
from grounding.leaderboard.splits import SplitEvalError, SplitFile, find_splits
from grounding.lightning import read_fit_record
from grounding.nets import class_of
from grounding.paths import resolve_path
from grounding.retrieval_metrics import (
    RetrievalScores,
    fuse_scores,
    retrieval_metrics,
    rsum_interval,
    save_first_stage,
    subset_t2i_recalls,
)
from grounding.semclip.alignment import check_fitted_vlm, load_transform
from grounding.semclip.ste import STEEmbedding
from grounding.semclip.store import QUERY_MODES, SemCLIPStore
from grounding.semclip.vlm import load_vlm
from grounding.stage_config import ConfigError
from grounding.utils.io import atomic_path, atomic_write_csv, atomic_write_text, sha1_of_json

COMPOSER_DATA = "grounding.composer.data.ComposerDataModule"
RECALLS = ("t2i_r1", "t2i_r5", "t2i_r10", "i2t_r1", "i2t_r5", "i2t_r10", "rsum")
COLUMNS = ("model", "paper", "encoders", *RECALLS, "rsum_sd", "seeds", "rsum_low", "rsum_high", "t2i_medr", "i2t_medr", "first_stage",
           "compositional_r1", "train_minutes", "epochs", "params_m", "trainable_m", "ms_per_query", "status", "command",
           "ckpt")
# the columns a docs table rendered from the leaderboard's record shows by default (each row keeps every key of
# COLUMNS: a marker may select them; rsum_ci prints [rsum_low, rsum_high]) and their headers (grounding.docs_tables)
RECORD_COLUMNS = ("model", *RECALLS, "rsum_sd", "rsum_ci", "compositional_r1")
RECORD_LABELS = {"t2i_r1": "t2i R@1", "t2i_r5": "R@5", "t2i_r10": "R@10", "i2t_r1": "i2t R@1", "i2t_r5": "R@5",
                 "i2t_r10": "R@10", "rsum_sd": "sd", "rsum_ci": "95 % CI", "t2i_medr": "medr t2i",
                 "i2t_medr": "medr i2t", "first_stage": "first stage", "compositional_r1": "comp. R@1",
                 "train_minutes": "train min", "params_m": "params M", "trainable_m": "trainable M", "ms_per_query": "ms/query"}
BOOTSTRAP_RESAMPLES = 1000
# a row's recalls and the stage's own logged test metrics agree to this (percent points; float32 logging)
AGREEMENT = 1e-3


class LeaderboardError(UserInputError, ValueError):
    """A leaderboard YAML, test set or model entry that cannot be used (one line, exit status 2)."""


@dataclass
class TestSet:
    """The images and captions every model is tested on (``captions``: a caption DataModule's class_path and
    init_args; its ``test`` split), and where the compositional column comes from."""

    __test__ = False  # not a pytest class

    name: str
    captions: dict
    world_meta: str | None = None
    compositional_split: str | None = None


@dataclass
class ModelEntry:
    """One row: a suite LightningModule (``config`` + ``ckpt``), SemCLIP (``semclip``: vlm, transform, ste,
    query_mode) or an ensemble of earlier rows (``ensemble``: their names, ``weights`` optional), the ``command`` that
    makes its files, and the run folders whose training time it sums."""

    name: str
    command: str
    paper: str = ""
    config: str | None = None
    ckpt: str | None = None
    semclip: dict | None = None
    runs: list[str] = field(default_factory=list)
    encoders: str = ""
    first_stage: str | None = None
    rerank_top_k: int | None = None
    other_seeds: list[str] = field(default_factory=list)
    ensemble: list[str] = field(default_factory=list)
    weights: list[float] | None = None
    demo_ckpt: str | None = None  # the explorer shows this checkpoint while ``ckpt`` is not made (``make demo``'s)

    def checkpoint(self) -> Path | None:
        """``ckpt`` resolved; a glob must match exactly one file (None when it matches none)."""
        if not self.ckpt:
            return None
        if not any(c in self.ckpt for c in "*?["):
            return resolve_path(self.ckpt)
        pattern = resolve_path(self.ckpt)
        found = sorted(pattern.parent.glob(pattern.name)) if pattern.parent.is_dir() else []
        if len(found) > 1:
            raise LeaderboardError(f"{self.name}: ckpt {self.ckpt} matches {len(found)} files "
                                   f"({', '.join(f.name for f in found[:3])}); keep one or name it")
        return found[0] if found else None

    def seed_checkpoints(self, finished: bool = True) -> list[Path]:
        """The ``other_seeds`` checkpoints that exist (a glob matching several files is an error): those of finished
        fits (``finished``; a fit whose record says it stopped early is not a seed's result yet), or the others."""
        found = [replace(self, ckpt=c).checkpoint() for c in self.other_seeds]
        found = [c for c in found if c is not None and c.exists()]
        return [c for c in found if (fit_progress(c.parent.parent) is None) == finished]

    def run_folders(self) -> list[Path]:
        if self.runs:
            return [resolve_path(r) for r in self.runs]
        ckpt = resolve_path(self.ckpt) if self.ckpt else None
        return [ckpt.parent.parent] if ckpt is not None else []


def fit_progress(run: Path) -> tuple[int, int] | None:
    """(epochs trained, max_epochs) of a run folder whose ``fit_record.json`` records fewer epochs than its
    ``config.yaml`` asks for; None when the fit finished, or when either file does not say."""
    record = read_fit_record(run)
    if record is None:
        return None
    epochs = record["epochs"]
    try:
        max_epochs = int(((yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8")) or {})
                          .get("trainer") or {}).get("max_epochs"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError):
        return None
    return (epochs, max_epochs) if 0 < max_epochs and epochs < max_epochs else None


@dataclass
class PublishedRow:
    """A result quoted from a paper on the same benchmark: recalls at 1 / 5 / 10 each way, its source and encoders."""

    name: str
    source: str
    i2t: list[float]
    t2i: list[float]
    encoders: str = ""
    note: str = ""

    def row(self) -> dict:
        row = {"model": self.name, "paper": self.source, "encoders": self.encoders, "status": "published",
               "command": self.note}
        for direction, values in (("i2t", self.i2t), ("t2i", self.t2i)):
            row.update({f"{direction}_r{k}": float(v) for k, v in zip((1, 5, 10), values)})
        row["rsum"] = sum(self.i2t) + sum(self.t2i)
        return row


@dataclass
class Leaderboard:
    test_set: TestSet
    models: list[ModelEntry]
    out: str
    source: str = ""
    published: list[PublishedRow] = field(default_factory=list)


# ------------------------------------------------------------------------------------------ reading
def _need(mapping: dict, key: str, kind, where: str):
    value = mapping.get(key)
    if not isinstance(value, kind):
        raise LeaderboardError(f"{where}: `{key}` must be a {getattr(kind, '__name__', kind)}; got {value!r}")
    return value


PATHS = "paths"  # a list of strings
# A model row's keys and what each must hold (a value of another type, or another key, is one line naming the file,
# the row and the key): an unquoted number where a path belongs (ckpt: 12345) is YAML's int, not a file name.
ROW_FIELDS = {"name": (str, "a string"), "command": (str, "a string (the command that makes the row's files)"),
              "paper": (str, "a string"), "encoders": (str, "a string"),
              "config": (str, "a path (a stage config, experiments/.../*.yaml)"),
              "ckpt": (str, "a path (a .ckpt file or a glob matching one)"),
              "semclip": (dict, "a mapping (vlm, transform, ste; optional query_mode, bank_images)"),
              "runs": (PATHS, "a list of run folders"), "other_seeds": (PATHS, "a list of checkpoint paths (globs allowed)"),
              "first_stage": (str, "another row's name"), "rerank_top_k": (int, "an integer >= 1"),
              "ensemble": (PATHS, "a list of earlier rows' names"), "weights": (list, "a list of non-negative numbers"),
              "demo_ckpt": (str, "a path (the checkpoint the explorer shows while ckpt is not made yet)")}
SEMCLIP_FIELDS = ("vlm", "transform", "ste", "query_mode", "bank_images")


def _unknown_key(keys, allowed, where: str, what: str) -> None:
    stray = [k for k in keys if k not in allowed]
    if stray:
        close = difflib.get_close_matches(str(stray[0]), list(allowed), n=1)
        raise LeaderboardError(f"{where}: unknown key `{stray[0]}`" + (f" (did you mean `{close[0]}`?)" if close else "")
                               + f"; {what} are {', '.join(allowed)}")


def check_row_fields(m: dict, where: str) -> None:
    """Each key of a model row is one it has (:data:`ROW_FIELDS`), holding what it must; ``None`` is absent."""
    label = f"{where} ({m['name']})" if isinstance(m.get("name"), str) else where
    _unknown_key(m, ROW_FIELDS, label, "a model row's keys")
    for key, (kind, what) in ROW_FIELDS.items():
        value = m.get(key)
        if value is None:
            continue
        if kind == PATHS:
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        else:
            ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            if kind == PATHS:
                hint = " (quote each item in the YAML)" if isinstance(value, list) else f" (write a YAML list: [{value}])"
            else:
                hint = " (quote it in the YAML: a path is a string)" if key in ("ckpt", "config") else ""
            raise LeaderboardError(f"{label}: `{key}` must be {what}; got {value!r} ({type(value).__name__}){hint}")
    semclip = m.get("semclip")
    if isinstance(semclip, dict):
        _unknown_key(semclip, SEMCLIP_FIELDS, f"{label}: semclip", "its keys")
        if semclip.get("query_mode", "ste") not in QUERY_MODES:
            raise LeaderboardError(f"{label}: semclip.query_mode must be one of {', '.join(QUERY_MODES)}; got "
                                   f"{semclip['query_mode']!r}")


def load_leaderboard(path: str | Path) -> Leaderboard:
    """Read and check a leaderboard YAML (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise LeaderboardError(f"--config {path}: no such file; give a leaderboard YAML such as "
                               "experiments/leaderboard/world.yaml")
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise LeaderboardError(f"{path}: not readable YAML ({' '.join(str(e).split())}); fix the file") from None
    if not isinstance(cfg, dict):
        raise LeaderboardError(f"{path}: expected a mapping with test_set, models and out")
    _unknown_key(cfg, ("test_set", "out", "models", "published"), str(path), "a leaderboard's keys")
    ts = _need(cfg, "test_set", dict, str(path))
    _unknown_key(ts, ("name", "captions", "world_meta", "compositional_split"), f"{path}: test_set", "its keys")
    captions = _need(ts, "captions", dict, f"{path}: test_set")
    if not isinstance(captions.get("class_path"), str):
        raise LeaderboardError(f"{path}: test_set.captions needs a class_path (a caption DataModule such as "
                               "data_modules.FlickrDataModule) and its init_args")
    if not isinstance(captions.get("init_args") or {}, dict):
        raise LeaderboardError(f"{path}: test_set.captions.init_args must be a mapping of the DataModule's options "
                               f"(e.g. {{root: data/world/flickr}}); got {captions['init_args']!r}")
    for key, what in (("name", "a string"), ("world_meta", "a path (world.json)"),
                      ("compositional_split", "a path (an MCD split file)"), ("out", "a path (the output folder)")):
        value = (cfg if key == "out" else ts).get(key)
        if value is not None and not isinstance(value, str):
            raise LeaderboardError(f"{path}: {'' if key == 'out' else 'test_set.'}{key} must be {what}; got {value!r} "
                                   f"({type(value).__name__})")
    test_set = TestSet(str(ts.get("name") or path.stem), {"class_path": captions["class_path"],
                                                           "init_args": dict(captions.get("init_args") or {})},
                       ts.get("world_meta"), ts.get("compositional_split"))
    models = []
    for i, m in enumerate(_need(cfg, "models", list, str(path))):
        where = f"{path}: models[{i}]"
        if not isinstance(m, dict):
            raise LeaderboardError(f"{where}: expected a mapping (name, command, config + ckpt or semclip)")
        check_row_fields(m, where)
        entry = ModelEntry(name=_need(m, "name", str, where), command=_need(m, "command", str, where),
                           paper=str(m.get("paper") or ""), config=m.get("config"), ckpt=m.get("ckpt"),
                           semclip=m.get("semclip"), runs=list(m.get("runs") or []),
                           encoders=str(m.get("encoders") or ""), first_stage=m.get("first_stage"),
                           rerank_top_k=m.get("rerank_top_k"), other_seeds=[str(c) for c in m.get("other_seeds") or []],
                           ensemble=m.get("ensemble") or [], weights=m.get("weights"), demo_ckpt=m.get("demo_ckpt"))
        if entry.ensemble:
            _check_ensemble(entry, m, where)
            models.append(entry)
            continue
        if entry.other_seeds and entry.semclip is not None:
            raise LeaderboardError(f"{where} ({entry.name}): other_seeds are checkpoints of a suite model, not SemCLIP's")
        if (entry.first_stage is None) != (entry.rerank_top_k is None) or (
                entry.rerank_top_k is not None and not (isinstance(entry.rerank_top_k, int) and entry.rerank_top_k >= 1)):
            raise LeaderboardError(f"{where} ({entry.name}): give `first_stage` (another row's name) and `rerank_top_k` "
                                   f"(an integer >= 1) together; got {entry.first_stage!r} and {entry.rerank_top_k!r}")
        if entry.semclip is None and not (entry.config and entry.ckpt):
            raise LeaderboardError(f"{where} ({entry.name}): give `config` and `ckpt` (a suite LightningModule) or "
                                   "`semclip` (vlm, transform, ste)")
        if entry.semclip is not None and not all(isinstance(entry.semclip.get(k), str) for k in ("vlm", "transform", "ste")):
            raise LeaderboardError(f"{where} ({entry.name}): semclip needs vlm, transform and ste paths")
        if entry.semclip is not None and not isinstance(entry.semclip.get("bank_images") or "", str):
            raise LeaderboardError(f"{where} ({entry.name}): semclip.bank_images must be a path (a file of training "
                                   f"image names, one a line); got {entry.semclip['bank_images']!r}")
        models.append(entry)
    published = [_published(p, f"{path}: published[{i}]") for i, p in enumerate(cfg.get("published") or [])]
    names = [m.name for m in models] + [p.name for p in published]
    if len(set(names)) != len(names):
        raise LeaderboardError(f"{path}: model names must be distinct; got {names}")
    for i, m in enumerate(models):
        earlier = {e.name: e for e in models[:i]}
        exhaustive = sorted(k for k, e in earlier.items() if e.semclip is None and e.first_stage is None and not e.ensemble)
        stray = [n for n in m.ensemble if n not in exhaustive]
        if stray:
            raise LeaderboardError(f"{path}: {m.name}'s ensemble member {stray[0]!r} must name a suite model listed before "
                                   f"it that reranks nothing; one of {exhaustive}")
        if m.first_stage is not None and (m.first_stage not in earlier or earlier[m.first_stage].semclip is not None
                                          or earlier[m.first_stage].first_stage is not None
                                          or earlier[m.first_stage].ensemble):
            allowed = sorted(k for k, e in earlier.items() if e.semclip is None and e.first_stage is None
                             and not e.ensemble)
            raise LeaderboardError(f"{path}: {m.name}'s first_stage {m.first_stage!r} must name a suite model listed "
                                   f"before it that reranks nothing; one of {allowed}")
    return Leaderboard(test_set, models, str(cfg.get("out") or f"reports/leaderboard/{test_set.name}"), str(path),
                       published)


def _check_ensemble(entry: ModelEntry, m: dict, where: str) -> None:
    """An ensemble row names 2+ distinct earlier rows (checked against them by :func:`load_leaderboard`) and nothing of
    a model's own; ``weights`` (optional) one non-negative number per member."""
    members = entry.ensemble
    if not (isinstance(members, list) and len(members) >= 2 and all(isinstance(n, str) for n in members)
            and len(set(members)) == len(members)):
        raise LeaderboardError(f"{where} ({entry.name}): `ensemble` must list 2 or more distinct row names; got {members!r}")
    own = [k for k in ("config", "ckpt", "semclip", "first_stage", "rerank_top_k", "other_seeds", "runs") if m.get(k)]
    if own:
        raise LeaderboardError(f"{where} ({entry.name}): an ensemble row fuses its members' scores; remove `{own[0]}`")
    w = entry.weights
    if w is not None and not (isinstance(w, list) and len(w) == len(members)
                              and all(isinstance(x, (int, float)) and x >= 0 for x in w) and sum(w) > 0):
        raise LeaderboardError(f"{where} ({entry.name}): `weights` must be {len(members)} non-negative numbers with a "
                               f"positive sum, one per member; got {w!r}")


def _published(p, where: str) -> PublishedRow:
    if not isinstance(p, dict):
        raise LeaderboardError(f"{where}: expected a mapping (name, source, i2t, t2i)")
    recalls = {}
    for key in ("i2t", "t2i"):
        values = p.get(key)
        if not (isinstance(values, list) and len(values) == 3
                and all(isinstance(v, (int, float)) and 0 <= v <= 100 for v in values)):
            raise LeaderboardError(f"{where}: `{key}` must be [R@1, R@5, R@10] in percent; got {values!r}")
        recalls[key] = [float(v) for v in values]
    return PublishedRow(_need(p, "name", str, where), _need(p, "source", str, where), recalls["i2t"], recalls["t2i"],
                        str(p.get("encoders") or ""), str(p.get("note") or ""))


# ------------------------------------------------------------------------------------------ evaluation
class TestLoopTimer(Callback):
    """Wall seconds of the test loop alone (its batches and the module's epoch-end scoring; not the model's
    construction, the checkpoint's loading or the DataModule's setup): the per-query latency column."""

    __test__ = False  # not a pytest class

    def __init__(self):
        self.seconds = 0.0
        self._start = None

    def on_test_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()

    def on_test_end(self, trainer, pl_module) -> None:
        self.seconds = time.perf_counter() - self._start


TIMER_ARGS = [f"--trainer.callbacks+={TestLoopTimer.__module__}.{TestLoopTimer.__name__}"]


def _test_seconds(cli) -> float:
    return next(c.seconds for c in cli.trainer.callbacks if isinstance(c, TestLoopTimer))


def missing_files(entry: ModelEntry) -> list[str]:
    """The files of a row that do not exist yet (its checkpoint, or SemCLIP's VLM, Γ_t and STE): made by its ``command``."""
    if entry.ensemble:  # its members' rows say what is missing
        return []
    if entry.semclip is not None:
        spec = entry.semclip["vlm"]
        files = [entry.semclip["transform"], entry.semclip["ste"]]
        if spec.startswith("suite:"):
            files.append(spec.removeprefix("suite:"))
    else:
        ckpt = entry.checkpoint()
        return [] if ckpt is not None and ckpt.exists() else [entry.ckpt]
    return [f for f in files if not resolve_path(f).exists()]


def _caption_override(data_class: str, captions: dict, world_meta: str | None) -> dict:
    """The stage's data section pointed at ``captions``: COMPOSER's DataModule wraps a caption DataModule (its
    phrase queries off: they are no column, and a cross-encoder would score each against every image)."""
    if data_class == COMPOSER_DATA:
        return {"data": {"init_args": {"captions": captions, "world_meta": world_meta, "phrase_seed": None}}}
    return {"data": captions}


def split_captions(captions: dict, split_file: str) -> dict:
    """The test set's caption DataModule reading an MCD split file (Karpathy JSON) test-only."""
    args = dict(captions["init_args"], karpathy_file=str(resolve_path(split_file).resolve()), captions_file=None,
                test_only=True)  # absolute: the reader resolves a relative file under its root
    return {"class_path": captions["class_path"], "init_args": args}


def _flat_captions(dataset) -> list[str]:
    return [c for caps in dataset.captions for c in caps]


@dataclass
class Reference:
    """What every row must have been tested on: the test split's size and caption texts (sha1 in flat order)."""

    images: int
    captions: int
    sha1: str
    train_captions: list[str]

    @classmethod
    def of(cls, dm) -> "Reference":
        texts = _flat_captions(dm.test_dataset)
        return cls(len(dm.test_dataset), len(texts), sha1_of_json(texts), _flat_captions(dm.train_dataset))

    def check(self, name: str, images: int, texts: list[str]) -> None:
        if (images, len(texts), sha1_of_json(texts)) != (self.images, self.captions, self.sha1):
            raise LeaderboardError(f"{name}: tested on {images} images / {len(texts)} captions, not the test set's "
                                   f"{self.images} / {self.captions} (or other caption texts): the stage config overrides "
                                   "the test set's data (subsets.test, a caption file); remove that key")


def reference_data(test_set: TestSet, compositional: bool = False, split_file: str | None = None):
    """The test set's caption DataModule, built and set up (one clear :class:`LeaderboardError` when it cannot be):
    the reference every row is checked against; with ``compositional`` its MCD split's, with ``split_file`` that
    split's (a graded split)."""
    split_file = test_set.compositional_split if compositional else split_file
    captions = split_captions(test_set.captions, split_file) if split_file else test_set.captions
    where = f"test_set ({test_set.name})"
    if test_set.world_meta and not resolve_path(test_set.world_meta).is_file():
        raise LeaderboardError(f"{where}: world_meta {test_set.world_meta} does not exist; generate the world with "
                               "`make world` (or point world_meta at its world.json)")
    if split_file and not resolve_path(split_file).is_file():
        raise LeaderboardError(f"{where}: compositional_split {split_file} does not exist; make the "
                               "MCD split first (`make leaderboard-flickr8k` does: python -m grounding.composer mcd ...)")
    cls = class_of(captions["class_path"])
    if cls is None:
        raise LeaderboardError(f"{where}: captions.class_path {captions['class_path']!r} is no importable class "
                               "(e.g. data_modules.FlickrDataModule)")
    try:
        dm = cls(**captions["init_args"])
        dm.setup()
    except Exception as e:  # noqa: BLE001 - a reader's own error: reported as one line of the YAML's test set
        raise LeaderboardError(f"{where}: {captions['class_path']} cannot read it: {' '.join(str(e).split())[:400]}") from None
    if not len(dm.test_dataset):
        raise LeaderboardError(f"{where}: its test split is empty; point captions.init_args at data with a test split")
    return dm


def _fit_records(entry: ModelEntry) -> tuple[float | None, int | None]:
    """Training minutes (summed over the run folders) and the last folder's epochs; None when unrecorded."""
    seconds, epochs = 0.0, None
    for folder in entry.run_folders():
        record = read_fit_record(folder)
        if record is None or record["seconds"] is None:
            return None, None
        seconds += record["seconds"]
        epochs = record["epochs"]
    return seconds / 60.0, epochs


def _count(module: torch.nn.Module) -> tuple[float, float]:
    params = list({id(p): p for p in module.parameters()}.values())
    return sum(p.numel() for p in params) / 1e6, sum(p.numel() for p in params if p.requires_grad) / 1e6


def _scored_row(scored, texts: list[str], world_meta: str | None) -> dict:
    """Recalls of a kept score matrix, and compositional R@1 over the world's held-out-pair captions."""
    metrics = retrieval_metrics(scored.scores, scored.caption_image)
    row = {k: metrics[k] for k in (*RECALLS, "t2i_medr", "i2t_medr")}
    row["rsum_low"], row["rsum_high"] = rsum_interval(scored.scores, scored.caption_image,
                                                      n_resamples=BOOTSTRAP_RESAMPLES)
    if world_meta:
        mask = torch.from_numpy(held_out_pair_mask([texts[int(i)] for i in scored.caption_index], resolve_path(world_meta)))
        row["compositional_r1"] = subset_t2i_recalls(scored.scores, scored.caption_image, mask, ks=(1,)).get("t2i_r1")
    return row


def _stage_test(entry: ModelEntry, data_class: str, captions: dict, world_meta: str | None, workdir,
                reference: Reference, what: str = "", first_stage: Path | None = None):
    """The stage's own test loop on ``captions``, checked to have scored exactly the reference's captions.
    Returns the CLI, the kept score matrix, the split's flat caption texts and the loop's seconds."""
    name = f"{entry.name}{what}"
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            overrides = [_caption_override(data_class, captions, world_meta)]
            if first_stage is not None:
                overrides.append({"model": {"init_args": {"first_stage_scores": str(first_stage),
                                                          "rerank_top_k": entry.rerank_top_k}}})
            cli = run_test_subcommand(entry.config, str(entry.checkpoint()), workdir, overrides, TIMER_ARGS)
    except SystemExit as e:  # jsonargparse's usage error: its last line says what
        last = next((ln for ln in reversed(err.getvalue().splitlines()) if ln.strip()), f"exit status {e.code}")
        raise LeaderboardError(f"{name}: `python -m grounding test` stopped: {last.strip()}") from None
    scored = getattr(cli.model, "scored", {}).get("test")
    if scored is None:
        raise LeaderboardError(f"{name}: its test loop kept no score matrix ({type(cli.model).__name__} is not a "
                               "retrieval stage of the suite?)")
    texts = _flat_captions(cli.datamodule.test_dataset)
    reference.check(name, len(cli.datamodule.test_dataset), texts)
    if scored.scores.shape != (reference.images, reference.captions):
        raise LeaderboardError(f"{name}: its test loop scored {tuple(scored.scores.shape)} (images, captions), not "
                               f"({reference.images}, {reference.captions}): the stage config limits its test batches")
    return cli, scored, texts, _test_seconds(cli)


def evaluate_stage(entry: ModelEntry, test_set: TestSet, workdir: str | Path, reference: Reference,
                   compositional_reference: Reference | None = None, first_stage: dict | None = None,
                   ) -> tuple[dict, dict]:
    """A suite LightningModule's row: its own test loop on the test set (and on the compositional split), reranking
    ``first_stage`` ({"test": file, "comp": file} of :func:`grounding.retrieval_metrics.save_first_stage`) when given.
    Returns the row and the score matrices it tested with their caption texts ({"test": ..., "comp": ...}; with
    ``other_seeds``, "seeds": each other seed's test and compositional-split matrices)."""
    try:
        cfg = resolved_config(entry.config)
    except ConfigError as e:
        raise LeaderboardError(f"{entry.name}: {e}") from None
    data_class = str((cfg.get("data") or {}).get("class_path"))
    named, recorded = str((cfg.get("model") or {}).get("class_path")), checkpoint_class(entry.checkpoint())
    # stricter than the CLI (no checkpoint family): a row publishes its own model's numbers; one class under a
    # renamed module's old path (grounding/renamed_modules.py) is the same model
    if recorded is not None and recorded != named and class_of(recorded) is not class_of(named):
        raise LeaderboardError(f"{entry.name}: its ckpt {entry.checkpoint()} is a checkpoint of {recorded}, but its "
                               f"config names {named}; give the row its own model's checkpoint")
    first_stage = first_stage or {}
    cli, scored, texts, seconds = _stage_test(entry, data_class, test_set.captions, test_set.world_meta, workdir,
                                              reference, first_stage=first_stage.get("test"))
    kept = {"test": (scored, texts)}
    row = _scored_row(scored, texts, test_set.world_meta)
    replicas = [replace(entry, ckpt=str(c)) for c in entry.seed_checkpoints()]
    logged = {k.removeprefix("test/"): float(v) for k, v in cli.trainer.callback_metrics.items() if k.startswith("test/")}
    off = {k: (row[k], logged[k]) for k in RECALLS if k in logged and abs(row[k] - logged[k]) > AGREEMENT}
    if off:
        raise LeaderboardError(f"{entry.name}: the leaderboard's recalls differ from the stage's own test: {off}")
    net = getattr(cli.model, "net", None) or cli.model
    row["params_m"], row["trainable_m"] = _count(net)
    row["ms_per_query"] = 1000.0 * seconds / max(len(texts), 1)
    row["logged"] = logged
    row["ckpt"] = str(entry.checkpoint())
    first = sorted(k for k in logged if k.startswith("first_stage/t2i_r"))
    if first:  # a reranked test: the first stage's recall@K on the same queries, the rerank's ceiling
        row["first_stage"] = f"R@{first[0].removeprefix('first_stage/t2i_r')} {logged[first[0]]:.1f}"
    if compositional_reference is not None:
        split = split_captions(test_set.captions, test_set.compositional_split)
        _, comp, comp_texts, _ = _stage_test(entry, data_class, split, None, workdir, compositional_reference,
                                             " (compositional split)", first_stage=first_stage.get("comp"))
        row["compositional_r1"] = retrieval_metrics(comp.scores, comp.caption_image)["t2i_r1"]
        kept["comp"] = (comp, comp_texts)
    if replicas:  # (without a compositional split, seed_mean_row takes each run's held-out-pair R@1 from its scores)
        runs = [(scored, row.get("compositional_r1") if compositional_reference is not None else None)]
        kept["seeds"] = []  # each other seed's (test scores, compositional-split scores or None): for ensembles
        for replica in replicas:
            _, other, _, _ = _stage_test(replica, data_class, test_set.captions, test_set.world_meta, workdir, reference,
                                         f" ({Path(replica.ckpt).name})", first_stage=first_stage.get("test"))
            comp_r1, comp = None, None
            if compositional_reference is not None:
                _, comp, _, _ = _stage_test(replica, data_class, split, None, workdir, compositional_reference,
                                            " (compositional split)", first_stage=first_stage.get("comp"))
                comp_r1 = retrieval_metrics(comp.scores, comp.caption_image)["t2i_r1"]
            runs.append((other, comp_r1))
            kept["seeds"].append((other, comp))
        row.update(seed_mean_row([r for r, _ in runs], [c for _, c in runs], texts, test_set.world_meta))
    return row, kept


def seed_mean_row(runs: list[RetrievalScores], comp_r1: list, texts: list[str], world_meta: str | None) -> dict:
    """The recalls of several runs (seeds) of one model on one test split: means, rsum's standard deviation over the
    runs, and the interval of the mean rsum (the same resampled images for every run)."""
    rows = [_scored_row(r, texts, world_meta) for r in runs]
    out = {k: float(np.mean([r[k] for r in rows])) for k in (*RECALLS, "t2i_medr", "i2t_medr")}
    out["rsum_sd"] = float(np.std([r["rsum"] for r in rows], ddof=1))
    out["seeds"] = len(runs)
    out["rsum_low"], out["rsum_high"] = rsum_interval([r.scores for r in runs], runs[0].caption_image,
                                                      n_resamples=BOOTSTRAP_RESAMPLES)
    held_out = [r.get("compositional_r1") for r in rows]
    values = [c for c in comp_r1 if c is not None] or [c for c in held_out if c is not None]
    if values:
        out["compositional_r1"] = float(np.mean(values))
    return out


def _semclip_scores(entry: ModelEntry, dm, bank: list[str]) -> tuple[torch.Tensor, torch.Tensor, list[str], float, tuple]:
    test = dm.test_dataset
    transform, provenance = load_transform(resolve_path(entry.semclip["transform"]))
    spec = entry.semclip["vlm"]
    check_fitted_vlm(provenance, spec, entry.semclip["transform"])
    ste = STEEmbedding.load(resolve_path(entry.semclip["ste"]))
    vlm = load_vlm(f"suite:{resolve_path(spec.removeprefix('suite:'))}" if spec.startswith("suite:") else spec)
    texts = _flat_captions(test)
    store = SemCLIPStore(vlm, transform, ste, query_mode=entry.semclip.get("query_mode", "ste"))
    store.add_texts(bank)  # the text bank: the training captions (a test caption never tags an image)
    start = time.perf_counter()  # latency: ingesting the test images and answering every query, not the bank
    store.ingest(images=[str(p) for p in test.image_paths])
    scores = store.scores(texts).T.contiguous()  # (I, N)
    seconds = time.perf_counter() - start
    network = getattr(vlm, "net", None) or getattr(vlm, "model", None)  # the suite adapter's net, CLIP's model
    vlm_m = _count(network)[0] if isinstance(network, torch.nn.Module) else 0.0
    # trained by SemCLIP: Γ_t and the STE table (the VLM is used as given)
    trained = _count(transform)[0] + ste.vectors.numel() / 1e6
    return scores, test.caption_image_index, texts, seconds, (vlm_m + trained, trained)


def semclip_bank(entry: ModelEntry, train) -> list[str]:
    """SemCLIP's text bank: the training captions of the test set's DataModule (``train``, its train dataset), or,
    with ``semclip.bank_images`` (a file of image names, one a line, as a Γ_t's ``caption_images``), only those
    images' captions: a SemCLIP on N training photos (the scaling curve) tags with what it was trained on."""
    names_file = entry.semclip.get("bank_images")
    if not names_file:
        return _flat_captions(train)
    try:
        names = {line.strip() for line in resolve_path(names_file).read_text(encoding="utf-8").splitlines() if line.strip()}
    except OSError as e:
        raise LeaderboardError(f"{entry.name}: semclip.bank_images {names_file} cannot be read ({e.strerror}); expected "
                               "a file of training image names, one a line") from None
    bank = [c for path, caps in zip(train.image_paths, train.captions) if Path(path).name in names for c in caps]
    if not bank:
        raise LeaderboardError(f"{entry.name}: semclip.bank_images {names_file} names none of the test set's "
                               f"{len(train.image_paths)} training images; expected their file names (e.g. "
                               f"{Path(train.image_paths[0]).name if len(train.image_paths) else 'name.jpg'})")
    return bank


def evaluate_semclip(entry: ModelEntry, test_set: TestSet, dm, compositional_dm=None) -> dict:
    """SemCLIP's row: its content store on its VLM, queried with every test caption; the bank is the training
    captions of the test set's DataModule (also for the compositional split), or ``semclip.bank_images``' own."""
    bank = semclip_bank(entry, dm.train_dataset)
    scores, caption_image, texts, seconds, (params, trainable) = _semclip_scores(entry, dm, bank)
    scored = RetrievalScores(scores.float(), caption_image, torch.arange(len(texts)))
    row = _scored_row(scored, texts, test_set.world_meta)
    row.update(params_m=params, trainable_m=trainable, ms_per_query=1000.0 * seconds / max(len(texts), 1))
    if compositional_dm is not None:
        comp, comp_image, *_ = _semclip_scores(entry, compositional_dm, bank)
        row["compositional_r1"] = retrieval_metrics(comp.float(), comp_image)["t2i_r1"]
    return row


def evaluate(board: Leaderboard, only: list[str] | None = None, log: Callable[[str], None] = print,
             graded: bool = False, graded_splits_kept: int | None = None) -> list[dict]:
    """Every model's row (skipped when its files are missing, an error line when its evaluation fails). The test
    set is read first: a test set that cannot be read raises :class:`LeaderboardError`. With ``graded``, each row
    also gets its results on the MCD split's graded splits (``row["graded"]``, :mod:`grounding.leaderboard.graded`);
    ``graded_splits_kept``: a reranker (a test run per split) tests only that many of them, evenly spaced in
    divergence; the other rows cost nothing per split and get them all."""
    dm = reference_data(board.test_set)
    reference = Reference.of(dm)
    comp_dm = reference_data(board.test_set, compositional=True) if board.test_set.compositional_split else None
    comp_reference = Reference.of(comp_dm) if comp_dm is not None else None
    log(f"test set {board.test_set.name}: {reference.images} images, {reference.captions} captions"
        + (f"; compositional split {comp_reference.images} / {comp_reference.captions}" if comp_reference else ""))
    if graded_splits_kept is not None and graded_splits_kept < 1:
        raise LeaderboardError(f"--graded-splits {graded_splits_kept}: keep at least 1 graded split")
    splits = graded_splits(board.test_set, dm) if graded else []
    if splits:
        log(f"graded splits: {len(splits)} (the MCD split and {len(splits) - 1} graded), compound divergence "
            f"{min(g.split.compound_divergence for g in splits):.3f}-{max(g.split.compound_divergence for g in splits):.3f}")
    rows = []
    if only:  # a reranking row needs its first stage's scores of this run
        by_name = {m.name: m for m in board.models}
        only = set(only) | {by_name[n].first_stage for n in only if n in by_name and by_name[n].first_stage}
        only |= {member for n in list(only) if n in by_name for member in by_name[n].ensemble}
    kept: dict[str, dict] = {}  # suite model -> its score matrices, for the rows that rerank them
    with tempfile.TemporaryDirectory(prefix="leaderboard-") as workdir:
        for entry in board.models:
            if only and entry.name not in only:
                continue
            row = {"model": entry.name, "paper": entry.paper, "encoders": entry.encoders, "command": entry.command}
            try:
                missing = missing_files(entry)
            except LeaderboardError as e:  # a ckpt glob matching several files: this row's error
                missing, row["status"] = [], f"error: {e}"
                rows.append(row)
                continue
            if missing:
                row["status"] = f"skipped: no {missing[0]}"
                log(f"{entry.name}: skipped ({row['status'][9:]}); make it with `{entry.command}`")
                rows.append(row)
                continue
            ckpt = entry.checkpoint() if entry.semclip is None else None
            progress = fit_progress(ckpt.parent.parent) if ckpt is not None else None
            if progress is not None:  # a stopped fit is not the model's result: finish it first
                row["status"] = f"skipped: its fit stopped after {progress[0]} of {progress[1]} epochs"
                log(f"{entry.name}: skipped ({row['status'][9:]}); finish it with `python -m grounding fit --config "
                    f"{entry.config} --trainer.default_root_dir {ckpt.parent.parent} --ckpt_path last`")
                rows.append(row)
                continue
            for ckpt in entry.seed_checkpoints(finished=False):
                epochs, max_epochs = fit_progress(ckpt.parent.parent)
                log(f"{entry.name}: {ckpt} not counted as a seed: its fit stopped after {epochs} of {max_epochs} "
                    f"epochs (finish it with `python -m grounding fit ... --ckpt_path last`)")
            start = time.perf_counter()
            try:
                if entry.semclip is not None:
                    row.update(evaluate_semclip(entry, board.test_set, dm, comp_dm))
                elif entry.ensemble:
                    ensemble_row, kept[entry.name] = evaluate_ensemble(entry, kept, {r["model"]: r for r in rows},
                                                                       board.test_set)
                    row.update(ensemble_row)
                else:
                    first = _first_stage_files(entry, kept, workdir)
                    stage_row, kept[entry.name] = evaluate_stage(entry, board.test_set, workdir, reference,
                                                                 comp_reference, first)
                    row.update(stage_row)
                    if entry.first_stage:
                        row["first_stage"] = f"{entry.first_stage}, {row.get('first_stage') or f'top {entry.rerank_top_k}'}"
                if splits and entry.name in kept:  # (SemCLIP's store keeps no test matrix: no graded results)
                    row["graded"] = graded_results(entry, kept, splits, board.test_set, workdir, log,
                                                   graded_splits_kept)
                row["status"] = "ok"
            except Exception as e:  # noqa: BLE001 - one model's failure is its row's error line, the others still run
                row["status"] = f"error: {' '.join(str(e).split())[:300]}"
            if not entry.ensemble:  # (an ensemble's: its members' sum, set by evaluate_ensemble)
                row["train_minutes"], row["epochs"] = _fit_records(entry)
            log(f"{entry.name}: {row['status']}" + (f", rsum {row['rsum']:.1f}" if row["status"] == "ok" else "")
                + f" ({time.perf_counter() - start:.0f}s)")
            rows.append(row)
    return rows


def evaluate_ensemble(entry: ModelEntry, kept: dict, member_rows: dict, test_set: TestSet) -> tuple[dict, dict]:
    """An ensemble's row: its members' test scores fused (:func:`grounding.retrieval_metrics.fuse_scores`). With
    seeds, ensemble i fuses seed i of every member (as many ensembles as the member with the fewest seeds has runs),
    and the row is their mean ± sd like a model's seeds. Training minutes, parameters and ms per query are the
    members' sums (every member scores every query). Returns the row and the fused matrices (kept like a model's)."""
    absent = [m for m in entry.ensemble if m not in kept or member_rows.get(m, {}).get("status") != "ok"]
    if absent:
        raise LeaderboardError(f"its member {absent[0]} has no scores in this run (skipped or failed); make that model first")
    runs = [[kept[m]["test"][0]] + [s for s, _ in kept[m].get("seeds", [])] for m in entry.ensemble]
    comps = [[kept[m]["comp"][0] if "comp" in kept[m] else None] + [c for _, c in kept[m].get("seeds", [])]
             for m in entry.ensemble]
    texts = kept[entry.ensemble[0]]["test"][1]
    fused, comp_r1 = [], []
    for i in range(min(len(r) for r in runs)):
        fused.append(fuse_scores([r[i] for r in runs], entry.weights))
        parts = [c[i] for c in comps]
        comp_r1.append(retrieval_metrics(*_fused_pair(parts, entry.weights))["t2i_r1"]
                       if all(p is not None for p in parts) else None)
    if len(fused) == 1:
        row = _scored_row(fused[0], texts, test_set.world_meta)
        if comp_r1[0] is not None:
            row["compositional_r1"] = comp_r1[0]
    else:
        row = seed_mean_row(fused, comp_r1, texts, test_set.world_meta)
    members = [member_rows[m] for m in entry.ensemble]
    for key in ("params_m", "trainable_m", "ms_per_query", "train_minutes"):
        values = [r.get(key) for r in members]
        row[key] = None if any(v is None for v in values) else float(sum(values))
    row["epochs"] = None
    return row, {"test": (fused[0], texts), "seeds": [(f, None) for f in fused[1:]]}


def _fused_pair(parts: list[RetrievalScores], weights) -> tuple[torch.Tensor, torch.Tensor]:
    fused = fuse_scores(parts, weights)
    return fused.scores, fused.caption_image


def _first_stage_files(entry: ModelEntry, kept: dict, workdir) -> dict | None:
    """The first stage's score matrices of this run written as files for ``entry``'s rerank (None: no rerank)."""
    if not entry.first_stage:
        return None
    if entry.first_stage not in kept:
        raise LeaderboardError(f"its first stage {entry.first_stage} has no scores in this run (skipped or failed); "
                               "make that model first")
    files = {}
    for split in ("test", "comp"):
        if split not in kept[entry.first_stage]:
            continue
        scored, texts = kept[entry.first_stage][split]
        files[split] = Path(workdir) / f"first_stage-{sha1_of_json([entry.first_stage, split])[:12]}.pt"
        save_first_stage(files[split], scored, texts, entry.first_stage)
    return files


# ------------------------------------------------------------------------------------------ graded splits (Fig. 4)
@dataclass
class GradedSplit:
    """One split of the MCD folder located in the test set: its file, rows and columns, reference and texts."""

    split: SplitFile
    selection: Selection
    reference: Reference
    texts: list[str]


def graded_splits(test_set: TestSet, dm) -> list[GradedSplit]:
    """The MCD split, then its graded splits by falling compound divergence (the folder of ``compositional_split``,
    as ``python -m grounding.composer mcd`` wrote it), each located in the test set ``dm``."""
    if not test_set.compositional_split:
        raise LeaderboardError(f"test_set ({test_set.name}): --graded needs a compositional_split (the mcd.json of "
                               "`python -m grounding.composer mcd`, whose folder holds graded/*.json)")
    try:
        found, _ = find_splits(resolve_path(test_set.compositional_split).parent)
        splits = []
        for split in found:
            split_dm = reference_data(test_set, split_file=str(split.path))
            splits.append(GradedSplit(split, select(dm.test_dataset, split_dm.test_dataset, split.name),
                                      Reference.of(split_dm), _flat_captions(split_dm.test_dataset)))
    except (SplitEvalError, GradedSplitError) as e:
        raise LeaderboardError(str(e)) from None
    return splits


def evenly_spaced(splits: list[GradedSplit], kept: int | None) -> list[GradedSplit]:
    """The MCD split and ``kept`` of the graded splits after it, evenly spaced in their order (the first and the
    last included when ``kept`` >= 2); all of them when ``kept`` is None or not smaller."""
    if kept is None or kept >= len(splits) - 1:
        return splits
    return splits[:1] + [splits[1 + int(i)] for i in np.unique(np.linspace(0, len(splits) - 2, kept).round())]


def graded_results(entry: ModelEntry, kept: dict, splits: list[GradedSplit], test_set: TestSet, workdir,
                   log: Callable[[str], None] = print, rerank_kept: int | None = None) -> list[dict]:
    """``entry``'s results on every split (each of its runs: seeds). A row that reranks nothing: its test matrices
    restricted to the split, after checking on the MCD split that the restriction gives what its own test loop on
    that split gave. An ensemble: its members' restricted matrices fused on each split (as its compositional column
    fuses their runs on the MCD split; the z-scores are the split's). A reranker: its test loop on each split
    (``rerank_kept`` of them: :func:`evenly_spaced`), reranking the first stage's restricted matrix."""
    own = kept[entry.name]
    runs = [own["test"][0]] + [s for s, _ in own.get("seeds", [])]
    mcd = next((g for g in splits if g.split.is_mcd), None)
    if entry.ensemble:
        members = [[kept[m]["test"][0]] + [s for s, _ in kept[m].get("seeds", [])] for m in entry.ensemble]
        return [split_result([fuse_scores([restrict(m[i], g.selection) for m in members], entry.weights)
                              for i in range(len(runs))], g.split, g.selection,
                             "its members' test matrices restricted to the split, fused") for g in splits]
    if not entry.first_stage:
        if mcd is not None and "comp" in own:  # a model whose pair scores depend on the gallery fails here
            restricted = retrieval_metrics(*_pair(restrict(runs[0], mcd.selection)))["t2i_r1"]
            ran = retrieval_metrics(*_pair(own["comp"][0]))["t2i_r1"]
            if abs(restricted - ran) > 100.0 / len(mcd.texts) + 1e-6:  # (one caption's worth: float ties)
                raise LeaderboardError(f"its test matrix restricted to the MCD split gives t2i R@1 {restricted:.2f}, its "
                                       f"own test on that split {ran:.2f}: its scores depend on the gallery, so the "
                                       "graded splits need a test run each")
        return [split_result([restrict(r, g.selection) for r in runs], g.split, g.selection,
                             "its test matrix restricted to the split") for g in splits]
    cfg = resolved_config(entry.config)
    data_class = str((cfg.get("data") or {}).get("class_path"))
    first = kept[entry.first_stage]["test"][0]
    replicas = [entry] + [replace(entry, ckpt=str(c)) for c in entry.seed_checkpoints()]
    results = []
    splits = evenly_spaced(splits, rerank_kept)
    for i, g in enumerate(splits, 1):
        start = time.perf_counter()
        if g.split.is_mcd and "comp" in own:  # its compositional-split runs are this split's
            split_runs = [own["comp"][0]] + [c for _, c in own.get("seeds", [])]
        else:
            file = Path(workdir) / f"first_stage-{sha1_of_json([entry.first_stage, str(g.split.path)])[:12]}.pt"
            save_first_stage(file, restrict(first, g.selection), g.texts, entry.first_stage)
            captions = split_captions(test_set.captions, str(g.split.path))
            split_runs = [_stage_test(r, data_class, captions, None, workdir, g.reference,
                                      f" (graded split {g.split.name})", first_stage=file)[1] for r in replicas]
        results.append(split_result(split_runs, g.split, g.selection,
                                    f"its test loop reranking {entry.first_stage}'s top {entry.rerank_top_k}"))
        log(f"{entry.name}: split {i}/{len(splits)} {g.split.name} (CD {g.split.compound_divergence:.3f}): t2i R@1 "
            f"{results[-1]['t2i_r1']:.1f} ({time.perf_counter() - start:.0f}s)")
    return results


def _pair(scored: RetrievalScores) -> tuple[torch.Tensor, torch.Tensor]:
    return scored.scores, scored.caption_image


# ------------------------------------------------------------------------------------------ writing
def _fmt(key: str, value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.2f}" if key in ("params_m", "trainable_m") else f"{value:.1f}"
    return str(value)


def _rsum_cell(row: dict) -> str:
    cell = _fmt("rsum", row.get("rsum"))
    if row.get("rsum_sd") is not None:
        cell += f" ± {row['rsum_sd']:.1f} ({row['seeds']} seeds)"
    if row.get("rsum_low") is None or row.get("rsum_high") is None:
        return cell
    return f"{cell} [{row['rsum_low']:.1f}, {row['rsum_high']:.1f}]"


def _medr_cell(row: dict) -> str:
    if row.get("t2i_medr") is None:
        return "–"
    # a mean over seeds to one decimal (5.7, not 5.66667); a single run's integer rank as it is
    return f"{round(row['t2i_medr'], 1):g} / {round(row['i2t_medr'], 1):g}"


def markdown_table(rows: list[dict], test_set: TestSet) -> str:
    """Suite rows (with a command when skipped or failed), then published rows (``status: published``)."""
    comp = "comp. R@1" + (" (held-out pairs)" if test_set.world_meta else " (MCD split)" if test_set.compositional_split else "")
    head = ["model", "paper", "encoders (image \\| text)", "t2i R@1", "R@5", "R@10", "i2t R@1", "R@5", "R@10",
            "rsum [95 % CI]", "medr t2i / i2t", "first stage", comp, "train min", "epochs", "params M", "trainable M",
            "ms/query"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        if row.get("status") in ("ok", "published"):
            cells = [_fmt(k, row.get(k)) for k in ("model", "paper")] + [row.get("encoders") or "–"]
            cells += [_fmt(k, row.get(k)) for k in RECALLS[:-1]] + [_rsum_cell(row), _medr_cell(row)]
            cells += [row.get("first_stage") or "–"]
            cells += [_fmt(k, row.get(k)) for k in ("compositional_r1", "train_minutes", "epochs", "params_m",
                                                     "trainable_m", "ms_per_query")]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        else:
            reason = row.get("status", "").replace("|", "\\|")
            lines.append(f"| {row['model']} | {row.get('paper', '')} | {reason}: `{row['command']}` |"
                         + " |" * (len(head) - 3))
    return "\n".join(lines) + "\n"


def table_rows(rows: list[dict], board: Leaderboard) -> list[dict]:
    """The suite's rows followed by the YAML's published rows."""
    return list(rows) + [p.row() for p in board.published]


def plot_bars(rows: list[dict], path: str | Path, title: str) -> Path:
    """rsum of every evaluated model as bars with its 95 % interval (published results in grey, compositional R@1
    beside a suite row when known); skipped rows left out."""
    ok = [r for r in rows if r.get("status") in ("ok", "published")]
    fig = Figure(figsize=(max(6.0, 1.1 * len(ok) + 2), 4.2), dpi=120)
    ax = fig.add_subplot()
    x = range(len(ok))
    err = [[r["rsum"] - r["rsum_low"] if r.get("rsum_low") is not None else 0.0 for r in ok],
           [r["rsum_high"] - r["rsum"] if r.get("rsum_high") is not None else 0.0 for r in ok]]
    colours = ["tab:gray" if r["status"] == "published" else "tab:blue" for r in ok]
    ax.bar([i - 0.2 for i in x], [r["rsum"] for r in ok], width=0.4, color=colours, yerr=err, capsize=2,
           label="rsum (of 600; grey: published)")
    ax2 = ax.twinx()
    known = [i for i, r in enumerate(ok) if r.get("compositional_r1") is not None]  # unknown: no bar, not a zero
    ax2.bar([i + 0.2 for i in known], [ok[i]["compositional_r1"] for i in known], width=0.4, color="tab:orange",
            label="compositional t2i R@1 (%)")
    ax.set_xticks(list(x))
    ax.set_xticklabels([r["model"] for r in ok], rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("rsum")
    ax2.set_ylabel("compositional R@1 (%)")
    ax.set_title(title, fontsize=10)
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="upper left")
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png")
    return Path(path)


def _finite(value):
    """JSON without bare NaN (a median rank of an empty split): None instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def merge_rows(rows: list[dict], out: str | Path, board: Leaderboard) -> list[dict]:
    """``rows`` (an ``--only`` run) merged into the table already in ``out`` by model name, in the YAML's order."""
    path = Path(out) / "leaderboard.json"
    try:
        old = {r["model"]: r for r in json.loads(path.read_text(encoding="utf-8")).get("rows", [])}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        old = {}
    new = {r["model"]: r for r in rows}
    return [new.get(m.name) or old[m.name] for m in board.models if m.name in new or m.name in old]


def check_output_folder(out: str | Path, where: str) -> Path:
    """``out`` as a folder the tables can go to: a file in the way (the folder or one of its parents) is a
    :class:`LeaderboardError`, raised before any model is tested (the tables are written at the end)."""
    out = Path(out)
    in_the_way = next((f for f in (out, *out.parents) if f.exists() and not f.is_dir()), None)
    if in_the_way is not None:
        raise LeaderboardError(f"output folder {out}: {in_the_way} is a file, not a folder; choose another {where} or "
                               "move the file")
    return out


def write_outputs(rows: list[dict], board: Leaderboard, out: str | Path | None = None, record: str | Path | None = None,
                  provenance_keys: dict | None = None) -> Path:
    """``leaderboard.md``, ``leaderboard.csv``, ``leaderboard.json`` and ``leaderboard.png`` (each atomically).
    ``leaderboard.json`` is a record of :mod:`grounding.docs_tables`: ``provenance_keys`` (default: this process's
    command, commit, date and machine; the YAML as its config) and the table; ``record``: a path the same record is
    also written to (``docs/records/<name>.json``: the docs render their table from it), each row without its
    graded results."""
    out = Path(out or board.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [_finite(r) for r in table_rows(rows, board)]
    title = f"Leaderboard: {board.test_set.name}"
    md = markdown_table(rows, board.test_set)
    atomic_write_text(out / "leaderboard.md", f"# {title}\n\nFrom `{board.source}`.\n\n{md}")
    atomic_write_csv(out / "leaderboard.csv", rows, COLUMNS)
    keys = provenance_keys if provenance_keys is not None else provenance(config=board.source or None)
    extra = {"title": title, "source": board.source, "test_set": vars(board.test_set), "labels": RECORD_LABELS}
    write_record(out / "leaderboard.json", RECORD_COLUMNS, rows, keys, **extra)
    if record is not None:
        write_record(record, RECORD_COLUMNS, [{k: v for k, v in r.items() if k != "graded"} for r in rows], keys, **extra)
    plot_bars(rows, out / "leaderboard.png", title)
    write_graded(rows, out, f"{title}: text→image R@1 against compound divergence (Fig. 4, every model)",
                 {"source": board.source, "test_set": vars(board.test_set)})
    return out

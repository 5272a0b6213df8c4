"""One trained COMPOSER checkpoint tested on an MCD split and its graded splits (§5.1, Fig. 4).

``python -m grounding.leaderboard.evaluate_splits --config <model yaml> --ckpt <ckpt> --splits <mcd out dir> [--out DIR]
[--rerank-top-k K] [--limit N] [--record NAME]`` (also run by its old name ``python -m grounding.composer evaluate-splits``) runs
the ``test`` subcommand of ``python -m grounding`` (LightningCLI -> ``Trainer.test`` -> the test loop and
metrics of :class:`grounding.composer.training.ComposerTraining`, as ``make composer`` tests) once per split
file written by ``python -m grounding.composer mcd``: ``mcd.json``, then every ``graded/*.json``. The model
config's caption DataModule reads each split: its ``root`` gives the images, its caption file is replaced by
the split's Karpathy JSON, read test-only (train and val empty). The DataModule builds each split's CRG once
(parses cached under ``.cache/composer/parses``, so a rerun does not parse again).

Written to ``--out`` after every split (each file atomically): ``splits.csv`` and ``splits.json`` (per split:
compound and atom divergence from train, images, captions, text->image R@1/5/10, image->text R@1/5/10,
rsum; the JSON also keeps every logged test metric) and ``fig4.png``: text->image R@1 and R@5 against
compound divergence, the MCD split marked, the random splits' divergence range of ``summary.json`` shaded.

It lives on the top floor, beside the leaderboard, because it runs the CLI's test loop (one model, many test sets);
the ``composer`` command, a paper package's, starts it as a process rather than importing it.
"""

from __future__ import annotations

import importlib
import inspect
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from matplotlib.figure import Figure

from grounding.checkpoints import CheckpointError, read_checkpoint
from grounding.cli import resolved_config as cli_resolved_config
from grounding.cli import run_test_subcommand
from grounding.errors import UserInputError
from grounding.stage_config import ConfigError
from grounding.utils.io import atomic_path, atomic_write_csv, atomic_write_json

MCD_FILE = "mcd.json"
GRADED_DIR = "graded"
SUMMARY_FILE = "summary.json"
# one row per split: what the table and Fig. 4 show (recalls in %, as the `test` subcommand logs them)
COLUMNS = ("split", "file", "compound_divergence", "atom_divergence", "images", "captions",
           "t2i_r1", "t2i_r5", "t2i_r10", "i2t_r1", "i2t_r5", "i2t_r10", "rsum")
METRICS = ("t2i_r1", "t2i_r5", "t2i_r10", "i2t_r1", "i2t_r5", "i2t_r10", "rsum")
COMPOSER_TRAINING = "grounding.composer.training.ComposerTraining"
COMPOSER_DATA = "grounding.composer.data.ComposerDataModule"


class SplitEvalError(UserInputError, ValueError):
    """A split folder, model config or checkpoint evaluate-splits cannot use (one line, exit status 2)."""


@dataclass
class SplitFile:
    """One Karpathy split file of ``python -m grounding.composer mcd`` and its divergences from train."""

    name: str
    path: Path
    compound_divergence: float
    atom_divergence: float
    is_mcd: bool


# ------------------------------------------------------------------------------------------ inputs
def _split_meta(path: Path) -> dict:
    try:
        meta = json.loads(path.read_text(encoding="utf-8")).get("mcd")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        raise SplitEvalError(f"{path}: not a readable split file ({' '.join(str(e).split())}); rerun "
                             "`python -m grounding.composer mcd` to write it again") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("compound_divergence"), (int, float)):
        raise SplitEvalError(f"{path}: no `mcd` block with compound_divergence; expected a split written by "
                             "`python -m grounding.composer mcd` (rerun it)")
    return meta


def find_splits(split_dir: str | Path) -> tuple[list[SplitFile], dict | None]:
    """The MCD split, then the graded splits by falling compound divergence, and ``summary.json`` (or None)."""
    split_dir = Path(split_dir)
    if not split_dir.is_dir():
        raise SplitEvalError(f"--splits {split_dir}: no such folder; make the splits with `python -m grounding.composer "
                             "mcd --config experiments/composer/mcd_world.yaml` (or `make demo-composer`)")
    if not (split_dir / MCD_FILE).is_file():
        raise SplitEvalError(f"--splits {split_dir}: no {MCD_FILE} in it; expected the --out folder of "
                             "`python -m grounding.composer mcd` (mcd.json, graded/*.json, summary.json)")
    files = [(split_dir / MCD_FILE, True)] + [(p, False) for p in sorted((split_dir / GRADED_DIR).glob("*.json"))]
    splits = []
    for path, is_mcd in files:
        meta = _split_meta(path)
        splits.append(SplitFile("mcd" if is_mcd else path.stem, path, float(meta["compound_divergence"]),
                                float(meta.get("atom_divergence", float("nan"))), is_mcd))
    splits[1:] = sorted(splits[1:], key=lambda s: -s.compound_divergence)
    summary = None
    if (split_dir / SUMMARY_FILE).is_file():
        try:
            summary = json.loads((split_dir / SUMMARY_FILE).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SplitEvalError(f"{split_dir / SUMMARY_FILE}: not readable JSON ({' '.join(str(e).split())}); "
                                 "rerun `python -m grounding.composer mcd`") from None
    return splits, summary


def resolved_config(config: str | Path) -> dict:
    """The model config as ``python -m grounding test`` resolves it, parsed only: nothing is built."""
    if not Path(config).is_file():
        raise SplitEvalError(f"--config {config}: no such file; give the COMPOSER config the checkpoint was trained "
                             "with (e.g. experiments/composer/composer_world.yaml)")
    try:
        return cli_resolved_config(config)
    except ConfigError as e:
        raise SplitEvalError(f"--config {e}") from None


def check_config(cfg: dict, config: str | Path) -> dict:
    """A COMPOSER model config whose caption DataModule can read a test-only Karpathy file; returns the
    caption DataModule's ``{class_path, init_args}``."""
    model, data = cfg.get("model") or {}, cfg.get("data") or {}
    if model.get("class_path") != COMPOSER_TRAINING or data.get("class_path") != COMPOSER_DATA:
        raise SplitEvalError(f"--config {config}: a config of {model.get('class_path')} on {data.get('class_path')}, "
                             f"not COMPOSER ({COMPOSER_TRAINING} on {COMPOSER_DATA}); give the config the checkpoint "
                             "was trained with (experiments/composer/composer_*.yaml)")
    reader = (data.get("init_args") or {}).get("captions") or {}
    module, _, name = str(reader.get("class_path", "")).rpartition(".")
    try:
        params = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    except (ImportError, AttributeError, ValueError):
        params = {}
    if not {"karpathy_file", "test_only"} <= set(params):
        raise SplitEvalError(f"--config {config}: its caption DataModule {reader.get('class_path')} cannot read a "
                             "test-only Karpathy split file (needs karpathy_file and test_only, as "
                             "data_modules.FlickrDataModule has); use a config whose data.init_args.captions is one")
    return reader


def check_checkpoint(ckpt: str | Path, cfg: dict) -> None:
    """A checkpoint of the config's LightningModule (COMPOSER), not of another stage."""
    ckpt = Path(ckpt)
    if not ckpt.is_file():
        raise SplitEvalError(f"--ckpt {ckpt}: no such file; train COMPOSER first (`make composer` writes "
                             "outputs/composer/world/checkpoints/last.ckpt)")
    try:
        hp = read_checkpoint(ckpt, "COMPOSER")["hyper_parameters"]
    except CheckpointError as e:
        raise SplitEvalError(f"--ckpt {ckpt}: {' '.join(str(e).split())}") from None
    expected_net = (((cfg["model"].get("init_args") or {}).get("net") or {}).get("class_path"))
    found = hp.get("_class_path") or ((hp.get("net") or {}).get("class_path") if isinstance(hp.get("net"), dict) else None)
    if found not in (COMPOSER_TRAINING, expected_net):
        raise SplitEvalError(f"--ckpt {ckpt}: a checkpoint of {found or 'an unknown module'} (another stage), not of "
                             f"COMPOSER ({COMPOSER_TRAINING}); give one written by `python -m grounding fit --config "
                             "experiments/composer/composer_world.yaml` (outputs/composer/world/checkpoints/last.ckpt)")


# -------------------------------------------------------------------------------------- evaluation
def evaluate_split(config: str | Path, ckpt: str | Path, split: SplitFile, workdir: str | Path,
               rerank_top_k: int | None = None, limit: int | None = None) -> dict:
    """``python -m grounding test`` of ``ckpt`` on one split file: its logged test metrics (``test/`` dropped),
    images and captions."""
    reader = {"karpathy_file": str(split.path.resolve()), "captions_file": None, "test_only": True}
    if limit is not None:
        reader["subsets"] = {**(reader.get("subsets") or {}), "test": limit}
    data = {"data": {"init_args": {"captions": {"init_args": reader}}}}
    extra = [] if rerank_top_k is None else [f"--model.init_args.rerank_top_k={rerank_top_k}"]
    cli = run_test_subcommand(config, ckpt, workdir, [data], extra)
    metrics = {k.removeprefix("test/"): float(v) for k, v in cli.trainer.callback_metrics.items() if k.startswith("test/")}
    missing = [m for m in METRICS if m not in metrics]
    if missing:
        raise SplitEvalError(f"{split.path}: the test run logged no {', '.join(missing)} (no image or caption was "
                             "scored?); check the split's images exist under the config's caption root")
    dm = cli.datamodule
    return {"metrics": metrics, "images": len(dm.test_dataset), "captions": int(dm.graphs["test"].graph.n_captions)}


def split_row(split: SplitFile, result: dict, seconds: float | None = None) -> dict:
    row = {"split": split.name, "file": str(split.path), "compound_divergence": split.compound_divergence,
           "atom_divergence": split.atom_divergence, "images": result["images"], "captions": result["captions"],
           **{m: result["metrics"][m] for m in METRICS}, "mcd": split.is_mcd, "metrics": result["metrics"]}
    if seconds is not None:
        row["seconds"] = round(seconds, 1)
    return row


def write_table(rows: Sequence[dict], out: str | Path, info: dict | None = None) -> None:
    """``splits.csv`` (the :data:`COLUMNS`) and ``splits.json`` (``info`` + every row with all its metrics)."""
    out = Path(out)
    atomic_write_csv(out / "splits.csv", rows, COLUMNS)
    atomic_write_json(out / "splits.json", {**(info or {}), "columns": list(COLUMNS), "splits": list(rows)}, indent=2)


def plot_fig4(rows: Sequence[dict], path: str | Path, summary: dict | None = None, title: str | None = None) -> Path:
    """Fig. 4: text->image R@1 and R@5 against compound divergence; the MCD split marked; the random
    splits' compound divergences (``summary.json``) as a shaded range; chance R@1 dotted."""
    fig = Figure(figsize=(6.4, 4.4), dpi=120)
    ax = fig.add_subplot()
    graded = sorted((r for r in rows if not r.get("mcd")), key=lambda r: r["compound_divergence"])
    random_cd = ((summary or {}).get("random_splits") or {}).get("compound_divergence") or []
    if random_cd:
        lo, hi = float(np.min(random_cd)), float(np.max(random_cd))
        ax.axvspan(lo, hi if hi > lo else lo + 1e-4, color="0.85", zorder=0,
                   label=f"random splits ({len(random_cd)}): CD {lo:.3f}–{hi:.3f}")
    for key, color, label in (("t2i_r1", "tab:blue", "R@1"), ("t2i_r5", "tab:orange", "R@5")):
        ax.plot([r["compound_divergence"] for r in graded], [r[key] for r in graded], "o-", color=color,
                label=f"text→image {label}, graded splits")
        for r in rows:
            if r.get("mcd"):
                ax.plot([r["compound_divergence"]], [r[key]], "*", color=color, markersize=15, markeredgecolor="k",
                        zorder=5, label=f"MCD split {label}")
    mcd = next((r for r in rows if r.get("mcd")), None)
    if mcd is not None:
        ax.annotate("MCD", (mcd["compound_divergence"], mcd["t2i_r5"]), textcoords="offset points", xytext=(6, 6))
    images = {r["images"] for r in rows}
    if len(images) == 1 and next(iter(images)):
        ax.axhline(100.0 / next(iter(images)), color="tab:blue", linestyle=":", linewidth=1, label="chance R@1")
    ax.set_xlabel("compound divergence from the training captions")
    ax.set_ylabel("recall (%)")
    top = max([r[k] for r in rows for k in ("t2i_r1", "t2i_r5")], default=100.0)
    ax.set_ylim(0, min(top * 1.15 + 2.0, 110.0))
    ax.set_title(title or "COMPOSER: retrieval against compound divergence (Fig. 4)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png")
    return Path(path)


def evaluate_splits(config: str | Path, ckpt: str | Path, split_dir: str | Path, out: str | Path,
                    rerank_top_k: int | None = None, limit: int | None = None,
                    log: Callable[[str], None] = print) -> dict:
    """Test ``ckpt`` on every split of ``split_dir`` and write the table and Fig. 4 to ``out``; returns splits.json."""
    if rerank_top_k is not None and rerank_top_k < 1 or limit is not None and limit < 1:
        raise SplitEvalError("--rerank-top-k and --limit must be positive")
    splits, summary = find_splits(split_dir)
    cfg = resolved_config(config)
    reader = check_config(cfg, config)
    check_checkpoint(ckpt, cfg)
    info = {"config": str(config), "checkpoint": str(ckpt), "splits_dir": str(split_dir),
            "image_root": str((reader.get("init_args") or {}).get("root")), "rerank_top_k": rerank_top_k, "limit": limit,
            "random_splits": (summary or {}).get("random_splits"), "k": (summary or {}).get("k")}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="composer-splits-") as workdir:  # the test runs' config.yaml
        for i, split in enumerate(splits, 1):
            t = time.perf_counter()
            result = evaluate_split(config, ckpt, split, workdir, rerank_top_k, limit)
            rows.append(split_row(split, result, time.perf_counter() - t))
            r = rows[-1]
            log(f"[{i}/{len(splits)}] {split.name}: CD {split.compound_divergence:.4f}, {r['images']} images / "
                f"{r['captions']} captions: t2i R@1 {r['t2i_r1']:.1f} R@5 {r['t2i_r5']:.1f} R@10 {r['t2i_r10']:.1f}, "
                f"i2t R@1 {r['i2t_r1']:.1f} R@5 {r['i2t_r5']:.1f}, rsum {r['rsum']:.1f} ({r['seconds']:.0f}s)")
            info["seconds"] = round(time.perf_counter() - t0, 1)
            write_table(rows, out, info)
            plot_fig4(rows, out / "fig4.png", summary)
    log(f"wrote {out / 'splits.csv'}, {out / 'splits.json'} and {out / 'fig4.png'} ({len(rows)} splits in "
        f"{info['seconds']:.0f}s)")
    return {**info, "columns": list(COLUMNS), "splits": rows}

"""Every leaderboard model on the graded splits of compound divergence (COMPOSER §5.1, Fig. 4, with every row).

``python -m grounding.composer mcd`` writes, beside the MCD split, graded splits: windows of the candidates sorted by
how much each raises the compound divergence from the training captions (``graded/*.json``, Karpathy JSON, every
one a subset of the test images with all their captions). ``python -m grounding.leaderboard --graded`` tests every
row on each of them and writes ``graded.csv``, ``.json``, ``.md`` and ``.png`` beside the leaderboard: text->image
R@1 against compound divergence, one line per model, the MCD split starred (the paper plots COMPOSER and ViLBERT).

A model that scores every (caption, image) pair on its own (a dual encoder, VSE, VG-BERT's match map, an ensemble
of them) gives each pair the same score whatever else is in the gallery, so its split result is its test matrix
restricted to the split's images and captions (:func:`restrict`): no second test run. The leaderboard checks that
claim on the MCD split, which every row also runs through its own test loop (the compositional column): the
restricted and the run recalls must agree. A cross-encoder that reranks a first stage's top K runs its own test
loop on every split, reranking the first stage's restricted matrix (the top K of the split's images, as a test on
that split alone would).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from matplotlib.figure import Figure
from scipy.stats import spearmanr

from grounding.errors import UserInputError
from grounding.retrieval_metrics import RetrievalScores, flat_order, retrieval_metrics
from grounding.utils.io import atomic_path, atomic_write_csv, atomic_write_json, atomic_write_text

METRICS = ("t2i_r1", "t2i_r5", "t2i_r10", "i2t_r1", "i2t_r5", "i2t_r10", "rsum")
COLUMNS = ("model", "split", "mcd", "compound_divergence", "images", "captions", "runs", *METRICS, "t2i_r1_sd",
           "scored_by")


GRADED_FILES = ("graded.csv", "graded.json", "graded.md", "graded.png")


class GradedSplitError(UserInputError, ValueError):
    """A graded split that is not a subset of the leaderboard's test set (one line, exit status 2)."""


@dataclass
class Selection:
    """Where a split sits in the test set: its images' rows, its captions' columns (the test set's flat caption
    order) and each of its captions' image (a row of the split)."""

    images: torch.Tensor
    captions: torch.Tensor
    caption_image: torch.Tensor


def select(test_dataset, split_dataset, split_name: str) -> Selection:
    """The split's images and captions found in the test set (by image file and caption text, in the split's
    order); a :class:`GradedSplitError` naming the first image or caption the test set lacks."""
    rows = {Path(p).resolve(): i for i, p in enumerate(test_dataset.image_paths)}
    offsets = np.concatenate([[0], np.cumsum([len(c) for c in test_dataset.captions])])
    images, captions, caption_image = [], [], []
    for j, (path, texts) in enumerate(zip(split_dataset.image_paths, split_dataset.captions)):
        i = rows.get(Path(path).resolve())
        if i is None:
            raise GradedSplitError(f"graded split {split_name}: its image {Path(path).name} is not a test image of the "
                                   "leaderboard's test set; make the splits from this test set (python -m "
                                   "grounding.composer mcd with its candidates in the test split)")
        free = defaultdict(list)  # a caption text -> its columns in the test set (a repeated text used once each)
        for k, text in enumerate(test_dataset.captions[i]):
            free[text].append(int(offsets[i]) + k)
        for text in texts:
            if not free[text]:
                raise GradedSplitError(f"graded split {split_name}: the caption {text!r} of {Path(path).name} is not "
                                       "one of its test captions; make the splits from this test set's caption file")
            captions.append(free[text].pop(0))
            caption_image.append(j)
        images.append(i)
    return Selection(torch.tensor(images), torch.tensor(captions), torch.tensor(caption_image))


def restrict(scored: RetrievalScores, selection: Selection) -> RetrievalScores:
    """``scored`` (a test matrix) restricted to a split: its images x its captions, columns in the split's flat
    caption order."""
    scores, _ = flat_order(scored)
    return RetrievalScores(scores[selection.images][:, selection.captions], selection.caption_image,
                           torch.arange(len(selection.captions)))


def split_result(runs: Sequence[RetrievalScores], split, selection: Selection, scored_by: str) -> dict:
    """One model on one split: the recalls of each run (seed), their means, and t2i R@1's sd over the runs."""
    metrics = [retrieval_metrics(r.scores, r.caption_image) for r in runs]
    out = {"split": split.name, "mcd": split.is_mcd, "compound_divergence": split.compound_divergence,
           "images": len(selection.images), "captions": len(selection.captions), "runs": len(runs),
           "scored_by": scored_by, **{k: float(np.mean([m[k] for m in metrics])) for k in METRICS}}
    out["t2i_r1_sd"] = float(np.std([m["t2i_r1"] for m in metrics], ddof=1)) if len(runs) > 1 else None
    return out


def graded_table(rows: Sequence[dict]) -> list[dict]:
    """Every row's split results (``row["graded"]``) as flat records with the model's name."""
    return [{"model": r["model"], **g} for r in rows for g in r.get("graded") or []]


def trend(results: Sequence[dict]) -> dict:
    """How a model's text->image R@1 moves with compound divergence over its graded splits (the MCD split aside):
    R@1 at the least and the most divergent split, the least-squares slope per 0.1 of divergence, and Spearman's
    rho (the windows overlap, so neighbouring splits are not independent samples)."""
    graded = sorted((g for g in results if not g["mcd"]), key=lambda g: g["compound_divergence"])
    out = {"splits": len(graded)}
    mcd = next((g for g in results if g["mcd"]), None)
    if mcd is not None:
        out["mcd_t2i_r1"] = mcd["t2i_r1"]
    if len(graded) >= 2:
        cd, r1 = np.array([g["compound_divergence"] for g in graded]), np.array([g["t2i_r1"] for g in graded])
        out.update(least_cd=float(cd[0]), least_t2i_r1=float(r1[0]), most_cd=float(cd[-1]), most_t2i_r1=float(r1[-1]),
                   slope_per_0_1=float(np.polyfit(cd, r1, 1)[0] * 0.1),
                   spearman_rho=float(spearmanr(cd, r1)[0]) if np.ptp(r1) > 0 else None)
    return out


def paired_trends(rows: Sequence[dict], metrics: Sequence[str] = ("t2i_r1", "t2i_r5")) -> list[dict]:
    """For every two rows that rerank the same first stage (Fig. 4's own comparison, e.g. COMPOSER against
    ViLBERT-style): the first minus the second, split by split on the same captions, for each of ``metrics``: the
    difference at the least and the most divergent split, its mean, least-squares slope per 0.1 of divergence and
    Spearman's rho against divergence (the windows overlap: not independent samples)."""
    rerankers = [r for r in rows if r.get("graded") and r.get("first_stage")]
    out = []
    for i, a in enumerate(rerankers):
        for b in rerankers[i + 1:]:
            stage = str(a["first_stage"]).split(",")[0]
            if str(b["first_stage"]).split(",")[0] != stage:
                continue
            theirs = {g["split"]: g for g in b["graded"] if not g["mcd"]}
            shared = sorted((g for g in a["graded"] if not g["mcd"] and g["split"] in theirs),
                            key=lambda g: g["compound_divergence"])
            if len(shared) < 2:
                continue
            cd = np.array([g["compound_divergence"] for g in shared])
            for metric in metrics:
                diff = np.array([g[metric] - theirs[g["split"]][metric] for g in shared])
                out.append({"models": [a["model"], b["model"]], "first_stage": stage, "metric": metric,
                            "splits": len(shared), "least_cd": float(cd[0]), "least_diff": float(diff[0]),
                            "most_cd": float(cd[-1]), "most_diff": float(diff[-1]), "mean_diff": float(diff.mean()),
                            "slope_per_0_1": float(np.polyfit(cd, diff, 1)[0] * 0.1),
                            "spearman_rho": float(spearmanr(cd, diff)[0]) if np.ptp(diff) > 0 else None})
    return out


def paired_markdown(pairs: Sequence[dict]) -> str:
    """:func:`paired_trends` as a table (empty when no two rows share a first stage)."""
    if not pairs:
        return ""
    lines = ["\n## Rerankers of the same first stage, split by split (first minus second)\n",
             "| models | first stage | metric | splits | least divergent (CD) | most divergent (CD) | mean | slope per 0.1 CD "
             "| Spearman ρ |", "|---|---|---|---|---|---|---|---|---|"]
    for t in pairs:
        rho = "–" if t["spearman_rho"] is None else f"{t['spearman_rho']:+.2f}"
        lines.append(f"| {t['models'][0]} − {t['models'][1]} | {t['first_stage']} | {t['metric']} | {t['splits']} | "
                     f"{t['least_diff']:+.1f} ({t['least_cd']:.3f}) | {t['most_diff']:+.1f} ({t['most_cd']:.3f}) | "
                     f"{t['mean_diff']:+.2f} | {t['slope_per_0_1']:+.1f} | {rho} |")
    return "\n".join(lines) + "\n"


def markdown(rows: Sequence[dict]) -> str:
    """One line per model with graded results: its :func:`trend`."""
    lines = ["| model | runs | splits | t2i R@1, least divergent (CD) | most divergent (CD) | MCD split | slope per 0.1 CD "
             "| Spearman ρ |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if not row.get("graded"):
            continue
        t = trend(row["graded"])
        cell = {k: "–" if t.get(k) is None else f.format(t[k]) for k, f in (
            ("least_t2i_r1", "{:.1f}"), ("least_cd", "{:.3f}"), ("most_t2i_r1", "{:.1f}"), ("most_cd", "{:.3f}"),
            ("mcd_t2i_r1", "{:.1f}"), ("slope_per_0_1", "{:+.1f}"), ("spearman_rho", "{:+.2f}"))}
        lines.append(f"| {row['model']} | {row['graded'][0]['runs']} | {t['splits']} | {cell['least_t2i_r1']} "
                     f"({cell['least_cd']}) | {cell['most_t2i_r1']} ({cell['most_cd']}) | {cell['mcd_t2i_r1']} | "
                     f"{cell['slope_per_0_1']} | {cell['spearman_rho']} |")
    return "\n".join(lines) + "\n"


def plot_graded(rows: Sequence[dict], path: str | Path, title: str) -> Path:
    """Fig. 4 with every model: text->image R@1 against compound divergence, one line per model (mean over its
    runs, the runs' sd as error bars), its MCD split starred; chance R@1 dotted."""
    fig = Figure(figsize=(7.2, 4.6), dpi=120)
    ax = fig.add_subplot()
    colours = iter(["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
                    "tab:gray", "tab:olive", "tab:cyan"] * 3)
    sizes = set()
    for row in rows:
        results = row.get("graded") or []
        if not results:
            continue
        colour = next(colours)
        graded = sorted((g for g in results if not g["mcd"]), key=lambda g: g["compound_divergence"])
        ax.errorbar([g["compound_divergence"] for g in graded], [g["t2i_r1"] for g in graded],
                    yerr=[g["t2i_r1_sd"] or 0.0 for g in graded], fmt="o-", color=colour, markersize=3, capsize=2,
                    linewidth=1.2, label=row["model"])
        for g in results:
            if g["mcd"]:
                ax.plot([g["compound_divergence"]], [g["t2i_r1"]], "*", color=colour, markersize=13,
                        markeredgecolor="k", zorder=5)
        sizes |= {g["images"] for g in results}
    if len(sizes) == 1:
        ax.axhline(100.0 / next(iter(sizes)), color="k", linestyle=":", linewidth=1, label="chance R@1")
    ax.set_xlabel("compound divergence of the split from the training captions (★: the MCD split)")
    ax.set_ylabel("text→image R@1 (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6.5, loc="best")
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png")
    return Path(path)


def write_graded(rows: Sequence[dict], out: str | Path, title: str, info: dict) -> bool:
    """``graded.csv``, ``graded.json`` (+ each model's :func:`trend` and the :func:`paired_trends`), ``graded.md`` (the
    trends, the pairs) and ``graded.png`` in
    ``out`` (each atomically) when a row has split results; when none has, those files of an earlier run are removed
    (they would describe rows the table no longer holds)."""
    table = graded_table(rows)
    out = Path(out)
    if not table:
        for name in GRADED_FILES:
            (out / name).unlink(missing_ok=True)
        return False
    atomic_write_csv(out / "graded.csv", table, COLUMNS)
    trends = {r["model"]: trend(r["graded"]) for r in rows if r.get("graded")}
    pairs = paired_trends(rows)
    atomic_write_json(out / "graded.json", {**info, "columns": list(COLUMNS), "rows": table, "trends": trends,
                                            "paired": pairs}, indent=2)
    atomic_write_text(out / "graded.md", f"# {title}\n\n{markdown(rows)}{paired_markdown(pairs)}")
    plot_graded(rows, out / "graded.png", title)
    return True

"""Paired bootstrap intervals for the semantic-space measures, so a reader sees which moves between two language
streams are real.

Every measure is a statistic over units (rated SemCat entries, SemCat categories, CSLB features, word-similarity
pairs). One resampling of the units (with replacement, seeded) is shared by every model, so each model gets a 95 %
percentile interval and each later model a *paired* interval of its difference to the first (the reference, "before
grounding"); a difference whose interval excludes 0 is marked. The models' fitted parts (PCA axes, PC1's sign,
the property-norm classifiers) are held fixed: the intervals are over the evaluation items, not over refits.

Statistics are vectorised over resamples: an (R, n) index matrix gathers every resample at once; Pearson r is
computed row-wise, Spearman's rho as Pearson r of row-wise ranks (scipy.stats.rankdata, ties averaged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import stats

# What VG-BERT reports for each measure after grounding (the direction a reader checks a result against).
PAPER_DIRECTION = {
    "concreteness r (entries)": "up (Table 1: Bert 0.10 → Grounded 0.66)",
    "concreteness r (categories)": "up (Table 1: Bert 0.35 → Grounded 0.87)",
    "silhouette (categories)": "up (§4.3, Fig. 5: categories cluster better)",
    "nearest-category accuracy (categories)": "up (§4.3: categorisation improves)",
    "property-norm F1 (features)": "up (§4.2, Fig. 4: more features predictable)",
    "word similarity": "not measured in the paper",
}


@dataclass
class Interval:
    """One measure for every model: value on all units, percentile interval, and the paired difference to model 0."""
    measure: str
    units: str
    n_units: int
    models: list[str]
    value: np.ndarray       # (M,)
    low: np.ndarray         # (M,)
    high: np.ndarray        # (M,)
    diff: np.ndarray        # (M,) value - value[0]
    diff_low: np.ndarray    # (M,)
    diff_high: np.ndarray   # (M,)

    def rows(self) -> list[dict]:
        return [dict(measure=self.measure, units=self.units, n_units=self.n_units, model=m,
                     value=float(self.value[i]), low=float(self.low[i]), high=float(self.high[i]),
                     diff=float(self.diff[i]), diff_low=float(self.diff_low[i]), diff_high=float(self.diff_high[i]))
                for i, m in enumerate(self.models)]


def resample_indices(n: int, n_resamples: int, seed: int) -> np.ndarray:
    """(R, n) indices of R resamples with replacement of n units (seeded)."""
    return np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))


def paired_bootstrap(statistic: Callable[[np.ndarray], np.ndarray], n_units: int, models: Sequence[str],
                     measure: str, units: str, n_resamples: int = 1000, confidence: float = 0.95,
                     seed: int = 0) -> Interval:
    """``statistic(idx)`` maps an (R, n) index matrix to (M, R) values (one per model and resample); the full-sample
    value is ``statistic(arange(n)[None])``. Percentile intervals of each model and of each model minus model 0,
    from the same resamples."""
    full = np.asarray(statistic(np.arange(n_units)[None]), dtype=np.float64)[:, 0]
    boot = np.asarray(statistic(resample_indices(n_units, n_resamples, seed)), dtype=np.float64)
    return interval_of_resamples(full, boot, models, measure, units, n_units, confidence)


def interval_of_resamples(full: np.ndarray, boot: np.ndarray, models: Sequence[str], measure: str, units: str,
                          n_units: int, confidence: float = 0.95) -> Interval:
    """The :class:`Interval` of full-sample values (M,) and their values over the same resamples (M, R):
    percentile intervals of each model and of each model minus model 0 (paired: resample by resample)."""
    full, boot = np.asarray(full, dtype=np.float64), np.asarray(boot, dtype=np.float64)
    alpha = 100 * (1 - confidence) / 2
    low, high = np.nanpercentile(boot, [alpha, 100 - alpha], axis=1)
    d = boot - boot[:1]
    d_low, d_high = np.nanpercentile(d, [alpha, 100 - alpha], axis=1)
    return Interval(measure, units, n_units, list(models), full, low, high, full - full[0], d_low, d_high)


def mean_statistic(values: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """(M, n) per-unit values -> the mean of each resample (NaN units ignored)."""
    values = np.asarray(values, dtype=np.float64)
    return lambda idx: np.nanmean(values[:, idx], axis=-1)


def rowwise_pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r along the last axis of equally shaped arrays."""
    x = x - x.mean(-1, keepdims=True)
    y = y - y.mean(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (x * y).sum(-1) / np.sqrt((x * x).sum(-1) * (y * y).sum(-1))


def pearson_statistic(scores: np.ndarray, target: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """(M, n) model scores and (n,) human values -> each model's Pearson r per resample."""
    scores, target = np.asarray(scores, dtype=np.float64), np.asarray(target, dtype=np.float64)
    return lambda idx: rowwise_pearson(scores[:, idx], target[idx][None])


def spearman_statistic(scores: np.ndarray, target: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """(M, n) model scores and (n,) human values -> each model's Spearman rho per resample (ties averaged)."""
    scores, target = np.asarray(scores, dtype=np.float64), np.asarray(target, dtype=np.float64)

    def statistic(idx):
        t = stats.rankdata(target[idx], axis=-1)[None]
        return rowwise_pearson(stats.rankdata(scores[:, idx], axis=-1), t)

    return statistic


# ------------------------------------------------------------------------------------------- the record
def _finite_or_none(x) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


def record_rows(intervals: Sequence[Interval], confidence: float = 0.95) -> tuple[list[str], dict[str, str], list[dict]]:
    """The intervals as a record's ``columns``, ``labels`` and ``rows`` (:mod:`grounding.docs_tables`): one row a
    measure with ``measure``, ``units``, ``n_units``, each model's value ``m<i>`` and interval ``m<i>_low`` /
    ``m<i>_high``, each later model's paired difference to model 0 ``d<i>`` with ``d<i>_low`` / ``d<i>_high``, and
    ``paper`` (the direction VG-BERT reports; not a default column). A value that is not finite is null. The labels
    name the models (``m1``: its name, ``d1``: ``Δ <name> − <reference>``)."""
    if not intervals:
        return [], {}, []
    models = intervals[0].models
    rows = []
    for iv in intervals:
        if iv.models != models:
            raise ValueError(f"interval {iv.measure!r} has models {iv.models}, the others {models}")
        row = {"measure": iv.measure, "units": iv.units, "n_units": int(iv.n_units)}
        for i in range(len(models)):
            row.update({f"m{i}": _finite_or_none(iv.value[i]), f"m{i}_low": _finite_or_none(iv.low[i]),
                        f"m{i}_high": _finite_or_none(iv.high[i])})
        for i in range(1, len(models)):
            row.update({f"d{i}": _finite_or_none(iv.diff[i]), f"d{i}_low": _finite_or_none(iv.diff_low[i]),
                        f"d{i}_high": _finite_or_none(iv.diff_high[i])})
        row["paper"] = next((v for k, v in PAPER_DIRECTION.items() if iv.measure.startswith(k)), None)
        rows.append(row)
    pct = f"{100 * confidence:g} %"
    columns = ["measure", "units", "n_units"] + [c for i in range(len(models)) for c in (f"m{i}", f"m{i}_ci")]
    columns += [c for i in range(1, len(models)) for c in (f"d{i}", f"d{i}_ci")]
    labels = {"measure": "measure", "units": "units", "n_units": "n", "paper": "paper's direction"}
    for i, m in enumerate(models):
        labels.update({f"m{i}": m, f"m{i}_ci": f"{pct} CI"})
        if i:
            labels.update({f"d{i}": f"Δ {m} − {models[0]}", f"d{i}_ci": f"paired {pct} CI"})
    return columns, labels, rows


# ------------------------------------------------------------------------------------------- report table
def _num(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:.3f}"


def markdown(intervals: Sequence[Interval]) -> str:
    """One row per measure: each model's value [interval], each later model's Δ [paired interval] (* = excludes
    0), and the paper's direction."""
    if not intervals:
        return ""
    models = intervals[0].models
    head = ["measure", "units"] + list(models) + [f"Δ {m} − {models[0]}" for m in models[1:]] + ["paper"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for iv in intervals:
        cells = [iv.measure, f"{iv.n_units} {iv.units}"]
        cells += [f"{_num(iv.value[i])} [{_num(iv.low[i])}, {_num(iv.high[i])}]" for i in range(len(models))]
        for i in range(1, len(models)):
            star = " *" if iv.diff_low[i] > 0 or iv.diff_high[i] < 0 else ""
            cells.append(f"{iv.diff[i]:+.3f} [{iv.diff_low[i]:+.3f}, {iv.diff_high[i]:+.3f}]{star}")
        direction = next((v for k, v in PAPER_DIRECTION.items() if iv.measure.startswith(k)), "")
        lines.append("| " + " | ".join(cells + [direction]) + " |")
    return "\n".join(lines)

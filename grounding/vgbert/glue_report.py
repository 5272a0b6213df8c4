"""VG-BERT's Table 12 on the data here: each probed encoder's GLUE dev metrics with 95 % bootstrap intervals, and
each later encoder minus the first (the reference: MiniLM as it ships, before grounding) paired over the same
resamples, beside the paper's rows.

    python -m grounding.vgbert.glue_report --run "MiniLM=outputs/glue/minilm" \\
        --run "Grounded (6,000 photos)=outputs/glue/stage1_flickr8k_full" --out reports/glue/flickr8k [--record NAME]

Each run folder is a ``make glue`` output: its test wrote ``glue_predictions.test.csv`` (every dev example's
prediction and label; grounding/vgbert/glue_probe.py). The runs must hold the same dev examples (the same GLUE folder,
``max_length`` aside: the labels are compared). The bootstrap resamples each evaluation set's examples with
replacement (seeded per set, the same resamples for every encoder); a task's value in a resample is the mean of its
metrics, the GLUE average the mean over the tasks present (glue_probe.glue_score), so its interval spans every
task's sampling noise at once. Intervals are percentiles (grounding/semantic_space/intervals.py); the probe's own
training noise (its seed) is not in them.

Writes ``<out>/glue.md`` (the table and the verdicts), ``glue.csv`` (every value and interval), ``glue_differences.png``
(each later encoder's difference per task with its interval, the paper's Grounded-k − Bert beside it) and, with
``--record NAME``, ``docs/records/NAME.json`` for the docs' tables.

The paper's rows are its Table 12 (GLUE's test server, BERT-base, jiant). Its "Average" is the plain mean of the nine
printed columns (MNLI's m and mm as two), not GLUE's task-weighted score, and it prints one number for MRPC and STS-B
(which of F1 / accuracy and Pearson / Spearman is not said). The verdicts compare directions, not levels: the encoders
here are MiniLM-size and the test is GLUE's dev sets.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data_modules.glue import TASKS_BY_KEY
from grounding.docs_tables import DocsTableError, provenance, record_path, write_record
from grounding.errors import UserInputError, user_errors_exit
from grounding.semantic_space.intervals import Interval, interval_of_resamples, resample_indices
from grounding.utils.io import atomic_write_csv, atomic_write_text
from grounding.vgbert.glue_probe import PREDICTIONS_FILE, task_of_set

# Table 12 of the paper (GLUE test server, percent): Bert, then the grounded models (Grounded-k: k BERT layers trained
# on COCO; Relational-2: Grounded-8 then 2 layers on Visual Genome's relations).
PAPER_TABLE12 = {
    "Bert": {"cola": 40.7, "sst2": 92.6, "mrpc": 87.8, "stsb": 81.8, "qqp": 71.0, "mnli_m": 83.3, "mnli_mm": 82.0,
             "qnli": 89.4, "rte": 73.8, "average": 78.04},
    "Grounded-4": {"cola": 37.1, "sst2": 91.4, "mrpc": 86.0, "stsb": 83.3, "qqp": 70.8, "mnli_m": 82.7,
                   "mnli_mm": 81.5, "qnli": 88.9, "rte": 73.0, "average": 77.19},
    "Grounded-8": {"cola": 38.6, "sst2": 91.5, "mrpc": 86.3, "stsb": 83.4, "qqp": 70.8, "mnli_m": 82.0,
                   "mnli_mm": 81.0, "qnli": 87.9, "rte": 72.2, "average": 77.08},
    "Grounded-12": {"cola": 37.2, "sst2": 92.6, "mrpc": 86.5, "stsb": 82.3, "qqp": 70.5, "mnli_m": 82.3,
                    "mnli_mm": 81.7, "qnli": 89.2, "rte": 72.0, "average": 77.10},
    "Relational-2": {"cola": 38.0, "sst2": 92.8, "mrpc": 84.6, "stsb": 81.8, "qqp": 70.4, "mnli_m": 83.1,
                     "mnli_mm": 81.8, "qnli": 89.2, "rte": 71.7, "average": 77.04},
}
PAPER_GROUNDED = ("Grounded-4", "Grounded-8", "Grounded-12", "Relational-2")
GLUE_AVERAGE = "GLUE average (tasks here)"
PAPER_TASKS_AVERAGE = "average of the paper's tasks here"


class GlueReportError(UserInputError, ValueError):
    """A run folder without predictions, or runs that did not test the same examples (one line, exit 2)."""


@dataclass
class Predictions:
    """One run's dev predictions: evaluation set -> (rows, predictions, labels), each sorted by row."""
    name: str
    folder: Path
    sets: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]


def read_predictions(name: str, folder: str | Path) -> Predictions:
    """The ``glue_predictions.test.csv`` of a run folder."""
    path = Path(folder) / PREDICTIONS_FILE
    if not path.is_file():
        raise GlueReportError(f"--run {name}={folder}: no {path} (a GLUE probe's test writes it); fix: run `make glue "
                              f"GLUE_OUT={folder}` (its test step), or name another run folder")
    parts: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    with path.open(encoding="utf-8", newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            try:
                parts[row["eval_set"]].append((int(row["row"]), float(row["prediction"]), float(row["label"])))
            except (KeyError, TypeError, ValueError):
                raise GlueReportError(f"{path}:{line}: expected eval_set,row,prediction,label; fix: run the probe's "
                                      "test again (it rewrites the file)") from None
    if not parts:
        raise GlueReportError(f"{path}: no predictions; fix: run the probe's test again")
    sets = {}
    for eval_set, items in parts.items():
        try:
            task_of_set(eval_set)
        except KeyError:
            raise GlueReportError(f"{path}: {eval_set!r} is not a GLUE evaluation set") from None
        rows, preds, labels = (np.asarray(x) for x in zip(*sorted(items)))
        sets[eval_set] = (rows.astype(np.int64), preds.astype(np.float64), labels.astype(np.float64))
    return Predictions(name, Path(folder), sets)


def common_sets(runs: list[Predictions]) -> list[str]:
    """The evaluation sets every run tested, in GLUE's order; refused when runs differ in their examples."""
    reference = runs[0]
    for run in runs[1:]:
        if set(run.sets) != set(reference.sets):
            raise GlueReportError(f"--run {run.name} tested {sorted(run.sets)}, --run {reference.name} "
                                  f"{sorted(reference.sets)}; fix: probe every encoder on the same tasks")
        for name, (rows, _, labels) in run.sets.items():
            ref_rows, _, ref_labels = reference.sets[name]
            if not (np.array_equal(rows, ref_rows) and np.allclose(labels, ref_labels)):
                raise GlueReportError(f"--run {run.name}: its {name} examples differ from --run {reference.name}'s "
                                      "(another GLUE folder or eval_limit); fix: test every probe on the same data")
    order = [eval_set for task in TASKS_BY_KEY.values() for eval_set, _ in task.eval_sets]
    return [s for s in order if s in reference.sets]


# ------------------------------------------------------------------------------------- metrics, vectorised
def resampled_metric(metric: str, predictions: np.ndarray, labels: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """A GLUE metric (glue_probe.task_metrics' names; fractions) of every model over every resample:
    ``predictions`` (M, n), ``labels`` (n,), ``idx`` (R, n) -> (M, R). Equal to task_metrics on each resample (a
    correlation or MCC that is undefined is 0, as there)."""
    p, t = predictions[:, idx], labels[idx][None]
    if metric == "acc":
        return (p == t).mean(-1)
    if metric in ("pearson", "spearman"):
        if metric == "spearman":
            from scipy import stats

            p, t = stats.rankdata(p, axis=-1), stats.rankdata(t, axis=-1)
        p, t = p - p.mean(-1, keepdims=True), t - t.mean(-1, keepdims=True)
        num, den = (p * t).sum(-1), np.sqrt((p * p).sum(-1) * (t * t).sum(-1))
        return np.divide(num, den, out=np.zeros_like(num), where=den > 0)
    tp = ((p == 1) & (t == 1)).sum(-1).astype(np.float64)
    fp = ((p == 1) & (t != 1)).sum(-1).astype(np.float64)
    fn = ((p != 1) & (t == 1)).sum(-1).astype(np.float64)
    if metric == "f1":
        den = 2 * tp + fp + fn
        return np.divide(2 * tp, den, out=np.zeros_like(tp), where=den > 0)
    if metric == "mcc":  # binary (CoLA)
        tn = p.shape[-1] - tp - fp - fn
        den = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
        return np.divide(tp * tn - fp * fn, den, out=np.zeros_like(tp), where=den > 0)
    raise ValueError(f"unknown GLUE metric {metric!r}")


def glue_intervals(runs: list[Predictions], n_resamples: int = 1000, confidence: float = 0.95,
                   seed: int = 0) -> list[Interval]:
    """Every evaluation set's metrics, every task's mean of them, the GLUE average over the tasks present and the
    average over the paper's Table 12 tasks present, each with its percentile interval and the paired difference to
    runs[0] (in percent)."""
    models = [r.name for r in runs]
    out: list[Interval] = []
    per_task: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    sets = common_sets(runs)
    for task in dict.fromkeys(task_of_set(s) for s in sets):  # GLUE's order; a task's mean after its metrics
        fulls, boots, n_task = [], [], 0
        for eval_set in (s for s in sets if task_of_set(s) == task):
            _, _, labels = runs[0].sets[eval_set]
            predictions = np.stack([r.sets[eval_set][1] for r in runs])
            n = len(labels)
            n_task += n
            idx = resample_indices(n, n_resamples, zlib.crc32(f"{seed}:{eval_set}".encode()))
            for metric in task.metrics:
                full = 100 * resampled_metric(metric, predictions, labels, np.arange(n)[None])[:, 0]
                boot = 100 * resampled_metric(metric, predictions, labels, idx)
                out.append(interval_of_resamples(full, boot, models, f"{eval_set} {metric}", "examples", n, confidence))
                fulls.append(full)
                boots.append(boot)
        per_task[task.key] = (np.mean(fulls, axis=0), np.mean(boots, axis=0))
        if len(fulls) > 1:  # MRPC, STS-B, MNLI: the task's mean of its metrics (what the averages use)
            out.append(interval_of_resamples(*per_task[task.key], models, f"{task.key} (mean)", "examples", n_task,
                                             confidence))
    for label, keys in ((GLUE_AVERAGE, list(per_task)),
                        (PAPER_TASKS_AVERAGE, [k for k in per_task if k in PAPER_TABLE12["Bert"]])):
        if keys:
            full = np.mean([per_task[k][0] for k in keys], axis=0)
            boot = np.mean([per_task[k][1] for k in keys], axis=0)
            n = sum(len(runs[0].sets[s][2]) for s in runs[0].sets if task_of_set(s).key in keys)
            out.append(interval_of_resamples(full, boot, models, f"{label}: {', '.join(keys)}", "examples", n,
                                             confidence))
    return out


# ----------------------------------------------------------------------------------------- the paper beside
def paper_key(measure: str) -> str | None:
    """The Table 12 column a measure compares with (None: the paper has none, e.g. WNLI, or MRPC's accuracy)."""
    name = measure.split(" ")[0].rstrip(":")
    if measure.startswith(PAPER_TASKS_AVERAGE):
        return "tasks"
    if measure.startswith(GLUE_AVERAGE):
        return None
    if name in ("mrpc", "stsb"):  # one number in the paper: compared with the task's mean of its metrics
        return name if "(mean)" in measure else None
    return name if name in PAPER_TABLE12["Bert"] else None


def paper_values(measure: str, tasks: list[str]) -> tuple[float | None, list[float]]:
    """The paper's Bert value and its grounded models' differences to Bert (Grounded-4/8/12, Relational-2) for a
    measure; for the paper-tasks average, the mean of those task columns (MNLI's m and mm as the paper counts
    them)."""
    key = paper_key(measure)
    if key is None:
        return None, []
    if key == "tasks":
        columns = [c for t in tasks for c in ((f"{t}_m", f"{t}_mm") if t == "mnli" else (t,))]
        value = {m: float(np.mean([PAPER_TABLE12[m][c] for c in columns])) for m in PAPER_TABLE12}
    else:
        value = {m: PAPER_TABLE12[m][key] for m in PAPER_TABLE12}
    return value["Bert"], [value[m] - value["Bert"] for m in PAPER_GROUNDED]


def direction(low: float, high: float) -> str:
    return "lower" if high < 0 else "higher" if low > 0 else "no clear change"


def verdict(interval: Interval, i: int, paper_deltas: list[float]) -> str:
    """Model i's change against the reference, and whether it goes the paper's way (the sign of the mean of the
    paper's grounded-minus-Bert differences)."""
    ours = direction(interval.diff_low[i], interval.diff_high[i])
    if not paper_deltas:
        return ours
    paper = "lower" if np.mean(paper_deltas) < 0 else "higher"
    if ours == "no clear change":
        return f"no clear change (paper: {paper})"
    return f"{ours}, as the paper" if ours == paper else f"{ours} (paper: {paper})"


def record_rows(intervals: list[Interval]) -> tuple[list[str], dict[str, str], list[dict]]:
    """One row per measure: each model's value and interval (``m0``, ``m0_low``, ...), each later model's paired
    difference (``d1``, ``d1_low``, ...) and verdict (``v1``), the paper's Bert value and grounded differences."""
    models = intervals[0].models
    tasks = []
    for iv in intervals:
        if iv.measure.startswith(PAPER_TASKS_AVERAGE):
            tasks = iv.measure.split(": ", 1)[1].split(", ")
    rows = []
    for iv in intervals:
        bert, deltas = paper_values(iv.measure, tasks)
        row = {"measure": iv.measure, "n": iv.n_units, "paper_bert": bert,
               "paper_delta": " / ".join(f"{d:+.1f}".replace("-", "−") for d in deltas) if deltas else None}
        for i in range(len(models)):
            row.update({f"m{i}": float(iv.value[i]), f"m{i}_low": float(iv.low[i]), f"m{i}_high": float(iv.high[i])})
            if i:
                row.update({f"d{i}": float(iv.diff[i]), f"d{i}_low": float(iv.diff_low[i]),
                            f"d{i}_high": float(iv.diff_high[i]), f"v{i}": verdict(iv, i, deltas)})
        rows.append(row)
    columns = ["measure"] + [c for i in range(len(models)) for c in (f"m{i}", f"m{i}_ci")]
    columns += [c for i in range(1, len(models)) for c in (f"d{i}", f"d{i}_ci", f"v{i}")] + ["paper_bert", "paper_delta"]
    labels = {"measure": "measure (dev, %)", "paper_bert": "paper: Bert", "paper_delta":
              "paper: Grounded-4 / 8 / 12, Relational-2 − Bert"}
    for i, m in enumerate(models):
        labels.update({f"m{i}": m, f"m{i}_ci": "95 % CI"})
        if i:
            labels.update({f"d{i}": f"{m} − {models[0]}", f"d{i}_ci": "paired 95 % CI", f"v{i}": "direction"})
    return columns, labels, rows


# ----------------------------------------------------------------------------------------------- outputs
def _cell(value, low=None, high=None, signed=False) -> str:
    if value is None:
        return "–"
    text = f"{value:+.1f}" if signed else f"{value:.1f}"
    return text if low is None else f"{text} [{low:+.1f}, {high:+.1f}]" if signed else f"{text} [{low:.1f}, {high:.1f}]"


def markdown(intervals: list[Interval], runs: list[Predictions], confidence: float, n_resamples: int) -> str:
    columns, labels, rows = record_rows(intervals)
    models = intervals[0].models
    head = ["measure (dev, %)"] + models + [f"{m} − {models[0]}" for m in models[1:]] + ["direction"] * (len(models) > 1)
    head += ["paper: Bert", "paper: G-4 / G-8 / G-12 / Rel-2 − Bert"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["measure"]] + [_cell(row[f"m{i}"], row[f"m{i}_low"], row[f"m{i}_high"]) for i in range(len(models))]
        cells += [_cell(row[f"d{i}"], row[f"d{i}_low"], row[f"d{i}_high"], signed=True) for i in range(1, len(models))]
        if len(models) > 1:
            cells.append("; ".join(f"{models[i]}: {row[f'v{i}']}" if len(models) > 2 else row[f"v{i}"]
                                   for i in range(1, len(models))))
        cells += [_cell(row["paper_bert"]), row["paper_delta"] or "–"]
        lines.append("| " + " | ".join(cells) + " |")
    runs_text = "\n".join(f"- **{r.name}**: `{r.folder}`" for r in runs)
    return (f"# VG-BERT's GLUE probe (Table 12) on the data here\n\n{runs_text}\n\nEach encoder frozen, one pooling "
            f"layer shared by the tasks and a linear head per task trained on top; scored on the dev sets. "
            f"[{confidence:.0%} percentile intervals over {n_resamples} resamples of each dev set's examples; a "
            f"difference is paired over the same resamples; the direction says whether its interval excludes 0.]\n\n"
            + "\n".join(lines) + "\n\nThe paper's rows are GLUE test-server scores of BERT-base (Table 12); its "
            "average is the plain mean of its nine printed columns. Compare directions, not levels.\n")


def plot(intervals: list[Interval], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = intervals[0].models
    shown = [iv for iv in intervals if paper_key(iv.measure) or iv.measure.startswith(GLUE_AVERAGE)
             or iv.measure.split(" ")[0] in ("wnli",)]
    tasks = next((iv.measure.split(": ", 1)[1].split(", ") for iv in intervals
                  if iv.measure.startswith(PAPER_TASKS_AVERAGE)), [])
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(shown) + 1.4))
    y = np.arange(len(shown))[::-1]
    step = 0.7 / max(1, len(models))
    for i in range(1, len(models)):
        d = np.array([iv.diff[i] for iv in shown])
        err = np.array([[iv.diff[i] - iv.diff_low[i] for iv in shown], [iv.diff_high[i] - iv.diff[i] for iv in shown]])
        ax.errorbar(d, y + 0.35 - i * step, xerr=err, fmt="o", capsize=3, label=f"{models[i]} − {models[0]}")
    paper = [np.mean(paper_values(iv.measure, tasks)[1]) if paper_values(iv.measure, tasks)[1] else np.nan
             for iv in shown]
    ax.scatter(paper, y + 0.35, marker="x", color="black", zorder=3, label="paper: mean grounded − Bert")
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_yticks(y, [iv.measure.split(":")[0] for iv in shown])
    ax.set_xlabel("difference (GLUE points, dev)")
    ax.set_title("GLUE probe: grounded minus MiniLM, paired 95 % intervals")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


def fit_provenance(folder: Path) -> dict | None:
    """A probe run's fit: the commits its segments ran at, its epochs and seconds (``fit_record.json``; None when
    the folder has none)."""
    try:
        fit = json.loads((Path(folder) / "fit_record.json").read_text(encoding="utf-8"))
        return {"commits": list(dict.fromkeys(s.get("commit") for s in fit.get("segments", []))),
                "epochs": fit.get("epochs"), "seconds": fit.get("seconds")}
    except (OSError, ValueError, AttributeError):
        return None


def write_report(runs: list[Predictions], out: str | Path, n_resamples: int = 1000, confidence: float = 0.95,
                 seed: int = 0, record: Path | None = None) -> list[Interval]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    intervals = glue_intervals(runs, n_resamples, confidence, seed)
    atomic_write_csv(out / "glue.csv", [r for iv in intervals for r in iv.rows()],
                     ["measure", "units", "n_units", "model", "value", "low", "high", "diff", "diff_low", "diff_high"])
    atomic_write_text(out / "glue.md", markdown(intervals, runs, confidence, n_resamples))
    plot(intervals, out / "glue_differences.png")
    if record is not None:
        columns, labels, rows = record_rows(intervals)
        write_record(record, columns, rows, provenance(config=[str(r.folder / "config.yaml") for r in runs], seeds=[seed]),
                     title="VG-BERT's GLUE probe (Table 12) on the data here", labels=labels,
                     runs={r.name: str(r.folder) for r in runs}, fits={r.name: fit_provenance(r.folder) for r in runs},
                     resamples=n_resamples, confidence=confidence,
                     report=str(out / "glue.md"))
    return intervals


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grounding.vgbert.glue_report", allow_abbrev=False,
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--run", action="append", required=True, metavar="NAME=FOLDER",
                   help="a probed encoder's run folder (make glue's GLUE_OUT); the first is the reference")
    p.add_argument("--out", required=True, help="the report's folder")
    p.add_argument("--record", metavar="NAME", help="also write docs/records/NAME.json (or this path ending in .json)")
    p.add_argument("--resamples", type=int, default=1000)
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    with user_errors_exit(p.prog):
        if args.resamples < 10:
            raise GlueReportError(f"--resamples {args.resamples}: give at least 10 (1000 for the published intervals)")
        if not 0.5 <= args.confidence < 1:
            raise GlueReportError(f"--confidence {args.confidence}: give a level in [0.5, 1), e.g. 0.95")
        named = []
        for item in args.run:
            name, sep, folder = item.partition("=")
            if not sep or not name.strip() or not folder:
                raise GlueReportError(f"--run {item}: expected NAME=FOLDER (e.g. MiniLM=outputs/glue/minilm)")
            named.append((name.strip(), folder))
        if len({n for n, _ in named}) != len(named):
            raise GlueReportError("--run: two runs share a name; give each its own")
        try:
            record = record_path(args.record) if args.record else None
        except DocsTableError as e:
            raise GlueReportError(str(e)) from None
        runs = [read_predictions(name, folder) for name, folder in named]
        write_report(runs, args.out, args.resamples, args.confidence, args.seed, record)
    print(f"wrote {args.out}/glue.md, glue.csv and glue_differences.png" + (f"; the record {record}" if record else ""),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

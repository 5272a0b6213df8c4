"""COMPOSER against its cross-encoder baselines, trained on one schedule: learning curves and a test table.

    python -m grounding.composer.compare --runs outputs/composer/compare_world --out reports/composer/compare_world

Reads every run folder ``<model>_s<seed>`` under ``--runs`` (as ``make composer-compare`` writes them: a fit with the
CSV logger and ``train_recall_images`` set, then ``test`` with the CSV logger): its ``csv/version_*/metrics.csv``
(``train/t2i_r1`` every epoch; the test metrics). Writes ``learning_curves.png`` (train text→image R@1 against epoch, one line per
run, one colour per model) and ``compare.md`` / ``compare.json`` (per model: mean ± sd over seeds of test rsum, t2i
R@1, phrase R@1 and compositional R@1, with every seed's value).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

import numpy as np

from grounding.utils.io import atomic_write_json, atomic_write_text

RUN = re.compile(r"^(?P<model>.+)_s(?P<seed>\d+)$")
COLUMNS = {"rsum": "test/rsum", "t2i R@1": "test/t2i_r1", "i2t R@1": "test/i2t_r1", "phrase R@1": "test/phrase_r1",
           "comp. R@1": "test/compositional/t2i_r1"}


def _csv_rows(run: Path) -> list[list[dict]]:
    """Rows of every ``csv/version_*/metrics.csv`` of a run, version by version (fit, then test, ...)."""
    files = sorted(run.glob("csv/version_*/metrics.csv"), key=lambda p: int(p.parent.name.split("_")[1]))
    out = []
    for path in files:
        with open(path, newline="") as f:
            out.append(list(csv.DictReader(f)))
    return out


def read_curve(run: Path, metric: str = "train/t2i_r1") -> tuple[list[int], list[float]]:
    """(epochs from 1, values) of ``metric`` over every CSV log of a run: a resumed fit logs its later epochs in a
    new version, so the versions are joined in order, a later version's value winning for an epoch logged twice."""
    points: dict[int, float] = {}
    for rows in _csv_rows(run):
        points.update((int(float(r["epoch"])) + 1, float(r[metric])) for r in rows
                      if r.get(metric) not in (None, "") and r.get("epoch") not in (None, ""))
    epochs = sorted(points)
    return epochs, [points[e] for e in epochs]


def read_test(run: Path) -> dict[str, float]:
    """The last ``test/...`` row of a run's CSV logs (its newest ``test``)."""
    for rows in reversed(_csv_rows(run)):
        for row in reversed(rows):
            if row.get("test/rsum") not in (None, ""):
                return {k: float(v) for k, v in row.items() if k.startswith("test/") and v not in (None, "")}
    return {}


def compare(runs_dir: Path, out: Path) -> dict:
    runs: dict[str, list[Path]] = {}
    for run in sorted(p for p in runs_dir.iterdir() if p.is_dir()):
        m = RUN.match(run.name)
        if m:
            runs.setdefault(m["model"], []).append(run)
    if not runs:
        raise FileNotFoundError(f"{runs_dir}: no run folders named <model>_s<seed>; run `make composer-compare` first")
    table = {}
    for model, folders in runs.items():
        tests = [read_test(f) for f in folders]
        row = {}
        for name, key in COLUMNS.items():
            values = [t[key] for t in tests if key in t]
            if values:
                row[name] = {"mean": float(np.mean(values)), "sd": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
                             "seeds": values}
        table[model] = {"runs": [f.name for f in folders], **row}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "compare.json", table, indent=2)
    header = "| model | seeds | " + " | ".join(COLUMNS) + " |"
    lines = [header, "|" + "---|" * (len(COLUMNS) + 2)]
    for model, row in table.items():
        cells = [f"{row[c]['mean']:.1f} ± {row[c]['sd']:.1f}" if c in row else "–" for c in COLUMNS]
        lines.append(f"| {model} | {len(row['runs'])} | " + " | ".join(cells) + " |")
    atomic_write_text(out / "compare.md", "\n".join(lines) + "\n")
    _plot(runs, out / "learning_curves.png")
    return table


def _plot(runs: dict[str, list[Path]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for colour, (model, folders) in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], runs.items()):
        for i, run in enumerate(folders):
            epochs, values = read_curve(run)
            if epochs:
                ax.plot(epochs, values, color=colour, marker="o", ms=3, alpha=0.9 if i == 0 else 0.55,
                        label=model if i == 0 else None)
    ax.set_xlabel("epoch")
    ax.set_ylabel("train text→image R@1 (%)")
    ax.set_title("Fitting the training data (one line per seed)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grounding.composer.compare", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", required=True, help="folder of <model>_s<seed> run folders")
    parser.add_argument("--out", required=True, help="report folder (learning_curves.png, compare.md, compare.json)")
    args = parser.parse_args(argv)
    runs = Path(args.runs)
    if not runs.is_dir():
        print(f"error: --runs {runs} is not a folder; run `make composer-compare` first", file=sys.stderr)
        return 2
    try:
        compare(runs, Path(args.out))
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print((Path(args.out) / "compare.md").read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

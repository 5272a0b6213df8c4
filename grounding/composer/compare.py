"""COMPOSER against its cross-encoder baselines, trained on one schedule: learning curves and a test table.

    python -m grounding.composer.compare --runs outputs/composer/compare_world --out reports/composer/compare_world

Reads every run folder ``<model>_s<seed>`` under ``--runs`` (as ``make composer-compare`` writes them: a fit with the
CSV logger and ``train_recall_images`` set, then ``test`` with the CSV logger): its ``csv/version_*/metrics.csv``
(``train/t2i_r1`` every epoch; the last ``val/rsum``; the test metrics), the test metrics of ``<run>/compositional``
when the run was also tested on an MCD split there (``make composer-compare``'s ``COMPARE_MCD``; its text→image R@1
is then the compositional column, else the world's held-out-pair captions' ``test/compositional/t2i_r1``) and
``fit_record.json`` (epochs, training wall time, the commit of each fit segment). Writes ``learning_curves.png``
(train text→image R@1 against epoch, one line per run, one colour per model) and ``compare.md`` / ``compare.json``
(per model: mean ± sd over seeds of test rsum, t2i / i2t R@1, phrase R@1 and compositional R@1, with every seed's
value; then one row per run).

Run folders do not always outlive the machine that made them, and a paper-schedule comparison takes several sessions,
so ``--recorded FILE`` (repeatable) merges the runs of an earlier ``compare.json`` (e.g. the committed
``docs/records/composer_compare_flickr8k.json``): a run folder found under ``--runs`` replaces the recorded run of
the same name when it is tested (or the recorded one is not). Merged runs carry ``recorded_in``. Copy the merged
``compare.json`` over the record to keep new runs, or give ``--record NAME``; ``--list-tested`` only prints the
recorded runs that hold test metrics, which ``make composer-compare`` then skips.

``--record NAME`` also writes the comparison as ``docs/records/NAME.json`` (a path ending in ``.json``: there), a record
of :mod:`grounding.docs_tables`: compare.json's ``models`` and ``runs``, the provenance (this command line, ``--config``
FILE..., the configs the runs were fitted with, else those of the ``--recorded`` records, this commit and machine, the
tested runs' seeds) and the table the docs render (:func:`record_rows`: a row per run, then a row per model with the
mean and sd over its tested runs). A table of ``--recorded`` runs alone, from one record, keeps that record's provenance
(it was measured then): ``--recorded docs/records/X.json --out DIR --record X`` rewrites the record from itself.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

import numpy as np

from grounding.docs_tables import PROVENANCE, DocsTableError, provenance, record_path, write_record
from grounding.errors import user_errors_exit
from grounding.lightning import read_fit_record
from grounding.utils.io import atomic_write_json, atomic_write_text

RUN = re.compile(r"^(?P<model>.+)_s(?P<seed>\d+)$")
COLUMNS = {"rsum": "test/rsum", "t2i R@1": "test/t2i_r1", "i2t R@1": "test/i2t_r1", "phrase R@1": "test/phrase_r1",
           "comp. R@1": "test/compositional/t2i_r1"}
MCD_FOLDER = "compositional"  # <run>/compositional: the run's checkpoint tested on an MCD split (make's COMPARE_MCD)
# the record's table (grounding.docs_tables): a model's mean/sd keys (compare.json's column -> the row's key; sd: _sd)
RECORD_MEANS = {"rsum": "rsum", "t2i R@1": "t2i_r1", "i2t R@1": "i2t_r1", "phrase R@1": "phrase_r1", "comp. R@1": "comp_r1",
                "dev rsum": "dev_rsum"}
# a run's row: its test metrics (row key -> test/ metric); comp_r1 is column_value's "comp. R@1"
RECORD_TEST = {"rsum": "test/rsum", "t2i_r1": "test/t2i_r1", "t2i_r5": "test/t2i_r5", "t2i_r10": "test/t2i_r10",
               "i2t_r1": "test/i2t_r1", "i2t_r5": "test/i2t_r5", "i2t_r10": "test/i2t_r10", "phrase_r1": "test/phrase_r1"}
RECORD_COLUMNS = ("model", "seed", "runs", "rsum", "rsum_sd", "t2i_r1", "t2i_r1_sd", "t2i_r5", "t2i_r10", "i2t_r1", "i2t_r1_sd",
                  "i2t_r5", "i2t_r10", "phrase_r1", "phrase_r1_sd", "comp_r1", "comp_r1_sd", "dev_rsum", "dev_rsum_sd", "epochs",
                  "train_minutes", "fit_commits")
RECORD_LABELS = {"runs": "tested runs", "rsum": "test rsum", "rsum_sd": "sd", "t2i_r1": "t2i R@1", "t2i_r5": "t2i R@5",
                 "t2i_r10": "t2i R@10", "i2t_r1": "i2t R@1", "i2t_r5": "i2t R@5", "i2t_r10": "i2t R@10",
                 "phrase_r1": "phrase R@1", "comp_r1": "comp. R@1 (MCD)", "dev_rsum": "dev rsum (last)",
                 "train_minutes": "fit min", "fit_commits": "fit commits"}


def column_value(run: dict, column: str) -> float | None:
    """A run record's value of a table column; the compositional column is the MCD split's text→image R@1 when the
    run was tested on one, else the world's held-out-pair captions' R@1 of its own test."""
    if column == "comp. R@1" and (run.get("mcd_test") or {}).get("test/t2i_r1") is not None:
        return run["mcd_test"]["test/t2i_r1"]
    return run["test"].get(COLUMNS[column])


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


def read_run(run: Path) -> dict:
    """One run folder as a record: its model and seed (from the name), train R@1 curve, test metrics, the MCD split's
    test metrics (``mcd_test``; empty without one), last dev rsum, and from ``fit_record.json`` its epochs, training
    minutes and the commits its fit ran at."""
    m = RUN.match(run.name)
    epochs, values = read_curve(run)
    dev_epochs, dev = read_curve(run, "val/rsum")
    fit = read_fit_record(run)
    minutes, trained, commits = None, None, []
    if fit is not None:
        minutes = None if fit["seconds"] is None else round(fit["seconds"] / 60, 1)
        trained = fit["epochs"]
        commits = list(dict.fromkeys(s["commit"] for s in fit.get("segments") or [] if isinstance(s, dict) and s.get("commit")))
    return {"model": m["model"], "seed": int(m["seed"]), "curve": {"epochs": epochs, "train/t2i_r1": values},
            "test": read_test(run), "mcd_test": read_test(run / MCD_FOLDER), "dev_rsum": dev[-1] if dev else None,
            "dev_epoch": dev_epochs[-1] if dev else None,
            "epochs": trained, "train_minutes": minutes, "commits": commits}


def read_recorded(path: Path) -> dict[str, dict]:
    """The runs of an earlier ``compare.json``, each marked ``recorded_in``; a file that is not such a record is one
    ValueError naming what was expected."""
    try:
        runs = json.loads(Path(path).read_text(encoding="utf-8"))["runs"]
        for name, r in runs.items():
            if not RUN.match(name) or not isinstance(r["test"], dict):
                raise ValueError(f"run {name!r}")
            str(r["model"]), int(r["seed"]), list(r["curve"]["epochs"]), list(r["curve"]["train/t2i_r1"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"--recorded {path}: not a compare.json this command wrote ({type(e).__name__}: {e}); expected "
                         '{"runs": {"<model>_s<seed>": {"model", "seed", "curve", "test", ...}}}') from None
    return {name: {**r, "recorded_in": r.get("recorded_in") or str(path)} for name, r in runs.items()}


def merge_runs(found: dict[str, dict], recorded: dict[str, dict]) -> dict[str, dict]:
    """The recorded runs with the found ones over them: a found run replaces a recorded one of its name when it is
    tested or the recorded one is not (an untested folder never hides a recorded test). Sorted by model, then seed."""
    merged = dict(recorded)
    for name, run in found.items():
        if name not in merged or run["test"] or not merged[name]["test"]:
            merged[name] = run
    return dict(sorted(merged.items(), key=lambda kv: (kv[1]["model"], kv[1]["seed"])))


def _mean_sd(values: list[float]) -> dict:
    return {"mean": float(np.mean(values)), "sd": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
            "seeds": values}


def compare(runs_dir: Path | None, out: Path, recorded: list[Path] = ()) -> dict:
    """Reads the run folders under ``runs_dir`` (None or missing: none) and merges the ``recorded`` files' runs;
    writes ``compare.json`` / ``compare.md`` / ``learning_curves.png`` to ``out`` and returns the JSON's content:
    ``{"models": {model: {"runs", column: {mean, sd, seeds}}}, "runs": {name: record}}``."""
    found = {}
    if runs_dir is not None and runs_dir.is_dir():
        found = {run.name: read_run(run) for run in sorted(runs_dir.iterdir()) if run.is_dir() and RUN.match(run.name)}
    older: dict[str, dict] = {}
    for path in recorded:
        older.update(read_recorded(path))
    runs = merge_runs(found, older)
    if not runs:
        raise FileNotFoundError(f"{runs_dir}: no run folders named <model>_s<seed>; run `make composer-compare` first")
    models: dict[str, dict] = {}
    for name, run in runs.items():
        models.setdefault(run["model"], {"runs": []})["runs"].append(name)
    for row in models.values():
        # a row's numbers are its tested runs' only: an untested run (a fit still going) is listed and plotted, but its
        # mid-training dev rsum is not averaged with finished runs, and it is not counted as a seed
        tested = [runs[n] for n in row["runs"] if runs[n]["test"].get("test/rsum") is not None]
        row["tested"] = len(tested)
        for column in COLUMNS:
            values = [v for v in (column_value(r, column) for r in tested) if v is not None]
            if values:
                row[column] = _mean_sd(values)
        dev = [r["dev_rsum"] for r in tested if r.get("dev_rsum") is not None]
        if dev:
            row["dev rsum"] = _mean_sd(dev)
    report = {"models": models, "runs": runs}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "compare.json", report, indent=2)
    atomic_write_text(out / "compare.md", _markdown(report))
    _plot(runs, out / "learning_curves.png")
    return report


def record_rows(report: dict) -> list[dict]:
    """The record's table of a comparison (``{"models", "runs"}``, compare.json's content): a row per run (its model,
    seed, ``runs`` 1 when tested else 0, its test metrics, the compositional R@1 of :func:`column_value`, last dev
    rsum, epochs, training minutes, the commits its fit ran at, its name as ``run``), then a row per model (seed null,
    ``runs`` its tested runs, each mean of compare.json with its sd as ``<key>_sd``; a column no tested run has is
    left out)."""
    rows = []
    for name, r in report["runs"].items():
        tested = r["test"].get("test/rsum") is not None
        rows.append({"model": r["model"], "seed": int(r["seed"]), "runs": 1 if tested else 0,
                     **{key: r["test"].get(metric) for key, metric in RECORD_TEST.items()},
                     "comp_r1": column_value(r, "comp. R@1"), "dev_rsum": r.get("dev_rsum"), "epochs": r.get("epochs"),
                     "train_minutes": r.get("train_minutes"), "fit_commits": list(r.get("commits") or []) or None,
                     "run": name})
    for model, m in report["models"].items():
        # records written before compare.json counted tested runs ("tested") had only tested runs
        tested = m.get("tested", sum(report["runs"][n]["test"].get("test/rsum") is not None for n in m["runs"]))
        row = {"model": model, "seed": None, "runs": tested}
        for column, key in RECORD_MEANS.items():
            if isinstance(m.get(column), dict):
                row[key], row[f"{key}_sd"] = m[column]["mean"], m[column]["sd"]
        rows.append(row)
    return rows


def record_seeds(report: dict) -> list[int] | None:
    """The seeds of the comparison's tested runs (None when none is tested)."""
    seeds = sorted({int(r["seed"]) for r in report["runs"].values() if r["test"].get("test/rsum") is not None})
    return seeds or None


def read_json(path: Path):
    """A JSON file's content, or None when it cannot be read."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def rewritten_record(report: dict, recorded: list[Path]) -> tuple[dict, dict] | None:
    """When every run of the table comes from the one ``--recorded`` file and that file is a record (provenance
    keys): (its provenance keys with its ``provenance_note``, the report with each run's ``recorded_in`` as the record
    has it) - a rewrite keeps when and where the table was measured, and a record rewritten from itself is itself.
    Else None."""
    if len(recorded) != 1 or not all(r.get("recorded_in") for r in report["runs"].values()):
        return None
    written = read_json(recorded[0])
    if not isinstance(written, dict) or not set(PROVENANCE) <= set(written) or not isinstance(written.get("runs"), dict):
        return None
    keys = {k: written[k] for k in (*PROVENANCE, "provenance_note") if k in written}
    runs = {}
    for name, run in report["runs"].items():
        was = written["runs"].get(name)  # the record's run: with its recorded_in, null or none at all
        was = was if isinstance(was, dict) else run
        runs[name] = {k: (was.get(k) if k == "recorded_in" else v) for k, v in run.items() if k != "recorded_in" or k in was}
    return keys, {**report, "runs": runs}


def record_config(recorded: list[Path], configs: list[str]) -> str | list[str] | None:
    """The record's ``config``: ``configs`` (``--config``), then the configs the ``--recorded`` records name; one path
    as a string, several as a list, none None."""
    named = list(configs)
    for path in recorded:
        written = read_json(path)
        value = written.get("config") if isinstance(written, dict) else None
        named += [value] if isinstance(value, str) else [c for c in value or [] if isinstance(c, str)]
    named = list(dict.fromkeys(named))
    return named[0] if len(named) == 1 else named or None


def write_compare_record(path: str | Path, report: dict, recorded: list[Path] = (), configs: list[str] = (),
                         keys: dict | None = None) -> Path:
    """The comparison as a record of :mod:`grounding.docs_tables` at ``path``: its provenance (``keys``; default:
    :func:`rewritten_record`'s for a rewrite of one record, else this command, commit, date and machine, the tested
    runs' seeds and :func:`record_config`), compare.json's ``models`` and ``runs`` (``--recorded`` reads it back),
    ``labels``, ``columns`` and :func:`record_rows`."""
    rewrite = rewritten_record(report, list(recorded)) if keys is None else None
    if rewrite is not None:
        keys, report = rewrite
    elif keys is None:
        keys = provenance(config=record_config(list(recorded), list(configs)), seeds=record_seeds(report))
    note = {"provenance_note": keys["provenance_note"]} if keys.get("provenance_note") else {}
    return write_record(path, list(RECORD_COLUMNS), record_rows(report), keys, **note, models=report["models"],
                        runs=report["runs"], labels=RECORD_LABELS)


def _markdown(report: dict) -> str:
    columns = [*COLUMNS, "dev rsum"]
    lines = ["| model | seeds | " + " | ".join(columns) + " |", "|" + "---|" * (len(columns) + 2)]
    for model, row in report["models"].items():
        cells = ["–" if c not in row else f"{row[c]['mean']:.1f}" if len(row[c]["seeds"]) == 1
                 else f"{row[c]['mean']:.1f} ± {row[c]['sd']:.1f}" for c in columns]
        training = len(row["runs"]) - row["tested"]
        seeds = f"{row['tested']}" + (f" (+{training} untested)" if training else "")
        lines.append(f"| {model} | {seeds} | " + " | ".join(cells) + " |")
    lines += ["", "| run | test rsum | comp. R@1 | last train t2i R@1 | dev rsum (epoch) | epochs | train min | commit |",
              "|---|---|---|---|---|---|---|---|"]

    def cell(value, fmt="{:.1f}"):
        return "–" if value is None else fmt.format(value)

    for name, r in report["runs"].items():
        curve = r["curve"]["train/t2i_r1"]
        dev = "–" if r.get("dev_rsum") is None else f"{r['dev_rsum']:.1f} ({r['dev_epoch']})"
        commit = ", ".join(r.get("commits") or []) or "–"
        lines.append(f"| {name} | {cell(r['test'].get('test/rsum'))} | {cell(column_value(r, 'comp. R@1'))} | "
                     f"{cell(curve[-1] if curve else None)} | {dev} | {cell(r.get('epochs'), '{}')} | "
                     f"{cell(r.get('train_minutes'))} | {commit}{' (recorded)' if r.get('recorded_in') else ''} |")
    return "\n".join(lines) + "\n"


def _plot(runs: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colours = dict(zip(dict.fromkeys(r["model"] for r in runs.values()), plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    labelled = set()
    for run in runs.values():
        epochs, values = run["curve"]["epochs"], run["curve"]["train/t2i_r1"]
        if epochs:
            first = run["model"] not in labelled
            labelled.add(run["model"])
            ax.plot(epochs, values, color=colours[run["model"]], marker="o", ms=3, alpha=0.9 if first else 0.55,
                    label=run["model"] if first else None)
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("train text→image R@1 (%)")
    ax.set_title("Fitting the training data (one line per seed)")
    ax.grid(alpha=0.3)
    if labelled:
        ax.legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grounding.composer.compare", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", help="folder of <model>_s<seed> run folders")
    parser.add_argument("--out", help="report folder (learning_curves.png, compare.md, compare.json)")
    parser.add_argument("--recorded", action="append", default=[], metavar="FILE",
                        help="an earlier compare.json whose runs join the table (repeatable)")
    parser.add_argument("--list-tested", action="store_true",
                        help="only print the names of the --recorded runs that hold test metrics, one a line")
    parser.add_argument("--record", metavar="NAME",
                        help="also write the comparison with its provenance to docs/records/NAME.json (or this path "
                             "ending in .json)")
    parser.add_argument("--config", action="append", default=[], metavar="FILE",
                        help="with --record: a config the runs were fitted with, the record's config (repeatable; "
                             "default: the --recorded records' configs)")
    args = parser.parse_args(argv)
    try:
        record = record_path(args.record) if args.record else None
        if record is not None and args.list_tested:
            raise ValueError("--list-tested writes nothing: give it without --record")
        if record is not None and record.is_dir():
            raise ValueError(f"--record {args.record}: {record} is a folder; name a record or a file ending in .json")
        if args.config and record is None:
            raise ValueError("--config names the record's config: give it with --record")
        recorded = {}
        for path in args.recorded:
            recorded.update(read_recorded(Path(path)))
    except (ValueError, DocsTableError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.list_tested:
        print("\n".join(name for name, run in recorded.items() if run["test"]))
        return 0
    if not args.out:
        parser.error("--out is required (unless --list-tested)")
    runs = Path(args.runs) if args.runs else None
    if not args.recorded and (runs is None or not runs.is_dir()):
        print(f"error: --runs {runs} is not a folder; run `make composer-compare` first (or give --recorded FILE)",
              file=sys.stderr)
        return 2
    try:
        report = compare(runs, Path(args.out), [Path(p) for p in args.recorded])
        if record is not None:
            write_compare_record(record, report, [Path(p) for p in args.recorded], args.config)
    except (FileNotFoundError, DocsTableError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print((Path(args.out) / "compare.md").read_text(), end="")
    if record is not None:
        print(f"wrote the record {record}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    with user_errors_exit("python -m grounding.composer.compare"):
        sys.exit(main())

"""``python -m grounding.semantic_space.seeds``: one grounded model trained with several seeds, its semantic-space moves
summarised over the seeds.

Each seed's report (``python -m grounding.semantic_space``, ``intervals_part`` on) holds ``intervals.csv``: every
measure's value for the reference (the report's first model, MiniLM) and for the grounded model, and the grounded
model's paired difference Δ with its bootstrap interval over the evaluation items. Those intervals say whether one
trained model moved; they do not say whether training again would move it the same way. This summary does: per
measure, the reference's value, the grounded value and Δ as mean ± sd over the seeds (sample sd, n − 1), each seed's
Δ with its paired interval, and how many seeds' intervals exclude 0 upwards and downwards. A move is called
*consistent* when every seed's interval excludes 0 in the same direction.

    python -m grounding.semantic_space.seeds \
        --seed reports/semantic_space/flickr8k_full "Grounded (6,000 photos)" \
        --seed reports/semantic_space/flickr8k_full_seed1 "Grounded (6,000 photos, seed 1)" \
        --seed reports/semantic_space/flickr8k_full_seed2 "Grounded (6,000 photos, seed 2)" \
        --out reports/semantic_space/flickr8k_full_seeds [--record NAME]

A ``--seed`` path is a report folder or its ``intervals.csv`` (a recorded copy works the same). Every report must
share the reference model and the measures. Writes ``seeds.md`` and ``seeds.csv`` into ``--out`` (each file through
a temporary name; nothing else in the folder is touched). ``--record NAME`` also writes the per-seed table as a record
of :mod:`grounding.docs_tables`, ``docs/records/NAME.json`` (a path ending in ``.json``: there): a row per measure
with seeds.csv's numbers, each seed's Δ interval as ``diff_seed<i>_ci`` ``[low, high]``, the verdict and the paper's
direction; its config the reports' ``config.yaml`` files (where a report folder holds one), its seeds null (the
grounded models' training seeds are their checkpoints', not known to this command).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from grounding.docs_tables import provenance, record_option, write_record
from grounding.errors import UserInputError, user_errors_exit
from grounding.semantic_space.intervals import PAPER_DIRECTION
from grounding.utils.io import atomic_write_text

PROG = "python -m grounding.semantic_space.seeds"
COLUMNS = ("measure", "units", "n_units", "model", "value", "low", "high", "diff", "diff_low", "diff_high")


def read_intervals(path: str | Path, model: str) -> tuple[str, pd.DataFrame]:
    """The reference's name and a frame of ``model``'s rows (one per measure, the reference's value beside them) of
    the report at ``path`` (a folder holding ``intervals.csv``, or the file)."""
    path = Path(path)
    file = path / "intervals.csv" if path.is_dir() else path
    if not file.is_file():
        raise UserInputError(f"{file}: no such file; expected a semantic-space report folder with intervals.csv "
                             "(run python -m grounding.semantic_space with intervals_part.n_resamples > 0)")
    try:
        frame = pd.read_csv(file)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise UserInputError(f"{file}: not a readable CSV ({' '.join(str(e).split())}); expected a report's "
                             "intervals.csv") from None
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise UserInputError(f"{file}: columns {missing} missing; expected a report's intervals.csv with {list(COLUMNS)}")
    models = list(dict.fromkeys(frame["model"]))
    if model not in models[1:]:
        raise UserInputError(f"{file}: no grounded model named {model!r}; it holds {models} (the first is the "
                             "reference); name one of the others after the path")
    reference = models[0]
    ref = frame[frame["model"] == reference].set_index("measure")
    rows = frame[frame["model"] == model].set_index("measure").copy()
    rows["reference"] = ref.loc[rows.index, "value"]
    return reference, rows


def summarise(seeds: list[tuple[str | Path, str]]) -> pd.DataFrame:
    """One row per measure (in the first report's order) over the ``(report, model)`` seeds: reference, value and Δ
    as mean and sd over seeds, each seed's Δ with its interval, and the counts of intervals above / below 0."""
    if not seeds:
        raise UserInputError(f"{PROG}: no --seed given; name at least one report folder and its grounded model")
    read = [read_intervals(path, model) for path, model in seeds]
    references = {ref for ref, _ in read}
    if len(references) > 1:
        raise UserInputError(f"{PROG}: the reports compare with different reference models {sorted(references)}; "
                             "every seed's report must start from the same model")
    measures = list(read[0][1].index)
    for (path, _), (_, frame) in zip(seeds, read):
        if list(frame.index) != measures:
            raise UserInputError(f"{path}: its measures differ from {seeds[0][0]}'s ({sorted(set(frame.index) ^ set(measures))}); "
                                 "run every seed's report with the same config")
    stack = {key: np.stack([frame.loc[measures, key].to_numpy(dtype=np.float64) for _, frame in read])
             for key in ("reference", "value", "diff", "diff_low", "diff_high")}
    n = len(read)
    ddof = 1 if n > 1 else 0

    def sd(key):
        return stack[key].std(axis=0, ddof=ddof) if n > 1 else np.full(len(measures), np.nan)

    up = (stack["diff_low"] > 0).sum(axis=0)
    down = (stack["diff_high"] < 0).sum(axis=0)
    first = read[0][1]
    out = pd.DataFrame({
        "measure": measures, "units": first.loc[measures, "units"].to_numpy(),
        "n_units": first.loc[measures, "n_units"].to_numpy(), "seeds": n,
        "reference_mean": stack["reference"].mean(0), "reference_sd": sd("reference"),
        "value_mean": stack["value"].mean(0), "value_sd": sd("value"),
        "diff_mean": stack["diff"].mean(0), "diff_sd": sd("diff"),
        "seeds_up": up, "seeds_down": down,
    })
    for i in range(n):
        out[f"diff_seed{i}"] = stack["diff"][i]
        out[f"diff_low_seed{i}"] = stack["diff_low"][i]
        out[f"diff_high_seed{i}"] = stack["diff_high"][i]
    return out


def verdict(up: int, down: int, n: int) -> str:
    """``consistent up/down`` when every seed's interval excludes 0 the same way, else the counts."""
    if up == n:
        return "consistent up"
    if down == n:
        return "consistent down"
    return f"{up} up, {down} down, {n - up - down} include 0"


def markdown(summary: pd.DataFrame, seeds: list[tuple[str | Path, str]], reference: str) -> str:
    def pm(mean, sd, sign=""):
        return f"{mean:{sign}.3f}" if not np.isfinite(sd) else f"{mean:{sign}.3f} ± {sd:.3f}"

    n = len(seeds)
    head = ["measure", "units", reference, "grounded", "Δ mean ± sd"] + [f"Δ seed {i} [95 % CI]" for i in range(n)] + \
        ["seeds", "paper"]
    lines = [f"# The semantic-space moves over {n} seed{'s' if n != 1 else ''}\n",
             f"Reference: **{reference}**. Seeds (report, model): " +
             "; ".join(f"`{p}` ({m})" for p, m in seeds) + ".\n",
             "Value and Δ: mean ± sd over the seeds (sample sd). Each seed's Δ carries its paired bootstrap interval "
             "over the evaluation items (from its report); `seeds` counts the intervals that exclude 0 upwards and "
             "downwards, *consistent* when all do the same way.\n",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in summary.iterrows():
        cells = [r["measure"], f"{int(r['n_units'])} {r['units']}", pm(r["reference_mean"], r["reference_sd"]),
                 pm(r["value_mean"], r["value_sd"]), pm(r["diff_mean"], r["diff_sd"], "+")]
        cells += [f"{r[f'diff_seed{i}']:+.3f} [{r[f'diff_low_seed{i}']:+.3f}, {r[f'diff_high_seed{i}']:+.3f}]"
                  for i in range(n)]
        cells += [verdict(int(r["seeds_up"]), int(r["seeds_down"]), n), paper_direction(r["measure"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def paper_direction(measure: str) -> str:
    """The paper's direction of a measure's move (``PAPER_DIRECTION``), or ``""``."""
    return next((v for k, v in PAPER_DIRECTION.items() if measure.startswith(k)), "")


def record_table(summary: pd.DataFrame, reference: str) -> tuple[list[str], dict[str, str], list[dict]]:
    """seeds.md's table as a record's columns, labels and rows: every number of seeds.csv (a row per measure), each
    seed's Δ interval as ``diff_seed<i>_ci`` ``[low, high]``, ``verdict`` and ``paper``."""
    n = int(summary["seeds"].iloc[0]) if len(summary) else 0
    labels = {"measure": "measure", "n_units": "n", "units": "units", "reference_mean": reference,
              "reference_sd": f"{reference} sd", "value_mean": "grounded", "value_sd": "grounded sd",
              "diff_mean": "Δ mean", "diff_sd": "Δ sd"}
    for i in range(n):
        labels.update({f"diff_seed{i}": f"Δ seed {i}", f"diff_seed{i}_ci": f"Δ seed {i} 95 % CI"})
    labels.update({"verdict": "seeds", "paper": "paper"})
    rows = []
    for record in summary.to_dict(orient="records"):
        row = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in record.items()}
        row.update({f"diff_seed{i}_ci": [row[f"diff_low_seed{i}"], row[f"diff_high_seed{i}"]] for i in range(n)})
        row.update(verdict=verdict(int(row["seeds_up"]), int(row["seeds_down"]), n), paper=paper_direction(row["measure"]))
        rows.append(row)
    return list(labels), labels, rows


def write_seeds_record(path: str | Path, summary: pd.DataFrame, seeds: list[tuple[str | Path, str]], reference: str) -> Path:
    """The per-seed table as a record at ``path`` (:func:`record_table`); config: each report folder's config.yaml."""
    columns, labels, rows = record_table(summary, reference)
    configs = [str(Path(p) / "config.yaml") for p, _ in seeds if (Path(p) / "config.yaml").is_file()]
    return write_record(path, columns, rows, provenance(config=configs or None),
                        title=f"The semantic-space moves over {len(seeds)} seed{'s' if len(seeds) != 1 else ''}",
                        labels=labels, reference=reference, reports=[{"report": str(p), "model": m} for p, m in seeds])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", nargs=2, action="append", metavar=("REPORT", "MODEL"), default=[], required=True,
                        help="a seed's report folder (or its intervals.csv) and the grounded model's name in it")
    parser.add_argument("--out", required=True, help="folder for seeds.md and seeds.csv")
    parser.add_argument("--record", metavar="NAME", default=None,
                        help="also write the per-seed table as docs/records/NAME.json (or this path ending in .json)")
    args = parser.parse_args(argv)
    record = record_option(args.record)
    seeds = [(path, model) for path, model in args.seed]
    summary = summarise(seeds)
    reference = read_intervals(*seeds[0])[0]
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserInputError(f"--out {out}: a file is in the way; expected a folder for seeds.md and seeds.csv")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "seeds.csv", summary.to_csv(index=False))
    atomic_write_text(out / "seeds.md", markdown(summary, seeds, reference))
    print(f"[semantic_space.seeds] {len(seeds)} seeds summarised in {out / 'seeds.md'}")
    if record is not None:
        print(f"[semantic_space.seeds] wrote the record {write_seeds_record(record, summary, seeds, reference)}")
    return 0


if __name__ == "__main__":
    with user_errors_exit(PROG):
        sys.exit(main())

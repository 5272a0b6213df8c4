"""``python -m grounding.leaderboard.evaluate_splits --config <model yaml> --ckpt <ckpt> --splits <mcd out dir>
[--out DIR] [--rerank-top-k K] [--limit N] [--record NAME]``: one trained COMPOSER checkpoint tested on the MCD split
and every graded split of ``python -m grounding.composer mcd`` (Fig. 4; :func:`grounding.leaderboard.splits.evaluate_splits`).
``python -m grounding.composer evaluate-splits`` (its old name) starts this command. ``--record NAME`` also writes the
table (``splits.csv``: a row per split, numbers unrounded as ``splits.json`` keeps them) as a record of
:mod:`grounding.docs_tables`, ``docs/records/NAME.json`` (a path ending in ``.json``: there), its config the
``--config`` file, its seeds null (the checkpoint's training seed is not known here). Bad input: one line, exit 2."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from grounding.docs_tables import provenance, record_option, write_record
from grounding.errors import user_errors_exit
from grounding.leaderboard.splits import COLUMNS, SplitEvalError, evaluate_splits
from grounding.paths import shared_data_dir

PROG = "python -m grounding.leaderboard.evaluate_splits"
# the record's headers (the table's columns, as the docs print them)
LABELS = {"split": "split", "file": "file", "compound_divergence": "compound divergence",
          "atom_divergence": "atom divergence", "images": "images", "captions": "captions", "t2i_r1": "t2i R@1",
          "t2i_r5": "t2i R@5", "t2i_r10": "t2i R@10", "i2t_r1": "i2t R@1", "i2t_r5": "i2t R@5", "i2t_r10": "i2t R@10",
          "rsum": "rsum"}


def _expand(path: str | None) -> str | None:
    """``{shared_data}`` in a path is the real-data folder (as the composer command's paths)."""
    return path.replace("{shared_data}", str(shared_data_dir())) if isinstance(path, str) else path


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 2 (user_errors_exit), not argparse's usage block
        raise SplitEvalError(f"{message}; see {PROG} --help")


def build_parser() -> argparse.ArgumentParser:
    p = _ArgumentParser(prog=PROG, allow_abbrev=False,
                                description="Test a trained COMPOSER checkpoint on the MCD split and every graded split "
                                            "of `python -m grounding.composer mcd`; table + Fig. 4.")
    p.add_argument("--config", required=True,
                   help="the COMPOSER model config the checkpoint was trained with (experiments/composer/composer_*.yaml)")
    p.add_argument("--ckpt", required=True, help="the trained checkpoint (outputs/<run>/checkpoints/last.ckpt)")
    p.add_argument("--splits", required=True, help="the --out folder of `mcd` (mcd.json, graded/, summary.json)")
    p.add_argument("--out", default=None, help="output folder (default <splits>/eval)")
    p.add_argument("--rerank-top-k", type=int, default=None,
                   help="compose each caption with its top-K first-stage images only (default: the config's)")
    p.add_argument("--limit", type=int, default=None, help="test the first N images of each split only")
    p.add_argument("--record", metavar="NAME", default=None,
                   help="also write the table as a record, docs/records/NAME.json (or this path ending in .json)")
    return p


def write_splits_record(path: str | Path, report: dict, config: str) -> Path:
    """The table of :func:`grounding.leaderboard.splits.evaluate_splits`'s ``report`` (splits.json's content) as a
    record at ``path``: a row per split (the table's columns, ``mcd`` and the split's ``seconds``), ``config``."""
    rows = [{**{c: r.get(c) for c in COLUMNS}, "mcd": bool(r.get("mcd")), "seconds": r.get("seconds")}
            for r in report["splits"]]
    extra = {k: report.get(k) for k in ("checkpoint", "splits_dir", "rerank_top_k", "limit", "k", "random_splits")}
    return write_record(path, list(COLUMNS), rows, provenance(config=config),
                        title="COMPOSER on the MCD split and its graded splits (Fig. 4)", labels=dict(LABELS), **extra,
                        seconds=report.get("seconds"))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    record = record_option(args.record)
    for option, value, what in (("--rerank-top-k", args.rerank_top_k, "first-stage images per caption"),
                                ("--limit", args.limit, "images per split")):
        if value is not None and value < 1:
            raise SplitEvalError(f"{option} {value}: expected {what}, a whole number >= 1; give {option} 1 or more")
    splits = _expand(args.splits)
    out = _expand(args.out) or str(Path(splits) / "eval")
    in_the_way = next((f for f in (Path(out), *Path(out).parents) if f.exists() and not f.is_dir()), None)
    if in_the_way is not None:
        raise SplitEvalError(f"--out {out}: {in_the_way} is a file, not a folder; choose another --out or move the file")
    report = evaluate_splits(_expand(args.config), _expand(args.ckpt), splits, out, rerank_top_k=args.rerank_top_k,
                             limit=args.limit)
    if record is not None:
        print(f"wrote the record {write_splits_record(record, report, _expand(args.config))}")
    return 0


if __name__ == "__main__":
    with user_errors_exit(PROG):
        sys.exit(main(sys.argv[1:]))

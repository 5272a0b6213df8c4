"""``python -m grounding.leaderboard.evaluate_splits --config <model yaml> --ckpt <ckpt> --splits <mcd out dir>
[--out DIR] [--rerank-top-k K] [--limit N]``: one trained COMPOSER checkpoint tested on the MCD split and every graded
split of ``python -m grounding.composer mcd`` (Fig. 4; :func:`grounding.leaderboard.splits.evaluate_splits`).
``python -m grounding.composer evaluate-splits`` (its old name) starts this command. Bad input: one line, exit 2."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from grounding.errors import user_errors_exit
from grounding.leaderboard.splits import SplitEvalError, evaluate_splits
from grounding.paths import shared_data_dir

PROG = "python -m grounding.leaderboard.evaluate_splits"


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
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for option, value, what in (("--rerank-top-k", args.rerank_top_k, "first-stage images per caption"),
                                ("--limit", args.limit, "images per split")):
        if value is not None and value < 1:
            raise SplitEvalError(f"{option} {value}: expected {what}, a whole number >= 1; give {option} 1 or more")
    splits = _expand(args.splits)
    out = _expand(args.out) or str(Path(splits) / "eval")
    in_the_way = next((f for f in (Path(out), *Path(out).parents) if f.exists() and not f.is_dir()), None)
    if in_the_way is not None:
        raise SplitEvalError(f"--out {out}: {in_the_way} is a file, not a folder; choose another --out or move the file")
    evaluate_splits(_expand(args.config), _expand(args.ckpt), splits, out, rerank_top_k=args.rerank_top_k,
                    limit=args.limit)
    return 0


if __name__ == "__main__":
    with user_errors_exit(PROG):
        sys.exit(main(sys.argv[1:]))

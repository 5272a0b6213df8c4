"""``python -m grounding.leaderboard --config experiments/leaderboard/world.yaml [--out DIR] [--ckpt NAME=PATH ...]``

Tests every model of the leaderboard YAML on its test set and writes leaderboard.md / .csv / .json / .png to
``--out`` (default: the YAML's ``out``), printing the Markdown table; with ``--only``, the given models' rows
replace theirs in the table already there (each row tested by this run carries the ``commit`` it was tested at).
``--record NAME`` also writes the table as ``docs/records/NAME.json`` (a path: there), the record the docs render
their table from (:mod:`grounding.docs_tables`; with ``--rewrite``, with the provenance leaderboard.json holds).
``--graded``: every model also on the graded splits of compound
divergence beside the compositional split (graded.csv / .json / .png: Fig. 4 with every model). Exit status 2 on a
bad YAML, test set or argument, 1 when a model tested by this run failed (its row says why), 0 otherwise (skipped
rows included).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grounding.docs_tables import PROVENANCE, DocsTableError, record_path
from grounding.errors import user_errors_exit
from grounding.leaderboard.board import (
    LeaderboardError,
    check_output_folder,
    evaluate,
    load_leaderboard,
    markdown_table,
    merge_rows,
    table_rows,
    write_outputs,
)
from grounding.utils.provenance import source_commit


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m grounding.leaderboard", description=__doc__.split("\n\n")[1])
    p.add_argument("--config", default="experiments/leaderboard/world.yaml", help="a leaderboard YAML")
    p.add_argument("--out", help="output folder (default: the YAML's out)")
    p.add_argument("--ckpt", action="append", default=[], metavar="NAME=PATH",
                   help="test this checkpoint for the model NAME (repeatable)")
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="evaluate only these models (repeatable)")
    p.add_argument("--graded", action="store_true",
                   help="also test every model on the graded splits beside the test set's compositional_split "
                        "(Fig. 4 with every model: graded.csv, .json, .png)")
    p.add_argument("--graded-splits", type=int, metavar="K",
                   help="with --graded: a reranker (a test run per split) tests only K of the graded splits, evenly "
                        "spaced in divergence (default: all; the other rows always get all)")
    p.add_argument("--rewrite", action="store_true",
                   help="test nothing: rewrite the tables, plots and graded files from the leaderboard.json already in "
                        "the output folder (after a change to how they are written)")
    p.add_argument("--record", metavar="NAME",
                   help="also write the table with its provenance to docs/records/NAME.json (or this path ending in .json)")
    args = p.parse_args(argv)
    try:
        record = record_path(args.record) if args.record else None
        board = load_leaderboard(args.config)
        check_output_folder(args.out or board.out, f"--out (or the `out` of {args.config})")
        if args.rewrite:
            if args.only or args.ckpt or args.graded or args.graded_splits is not None:
                raise LeaderboardError("--rewrite tests nothing: give it without --only, --ckpt, --graded and --graded-splits")
            out = Path(args.out or board.out)
            if not (out / "leaderboard.json").is_file():
                raise LeaderboardError(f"--rewrite: no {out / 'leaderboard.json'}; run the leaderboard first (it writes it)")
            rows = merge_rows([], out, board)
            write_outputs(rows, board, out, record, recorded_provenance(out / "leaderboard.json", board.source))
            print(f"rewrote {out}/leaderboard.md, .csv, .json, .png and the graded files from its leaderboard.json",
                  file=sys.stderr)
            return 0
        names = {m.name: m for m in board.models}
        for item in args.ckpt:
            name, sep, path = item.partition("=")
            if not sep or name not in names:
                raise LeaderboardError(f"--ckpt {item}: expected NAME=PATH with NAME one of {sorted(names)}")
            if names[name].ensemble:
                raise LeaderboardError(f"--ckpt {item}: {name} is an ensemble of {names[name].ensemble}; give its "
                                       "members' checkpoints instead")
            if names[name].semclip is not None:
                raise LeaderboardError(f"--ckpt {item}: {name} is SemCLIP (a VLM, Γ_t and an STE, no checkpoint); edit "
                                       "its semclip block in the YAML instead")
            names[name].ckpt = path
            names[name].runs = []  # its training time: the given checkpoint's run folder
        unknown = [n for n in args.only if n not in names]
        if unknown:
            raise LeaderboardError(f"--only {unknown[0]}: not a model of {args.config}; one of {sorted(names)}")
        rows = evaluate(board, args.only or None, log=lambda line: print(line, file=sys.stderr, flush=True),
                        graded=args.graded or args.graded_splits is not None, graded_splits_kept=args.graded_splits)
    except (LeaderboardError, DocsTableError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    failed = any(str(r.get("status", "")).startswith("error") for r in rows)  # this run's rows
    commit = source_commit()
    rows = [{**r, "commit": commit} for r in rows]  # an --only run's rows beside earlier rows keep their own commit
    if args.only:  # a partial run updates its rows of the table already there
        rows = merge_rows(rows, args.out or board.out, board)
    out = write_outputs(rows, board, args.out, record)
    print(markdown_table(table_rows(rows, board), board.test_set), end="")
    print(f"wrote {out}/leaderboard.md, .csv, .json and .png" + (f"; the record {record}" if record else ""), file=sys.stderr)
    return 1 if failed else 0


def recorded_provenance(path: Path, source: str) -> dict:
    """The provenance a leaderboard.json holds (what --rewrite keeps: the table was measured then, not now); null
    for each key an older leaderboard.json lacks, its config the YAML."""
    try:
        written = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        written = {}
    keys = {k: written.get(k) if isinstance(written, dict) else None for k in PROVENANCE}
    return {**keys, "config": keys["config"] or source or None}


if __name__ == "__main__":
    with user_errors_exit("python -m grounding.leaderboard"):
        sys.exit(main())

"""``python -m grounding.explore --config experiments/leaderboard/world.yaml [--port 7860] [--check QUERY [--record NAME]]``

Serves the retrieval explorer on 127.0.0.1 over a leaderboard YAML's test set and every model row whose files
exist (the others are listed in the page with the command that makes them). ``--check QUERY`` answers one query
in the terminal (each model's top-k, its time) and exits, without a web server; with ``--record NAME`` it also
writes those times as a record of :mod:`grounding.docs_tables`, ``docs/records/NAME.json`` (a path ending in
``.json``: there): a row per model (its kind, the query's time in ms, the note, the error of a model that failed),
the gallery, the query and the start-up seconds (the gallery and models loaded) beside them; its config the
``--config`` YAML, its seeds null. The time is the process's first query (a first SemCLIP query also loads spaCy and
WordNet). Exit status 2, one line, on a bad YAML, a missing photo folder, a bad option or a bad ``--record``.
"""

from __future__ import annotations

import argparse
import sys
import time

from grounding.docs_tables import DocsTableError, provenance, record_option, write_record
from grounding.errors import user_errors_exit
from grounding.explore.app import CSS, Explorer, QueryError, SearchResult, build_app, check_query
from grounding.explore.models import GALLERY_SPLITS, ExplorerError, Gallery, first_stage_of, load_models
from grounding.leaderboard.board import LeaderboardError, load_leaderboard


def load_explorer(config: str, first_stage: str | None = None, rerank_top_k: int = 20, top_k: int = 5,
                  log=lambda line: print(line, file=sys.stderr, flush=True), gallery: str = "test") -> Explorer:
    board = load_leaderboard(config)
    gallery = Gallery.from_test_set(board.test_set, gallery)
    log(f"gallery {gallery.name}: {len(gallery.image_paths)} photos, {len(gallery.flat_captions)} captions")
    report = load_models(board.models, gallery, log=log)
    return Explorer(gallery, report, first_stage_of(report.models, first_stage), rerank_top_k, top_k)


RECORD_LABELS = {"model": "model", "kind": "kind", "ms": "query (ms)", "note": "note", "error": "error"}


def check_record_rows(explorer: Explorer, result: SearchResult) -> list[dict]:
    """``--check``'s answer as a record's rows: a row per model (its kind, the query's time in ms unrounded, the note;
    a model that failed: no time, its error), in the order the models loaded."""
    rows = []
    for name, model in explorer.models.items():
        ranked = result.ranked.get(name)
        rows.append({"model": name, "kind": model.kind, "ms": None if ranked is None else 1000 * ranked.seconds,
                     "note": (ranked.note or None) if ranked is not None else None, "error": result.errors.get(name),
                     "top": None if ranked is None else [explorer.gallery.image_paths[r].name for r in ranked.rows]})
    return rows


def write_check_record(path, explorer: Explorer, result: SearchResult, config: str, start_up_seconds: float):
    """``--check``'s times as a record at ``path`` (:func:`check_record_rows`), with the gallery and the query."""
    rows = check_record_rows(explorer, result)
    columns = ["model", "kind", "ms", "note"] + (["error"] if result.errors else [])
    gallery = explorer.gallery
    return write_record(path, columns, rows, provenance(config=config), title="The retrieval explorer: one query's time",
                        labels={c: RECORD_LABELS[c] for c in columns}, query=result.query, top_k=result.k,
                        gallery=gallery.name, photos=len(gallery.image_paths), captions=len(gallery.flat_captions),
                        first_stage=result.first_stage, rerank_top_k=explorer.rerank_top_k,
                        start_up_seconds=round(start_up_seconds, 2),
                        missing=[name for name, _, _ in explorer.report.missing],
                        failed=[name for name, _ in explorer.report.failed])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m grounding.explore",
                                description=__doc__.split("\n\n")[1])
    p.add_argument("--config", default="experiments/leaderboard/world.yaml",
                   help="a leaderboard YAML: its test set is the gallery, its rows the models")
    p.add_argument("--host", default="127.0.0.1", help="interface to serve on (default: this machine only)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--share", action="store_true", help="also ask Gradio for a public share link (off by default)")
    p.add_argument("--first-stage", help="the model whose top-K the cross-encoders rerank (default: the first dual "
                                         "encoder loaded)")
    p.add_argument("--rerank-top-k", type=int, default=20)
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--gallery", choices=GALLERY_SPLITS, default="test",
                   help="the photos searched: the test split (default) or all splits of the test set's data")
    p.add_argument("--check", metavar="QUERY", help="answer one query in the terminal and exit")
    p.add_argument("--record", metavar="NAME", help="with --check: also write each model's time as docs/records/NAME.json "
                                                    "(or this path ending in .json)")
    args = p.parse_args(argv)
    try:
        record = record_option(args.record)
    except DocsTableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if record is not None and args.check is None:
        print(f"error: --record {args.record}: records --check's answer; give --check QUERY too", file=sys.stderr)
        return 2
    for option, value, ok, expected in (("--rerank-top-k", args.rerank_top_k, args.rerank_top_k >= 1, ">= 1"),
                                        ("--top-k", args.top_k, 1 <= args.top_k <= 10, "in 1..10"),
                                        ("--port", args.port, 0 < args.port < 65536, "in 1..65535")):
        if not ok:
            print(f"error: {option} {value}: expected a whole number {expected}", file=sys.stderr)
            return 2
    if args.check is not None:
        try:  # before any model loads: a query without words is refused at once
            check_query(args.check)
        except QueryError as e:
            print(f"error: --check: {e}", file=sys.stderr)
            return 2
    start = time.perf_counter()
    try:
        explorer = load_explorer(args.config, args.first_stage, args.rerank_top_k, args.top_k, gallery=args.gallery)
    except (LeaderboardError, ExplorerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    start_up_seconds = time.perf_counter() - start
    if not explorer.models:
        print(f"error: no model of {args.config} has its files; make them first ("
              + "; ".join(f"{n}: `{c}`" for n, c, _ in explorer.report.missing) + ")", file=sys.stderr)
        return 2
    if args.check is not None:
        try:
            result = explorer.search(args.check)
        except QueryError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for name, ranked in result.ranked.items():
            hits = ", ".join(f"{explorer.gallery.image_paths[r].name} {s:.3f}{' ✓' if r in result.truth else ''}"
                             for r, s in zip(ranked.rows, ranked.scores))
            print(f"{name} ({1000 * ranked.seconds:.0f} ms{'; ' + ranked.note if ranked.note else ''}): {hits}")
        for name, error in result.errors.items():
            print(f"{name}: error: {error}")
        if record is not None:
            written = write_check_record(record, explorer, result, args.config, start_up_seconds)
            print(f"wrote the record {written}", file=sys.stderr)
        return 1 if result.errors else 0
    try:
        import gradio  # noqa: F401 - here: the optional extra, checked before the page is built
    except ImportError:
        print("error: the explorer needs Gradio: `make explore` installs it (pip install -e '.[explore]')", file=sys.stderr)
        return 2
    app = build_app(explorer)
    print(f"serving on http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    app.queue().launch(server_name=args.host, server_port=args.port, share=args.share,
                       allowed_paths=[str(f) for f in explorer.gallery.folders], show_error=False,
                       css=CSS)
    return 0


if __name__ == "__main__":
    with user_errors_exit("python -m grounding.explore"):
        sys.exit(main())

"""The benchmarks' ``--record``: the table a benchmark prints, also written as a record (``grounding/docs_tables.py``:
provenance, ``title``, ``labels``, then ``columns`` and ``rows``). Imported by the scripts of this folder as a sibling
module (each runs as ``python benchmarks/<script>.py``, which puts this folder first on ``sys.path``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from grounding.docs_tables import DocsTableError, provenance, record_path, write_record

HELP = "also write the table as a record: docs/records/NAME.json, or this path ending in .json"


def _record_target(text: str) -> Path:
    try:
        return record_path(text)
    except DocsTableError as e:  # a bad name stops the command before it measures anything
        raise argparse.ArgumentTypeError(str(e)) from None


def add_record_option(parser: argparse.ArgumentParser, help: str = HELP) -> None:
    """``--record NAME_OR_PATH`` (``args.record``: the record's path, or None when not given)."""
    parser.add_argument("--record", type=_record_target, metavar="NAME_OR_PATH", default=None, help=help)


def write_table_record(path: Path | None, title: str, table: list[tuple[str, str]], rows: list[dict],
                       config: str | list[str] | None = None, seeds: list[int] | None = None, **extra) -> Path | None:
    """Write ``rows`` as the record at ``path`` (nothing when ``path`` is None): ``table`` is the shown columns in order,
    each ``(column, the header printed for it)``; ``extra`` keys go in the record as they are."""
    if path is None:
        return None
    written = write_record(path, [c for c, _ in table], rows, provenance(config=config, seeds=seeds), title=title,
                           labels=dict(table), **extra)
    print(f"record: {written}")
    return written

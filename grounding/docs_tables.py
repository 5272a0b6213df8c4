"""Results as data: the records in ``docs/records/`` and the Markdown tables the docs render from them.

A number in the docs comes from a record a command wrote; a table in README.md or ``docs/**/*.md`` is rendered from
its record by ``python -m grounding.docs_tables`` (``make docs-tables``), never typed.

**A record** is ``docs/records/<name>.json``, one JSON object. Every published record has these keys (a value that
cannot be established is ``null``, never guessed):

- ``command``: the command that measured the numbers (``make leaderboard-flickr8k-full``, ``python -m ...``);
- ``config``: the config file(s) it read (a path, a list of paths, or null);
- ``commit``: the checkout's commit when the record was written (``abc1234``, ``-dirty`` with uncommitted changes);
  a row measured at another commit carries its own ``commit`` (or ``commits``) key;
- ``date``: the day the record was written, ``YYYY-MM-DD``;
- ``machine``: ``{"cpu": name, "cores": count, "gpu": name or null}`` (optional ``description``), or null;
- ``seeds``: the seeds of the runs behind the rows (a list of integers), or null (a row's own ``seeds`` key counts
  its runs);
- ``columns``: the columns a table shows by default, in order (``X_ci`` prints ``[X_low, X_high]``);
- ``rows``: the table, one mapping a row (column -> value; a row may hold more keys than ``columns``, which a marker's
  ``columns=`` can show). Numbers are JSON numbers; an interval is ``[low, high]`` or two keys ``X_low`` / ``X_high``;
  null is unknown or not applicable.

Optional: ``title``; ``labels`` (column -> the header printed for it); ``links`` (the columns whose values are
repository paths, ``docs/results/x.md#anchor``: printed as links from the page, ``[x](...)``); ``provenance_note`` (how the
provenance was established); ``transcribed_from`` (a record typed from the docs rather than written by its command:
which file, at which commit); anything else the writing command keeps (``source``, ``test_set``, ...). Commands
write records with :func:`write_record` and :func:`provenance` (``python -m grounding.leaderboard --record NAME``),
checking ``--record NAME`` with :func:`record_option` before any work.

**A marker pair** in README.md or ``docs/**/*.md`` (each marker on its own line; markers inside ``` fences are
examples, not markers)::

    <!-- table: leaderboard_flickr8k_full columns=model,t2i_r1,rsum,rsum_ci digits=1 -->
    (the rendered table: whatever is here is replaced)
    <!-- /table -->

The first word names the record (``docs/records/<name>.json``); the attributes, all optional, ``key=value`` with
shell quoting (``where="model=VSE|VG-BERT stage 1"``), applied in this order:

- ``rows=1-3,5``: the record's rows by number (from 1), in that order;
- ``where=COLUMN=VALUE|VALUE``: only the rows whose ``COLUMN`` is one of the values (compared as text: a string as
  it is, a number as Python prints it, ``null``, ``true`` / ``false``);
- ``columns=a,b,c``: these columns, in this order (default: the record's ``columns``); ``X_ci`` where the rows have
  no ``X_ci`` prints ``[X_low, X_high]``;
- ``digits=N``: every non-integer number to N decimals (default: the number as recorded).

A cell: null is ``–``, a list ``[a, b]``, ``|`` in text is escaped. ``python -m grounding.docs_tables`` rewrites every
table between its markers (atomically; a second run changes nothing); ``--check`` changes nothing and exits 1 when a
table differs from what its record renders, or when a record is published by no marker, listing each; a marker that
cannot be rendered (a missing record, an unknown column or attribute) is one line naming the file and line, exit 2.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import json
import math
import os
import platform
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from grounding.errors import UserInputError, user_errors_exit
from grounding.utils.io import atomic_write_text
from grounding.utils.provenance import source_commit

ROOT = Path(__file__).resolve().parents[1]
RECORDS = Path("docs") / "records"
PROVENANCE = ("command", "config", "commit", "date", "machine", "seeds")
REQUIRED = (*PROVENANCE, "columns", "rows")
ATTRIBUTES = ("rows", "where", "columns", "digits")
START = re.compile(r"^\s*<!--\s*table:\s*(?P<spec>.*?)\s*-->\s*$")
END = re.compile(r"^\s*<!--\s*/table\s*-->\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class DocsTableError(UserInputError, ValueError):
    """A marker that cannot be rendered or a record that does not follow the schema (one line each, exit 2)."""


# ------------------------------------------------------------------------------------------ writing records
def machine() -> dict:
    """This machine: CPU name, core count and the GPU's name (None when no GPU is visible). The GPU is asked of torch
    only when the calling command already imported it (a command that never loaded torch ran nothing on a GPU)."""
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = None
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                gpu = torch.cuda.get_device_name(0)
        except Exception:  # noqa: BLE001 - a broken CUDA setup leaves the GPU unknown, not the record unwritten
            gpu = None
    return {"cpu": cpu or platform.processor() or platform.machine() or None, "cores": os.cpu_count(), "gpu": gpu}


def invoked_command() -> str:
    """The command line this process was started with (``python -m grounding.leaderboard --config ...``)."""
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    return shlex.join(["python", *argv[1:]])


def provenance(command: str | None = None, config: str | list[str] | None = None, seeds: list[int] | None = None,
               commit: str | None = None, date: str | None = None, machine_info: dict | None = None) -> dict:
    """The schema's provenance keys for a record written now: ``command`` (default: this process's command line),
    ``config``, ``commit`` (default: :func:`grounding.utils.provenance.source_commit`), ``date`` (default: today),
    ``machine`` (default: :func:`machine`) and ``seeds``."""
    return {"command": command or invoked_command(), "config": config, "commit": commit or source_commit(),
            "date": date or datetime.date.today().isoformat(), "machine": machine_info or machine(),
            "seeds": None if seeds is None else [int(s) for s in seeds]}


def record_path(name: str | Path) -> Path:
    """``NAME`` -> ``docs/records/NAME.json`` (relative to the working folder, as the Makefile's paths); a path (with
    a folder or ending in ``.json``) as given."""
    text = str(name)
    if "/" in text or os.sep in text or text.endswith(".json"):
        return Path(text)
    if not NAME.match(text):
        raise DocsTableError(f"record name {text!r}: use letters, digits, '_', '-', '.' (it becomes docs/records/{text}.json)")
    return RECORDS / f"{text}.json"


def record_option(name: str | Path | None, option: str = "--record") -> Path | None:
    """``--record NAME``'s path (:func:`record_path`; None without a name), checked before a command does any work: a
    bad name, a folder or a file in the way of its folder is a :class:`DocsTableError` (one line, exit 2)."""
    if name is None or name == "":
        return None
    text = str(name)
    try:
        path = record_path(text)
    except DocsTableError as e:
        raise DocsTableError(f"{option}: {e}") from None
    if text.endswith(("/", os.sep)) or path.is_dir():
        raise DocsTableError(f"{option} {text} is a folder, not a record; name a record or a file ending in .json")
    in_the_way = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if in_the_way is not None:
        raise DocsTableError(f"{option} {text}: {in_the_way} is a file, not a folder; choose another path")
    return path


def _finite(value):
    """JSON without NaN or infinity (null instead), through lists and mappings."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_record(path: str | Path, columns: list[str], rows: list[dict], provenance_keys: dict, **extra) -> Path:
    """Write a record (the schema above) atomically: ``provenance_keys`` (from :func:`provenance`), then ``extra``
    (``title``, ``labels``, ``source``, ...), then ``columns`` and ``rows``. Checked against the schema first."""
    record = {**{k: provenance_keys.get(k) for k in PROVENANCE}, **extra, "columns": list(columns),
              "rows": [dict(r) for r in rows]}
    record = _finite(record)
    validate_record(record, str(path))
    return atomic_write_text(path, json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def validate_record(record, where: str) -> None:
    """A :class:`DocsTableError` naming ``where`` when ``record`` does not follow the schema."""
    if not isinstance(record, dict):
        raise DocsTableError(f"{where}: a record is a JSON object, not {type(record).__name__}")
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise DocsTableError(f"{where}: no {', '.join(missing)} (every record has {', '.join(REQUIRED)}; null where "
                             "unknown; see grounding/docs_tables.py)")
    columns, rows = record["columns"], record["rows"]
    if not isinstance(columns, list) or not columns or not all(isinstance(c, str) and c for c in columns):
        raise DocsTableError(f"{where}: columns must be a non-empty list of column names")
    if len(set(columns)) != len(columns):
        raise DocsTableError(f"{where}: columns name {sorted({c for c in columns if columns.count(c) > 1})} twice")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise DocsTableError(f"{where}: rows must be a list of mappings (column -> value)")
    checks = (("commit", lambda v: isinstance(v, str) and v, "a commit (string)"),
              ("date", lambda v: isinstance(v, str) and DATE.match(v), "a date YYYY-MM-DD"),
              ("command", lambda v: isinstance(v, str) and v, "a command (string)"),
              ("config", lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(c, str) for c in v)),
               "a path or a list of paths"),
              ("seeds", lambda v: isinstance(v, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in v),
               "a list of integers"),
              ("machine", lambda v: isinstance(v, dict) and {"cpu", "cores", "gpu"} <= set(v), "{cpu, cores, gpu}"))
    for key, ok, what in checks:
        if record[key] is not None and not ok(record[key]):
            raise DocsTableError(f"{where}: {key} must be {what} or null, not {record[key]!r}")
    if not isinstance(record.get("labels", {}), dict):
        raise DocsTableError(f"{where}: labels must map a column to its header")
    if not isinstance(record.get("links", []), list):
        raise DocsTableError(f"{where}: links must list the columns whose values are repository paths")


def load_record(path: Path, where: str) -> dict:
    """The record at ``path`` (checked against the schema); ``where`` (file:line of the marker) starts each error."""
    if not path.is_file():
        names = sorted(p.stem for p in path.parent.glob("*.json")) if path.parent.is_dir() else []
        raise DocsTableError(f"{where}: no record {path} (records there: {', '.join(names) or 'none'}); write it with "
                             "its command or fix the marker's name")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise DocsTableError(f"{where}: {path} is not JSON ({e})") from None
    validate_record(record, f"{where}: {path}")
    return record


# ------------------------------------------------------------------------------------------ rendering
@dataclass
class Marker:
    """One ``<!-- table: NAME ... -->`` ... ``<!-- /table -->`` pair: its file, the lines of both markers (0-based
    indices into the file's lines) and its attributes."""

    path: Path
    start: int
    end: int
    name: str
    rows: list[int] | None = None
    where: tuple[str, list[str]] | None = None
    columns: list[str] | None = None
    digits: int | None = None
    place: str = field(default="", repr=False)


def _row_numbers(value: str, where: str) -> list[int]:
    numbers = []
    for part in value.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            numbers += list(range(int(low), int(high) + 1)) if dash else [int(low)]
        except ValueError:
            raise DocsTableError(f"{where}: rows={value}: expected row numbers from 1, e.g. rows=1-3,5") from None
    if not numbers or min(numbers) < 1:
        raise DocsTableError(f"{where}: rows={value}: expected row numbers from 1, e.g. rows=1-3,5")
    return numbers


def parse_marker(spec: str, where: str) -> dict:
    """The name and attributes of a start marker's text (what follows ``table:``)."""
    try:
        words = shlex.split(spec)
    except ValueError as e:
        raise DocsTableError(f"{where}: <!-- table: {spec} -->: {e}") from None
    if not words or "=" in words[0] or not NAME.match(words[0]):
        raise DocsTableError(f"{where}: <!-- table: {spec} -->: expected a record name first (<!-- table: NAME ... -->)")
    out: dict = {"name": words[0]}
    for word in words[1:]:
        key, eq, value = word.partition("=")
        if not eq or key not in ATTRIBUTES:
            raise DocsTableError(f"{where}: {word!r}: expected one of {', '.join(a + '=' for a in ATTRIBUTES)}")
        if key in out:
            raise DocsTableError(f"{where}: {key}= given twice")
        if key == "rows":
            out["rows"] = _row_numbers(value, where)
        elif key == "columns":
            out["columns"] = [c.strip() for c in value.split(",") if c.strip()]
        elif key == "digits":
            if not value.isdigit():
                raise DocsTableError(f"{where}: digits={value}: expected a count of decimals, e.g. digits=1")
            out["digits"] = int(value)
        else:
            column, eq2, values = value.partition("=")
            if not eq2 or not column:
                raise DocsTableError(f"{where}: where={value}: expected where=COLUMN=VALUE (values joined by |)")
            out["where"] = (column, values.split("|"))
    return out


def find_markers(text: str, path: Path, shown: str | None = None) -> list[Marker]:
    """The marker pairs of a Markdown text (``shown``: the file's name in errors), outside ``` fences."""
    shown = shown or str(path)
    markers, open_at, fenced = [], None, False
    for i, line in enumerate(text.splitlines()):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        start, end = START.match(line), END.match(line)
        if start:
            if open_at is not None:
                raise DocsTableError(f"{shown}:{i + 1}: a table marker inside the one opened at line {open_at[0] + 1} "
                                     "(close it with <!-- /table --> first)")
            open_at = (i, start["spec"])
        elif end:
            if open_at is None:
                raise DocsTableError(f"{shown}:{i + 1}: <!-- /table --> without a <!-- table: NAME --> above it")
            place = f"{shown}:{open_at[0] + 1}"
            markers.append(Marker(path, open_at[0], i, place=place, **parse_marker(open_at[1], place)))
            open_at = None
    if open_at is not None:
        raise DocsTableError(f"{shown}:{open_at[0] + 1}: <!-- table: {open_at[1]} --> is never closed (add <!-- /table -->)")
    return markers


def format_cell(value, digits: int | None = None) -> str:
    """A value as a Markdown cell: null ``–``, a float to ``digits`` decimals (default: as recorded), a list
    ``[a, b]``, text with ``|`` escaped and line breaks as spaces."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "–"
        return f"{value:.{digits}f}" if digits is not None else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_cell(v, digits) for v in value) + "]"
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False).replace("|", "\\|")
    return " ".join(str(value).split()).replace("|", "\\|")


def _as_text(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _cell(row: dict, column: str):
    if column not in row and column.endswith("_ci"):
        base = column[:-3]
        if row.get(f"{base}_low") is None or row.get(f"{base}_high") is None:
            return None
        return [row[f"{base}_low"], row[f"{base}_high"]]
    return row.get(column)


def select_rows(record: dict, rows: list[int] | None, where: tuple[str, list[str]] | None, place: str) -> list[dict]:
    """The record's rows chosen by ``rows=`` (numbers from 1), then ``where=``."""
    chosen = record["rows"]
    if rows is not None:
        beyond = [n for n in rows if n > len(chosen)]
        if beyond:
            raise DocsTableError(f"{place}: rows= names row {beyond[0]}; the record has {len(chosen)} rows")
        chosen = [chosen[n - 1] for n in rows]
    if where is not None:
        column, values = where
        if not any(column in r for r in record["rows"]) and column not in record["columns"]:
            raise DocsTableError(f"{place}: where={column}=...: no column {column!r} in the record")
        chosen = [r for r in chosen if _as_text(r.get(column)) in values]
    return chosen


def _link(value, page: Path | None, root: Path | None) -> str:
    """A repository path (``docs/results/x.md#anchor``) as a Markdown link from the page's folder, the file's name
    without its suffix as the text."""
    if not isinstance(value, str) or not value or page is None or root is None:
        return format_cell(value)
    target, hash_, anchor = value.partition("#")
    relative = Path(os.path.relpath(root / target, page)).as_posix()
    return f"[{format_cell(Path(target).stem)}]({relative}{hash_}{anchor})"


def render_table(record: dict, columns: list[str] | None = None, rows: list[int] | None = None,
                 where: tuple[str, list[str]] | None = None, digits: int | None = None, place: str = "table",
                 page: Path | None = None, root: Path | None = None) -> str:
    """The Markdown table of a record (``columns``, ``rows``, ``where``, ``digits``: the marker's attributes); the
    record's ``links`` columns (repository paths) become links relative to ``page``, the folder of the page it goes
    in (``root``: the repository)."""
    columns = columns or record["columns"]
    known = set(record["columns"]) | {k for r in record["rows"] for k in r}
    unknown = [c for c in columns if c not in known and not (c.endswith("_ci") and {c[:-3] + "_low", c[:-3] + "_high"} <= known)]
    if unknown:
        raise DocsTableError(f"{place}: no column {unknown[0]!r} in the record (its columns: {', '.join(record['columns'])})")
    labels = record.get("labels") or {}
    head = [labels.get(c) or (f"{c[:-3]} [low, high]" if c.endswith("_ci") and c not in known else c) for c in columns]
    lines = ["| " + " | ".join(format_cell(h) for h in head) + " |", "|" + "---|" * len(columns)]
    links = set(record.get("links") or [])
    for row in select_rows(record, rows, where, place):
        cells = [_link(row.get(c), page, root) if c in links else format_cell(_cell(row, c), digits) for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def marker_table(marker: Marker, records: Path) -> str:
    """The table a marker renders from its record in ``records``."""
    record = load_record(records / f"{marker.name}.json", marker.place)
    return render_table(record, marker.columns, marker.rows, marker.where, marker.digits, marker.place,
                        page=marker.path.parent, root=records.parent.parent)


def replace_tables(text: str, tables: list[tuple[Marker, str]]) -> str:
    """``text`` with each marker pair's content replaced by its table (markers found in this text)."""
    lines = text.splitlines(keepends=True)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    for marker, table in sorted(tables, key=lambda t: t[0].start, reverse=True):
        lines[marker.start + 1:marker.end] = [line + newline for line in table.splitlines()]
    return "".join(lines)


def render_text(text: str, path: Path, records: Path, shown: str | None = None) -> str:
    """``text`` (the file ``path``) with every table rendered from ``records``; the first error raised."""
    return replace_tables(text, [(m, marker_table(m, records)) for m in find_markers(text, path, shown)])


# ------------------------------------------------------------------------------------------ the docs
def docs_files(root: Path) -> list[Path]:
    """README.md and every ``docs/**/*.md`` under ``root``."""
    files = [root / "README.md"] if (root / "README.md").is_file() else []
    if (root / "docs").is_dir():
        files += sorted(p for p in (root / "docs").rglob("*.md") if p.is_file())
    return files


@dataclass
class Scan:
    """Every docs file's text and its text with the tables rendered, each marker with its table, and the errors met
    (each one line)."""

    texts: dict[Path, tuple[str, str]] = field(default_factory=dict)
    tables: list[tuple[Marker, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def published(self) -> set[str]:
        return {m.name for m, _ in self.tables}


def scan(root: Path) -> Scan:
    """Read every docs file under ``root`` and render its tables from ``root/docs/records`` (nothing is written);
    every marker's error is collected, not only the first."""
    out = Scan()
    records = root / RECORDS
    for path in docs_files(root):
        shown = str(path.relative_to(root))
        text = path.read_text(encoding="utf-8")
        try:
            markers = find_markers(text, path, shown)
        except DocsTableError as e:
            out.errors.append(str(e))
            continue
        tables = []
        for m in markers:
            try:
                tables.append((m, marker_table(m, records)))
            except DocsTableError as e:
                out.errors.append(str(e))
        out.tables += tables
        if len(tables) == len(markers):
            out.texts[path] = (text, replace_tables(text, tables))
    return out


def unpublished(root: Path, found: Scan | None = None) -> list[str]:
    """The records in ``root/docs/records`` that no marker in the docs renders."""
    found = found or scan(root)
    names = sorted(p.stem for p in (root / RECORDS).glob("*.json")) if (root / RECORDS).is_dir() else []
    return [n for n in names if n not in found.published()]


def differences(found: Scan) -> list[str]:
    """One line per table whose text in its file differs from what its record renders (with its first change)."""
    out = []
    for marker, table in found.tables:
        old = found.texts[marker.path][0].splitlines()[marker.start + 1:marker.end] if marker.path in found.texts else []
        new = table.splitlines()
        if old == new:
            continue
        changed = [d for d in difflib.unified_diff(old, new, lineterm="", n=0) if d[:1] in "+-" and d[:3] not in ("---", "+++")]
        out.append(f"{marker.place}: table {marker.name} differs from {RECORDS / (marker.name + '.json')} "
                   f"({len(changed)} changed lines; first: {changed[0][:140] if changed else 'line breaks'})")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grounding.docs_tables", allow_abbrev=False,
                                description="Render the docs' tables from docs/records/*.json between their markers.")
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 listing every table that differs from its record, and every record no "
                        "marker publishes")
    p.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this checkout)")
    args = p.parse_args(argv)
    root = args.root.resolve()
    found = scan(root)
    if found.errors:
        for line in found.errors:
            print(f"error: {line}", file=sys.stderr)
        return 2
    loose = unpublished(root, found)
    if args.check:
        stale = differences(found)
        problems = stale + [f"{RECORDS / (n + '.json')}: published by no marker (add <!-- table: {n} --> ... "
                            "<!-- /table --> to README.md or a docs page)" for n in loose]
        for line in problems:
            print(line)
        if problems:
            print(f"{len(stale)} table(s) differ from their records (`python -m grounding.docs_tables` renders them), "
                  f"{len(loose)} record(s) published by no marker", file=sys.stderr)
        return 1 if problems else 0
    changed = [path for path, (old, new) in found.texts.items() if old != new]
    for path in changed:
        atomic_write_text(path, found.texts[path][1])
    print(f"{len(found.tables)} table(s) in {len({m.path for m, _ in found.tables})} file(s); rewrote "
          f"{', '.join(str(p.relative_to(root)) for p in changed) or 'none'}", file=sys.stderr)
    for n in loose:
        print(f"note: {RECORDS / (n + '.json')} is published by no marker", file=sys.stderr)
    return 0


if __name__ == "__main__":
    with user_errors_exit("python -m grounding.docs_tables"):
        sys.exit(main())

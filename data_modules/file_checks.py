"""The suite's data errors and the file checks that raise them: every message names the file, what was
expected and how to fix it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from grounding.errors import UserInputError

from . import formats

WORLD_HINT = "run `python -m data_modules.synthetic --out data/world` for a small generated copy in every layout"


class DataError(UserInputError):
    """Base class of the suite's data errors (message-only, so DataLoader workers re-raise them intact)."""


class MissingDataError(DataError, FileNotFoundError):
    """A root folder, annotation file or image is not where the layout says it should be."""


class MalformedDataError(DataError, ValueError):
    """An annotation file exists but does not parse or lacks the expected keys."""


class CorruptImageError(DataError, OSError):
    """An image file exists but cannot be decoded."""


def resolve(root: Path, name: str | os.PathLike) -> Path:
    """``name`` relative to ``root`` unless it is absolute (or starts with ~)."""
    p = Path(os.path.expanduser(str(name)))
    return p if p.is_absolute() else root / p


def require_root(root: str | os.PathLike, dataset: str, layout: str, hint: str) -> Path:
    root = Path(os.path.expanduser(str(root)))
    if not root.is_dir():
        raise MissingDataError(
            f"{dataset} root {root} does not exist (or is not a folder).\nExpected layout:\n{layout}\n"
            f"Fix: {hint}."
        )
    return root


def require_file(path: Path, dataset: str, layout: str, hint: str) -> Path:
    if not path.is_file():
        raise MissingDataError(
            f"{dataset}: required file {path} is missing.\nExpected layout:\n{layout}\nFix: {hint}."
        )
    return path


def read_json(path: Path, dataset: str, schema: str, hint: str) -> Any:
    """Parse a JSON file once; a syntax error names the file, line, column and the expected schema."""
    return formats.load_json(path, MalformedDataError, hint, dataset, schema)


_WS = re.compile(r"[ \t\n\r]*")


def iter_json_array(path: Path, dataset: str, schema: str, hint: str, chunk_chars: int = 1 << 22) -> Iterator[Any]:
    """Yield the elements of a file holding one top-level JSON array, one at a time.

    Memory is one element plus a chunk, not the whole parsed file (Visual Genome's
    relationships.json is ~700 MB of JSON, several GB as Python objects). Elements are decoded by
    the C scanner of ``json``; errors name the file, line and column like :func:`read_json`.
    """
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf, pos, eof = "", 0, False
        lines_before, col_before = 0, 0  # position of buf[0] in the file

        def refill():
            nonlocal buf, pos, eof, lines_before, col_before
            done = buf[:pos]
            n = done.count("\n")
            lines_before += n
            col_before = len(done) - done.rfind("\n") - 1 if n else col_before + len(done)
            chunk = f.read(chunk_chars)
            eof = len(chunk) < chunk_chars
            buf, pos = buf[pos:] + chunk, 0

        def where(p: int) -> str:
            n = buf.count("\n", 0, p)
            col = p - buf.rfind("\n", 0, p) if n else col_before + p + 1
            return f"line {lines_before + n + 1}, column {col}"

        def error(problem: str, p: int) -> MalformedDataError:
            return MalformedDataError(
                f"{dataset}: {path} is not valid JSON ({problem} at {where(p)}).\nExpected: {schema}\n"
                f"Fix: {hint} (the file may be truncated: download it again).")

        def peek() -> str:
            nonlocal pos
            while True:
                pos = _WS.match(buf, pos).end()
                if pos < len(buf):
                    return buf[pos]
                if eof:
                    return ""
                refill()

        try:
            refill()
            first = peek()
            if first != "[":
                kind = {"{": "an object", "": "nothing"}.get(first, f"{first!r}")
                raise MalformedDataError(f"{dataset}: {path} holds {kind} where a JSON list of per-image entries "
                                         f"was expected.\nExpected: {schema}\nFix: {hint}.")
            pos += 1
            if peek() == "]":
                return
            while True:
                while True:
                    try:
                        value, end = decoder.raw_decode(buf, pos)
                        if end < len(buf) or eof:
                            break
                    except json.JSONDecodeError as e:
                        if eof:
                            raise error(e.msg, e.pos) from None
                    refill()  # the element runs past the chunk: read on and decode it again
                pos = end
                yield value
                c = peek()
                if c == ",":
                    pos += 1
                    peek()  # raw_decode does not skip whitespace
                elif c == "]":
                    pos += 1
                    if peek() != "":
                        raise error("Extra data", pos)
                    return
                else:
                    raise error("Expecting ',' delimiter" if c else "Unterminated list", pos)
        except UnicodeDecodeError as e:
            raise MalformedDataError(f"{dataset}: {path} is not UTF-8 JSON ({e}).\nExpected: {schema}\nFix: {hint}.") from e


def malformed(path: Path, dataset: str, problem: str, schema: str, hint: str) -> MalformedDataError:
    return formats.format_error(MalformedDataError, dataset, path, problem, schema, hint)


def expect_keys(obj: Any, keys: Sequence[str], where: str, path: Path, dataset: str, schema: str, hint: str) -> None:
    """``obj`` must be a dict holding every key in ``keys``; ``where`` says which element it is."""
    formats.expect_keys(obj, keys, where, path, MalformedDataError, dataset, schema, hint)


def check_images_exist(paths: Iterable[Path], dataset: str, hint: str) -> None:
    """Every listed image must be on disk: one directory listing per folder, not a stat per file."""
    listings: dict[Path, set[str]] = {}
    missing: list[Path] = []
    for p in paths:
        folder = p.parent
        if folder not in listings:
            listings[folder] = set(os.listdir(folder)) if folder.is_dir() else set()
        if p.name not in listings[folder]:
            missing.append(p)
    if missing:
        shown = "\n  ".join(str(p) for p in missing[:5])
        more = f"\n  ... and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise MissingDataError(
            f"{dataset}: {len(missing)} image(s) listed in the annotations are missing on disk:\n  {shown}{more}\n"
            f"Fix: {hint}."
        )


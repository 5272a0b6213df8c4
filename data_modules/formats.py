"""Readers of caption file formats that need no torch (COMPOSER's parsing reads them too).

* Flickr token files (Flickr8k ``Flickr8k.token.txt``, Flickr30K ``results_20130124.token``):
  ``<image file>#<caption number><TAB><caption>`` lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

FLICKR_TOKEN_FORMAT = ("'<image file>#<caption number><TAB><caption>', e.g. "
                       "'1000268201_693b08cb0e.jpg#0\\tA child in a pink dress ...'")


def read_flickr_token_pairs(path: str | Path, error: Callable[[str], Exception] = ValueError, hint: str = "",
                            dataset: str = "Flickr") -> list[tuple[str, str]]:
    """(image file, caption) pairs in file order; a malformed line raises ``error`` naming the file
    and line, the expected format and ``hint`` (how to fix it)."""
    path = Path(path)
    pairs = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n\r")
            if not line.strip():
                continue
            key, sep, caption = line.partition("\t")
            name, hash_, idx = key.rpartition("#")
            if not sep or not hash_ or not name.strip() or not idx.strip().isdigit():
                raise error(f"{dataset}: {path}:{lineno} is malformed: {line[:120]!r}.\n"
                            f"Expected: {FLICKR_TOKEN_FORMAT}." + (f"\nFix: {hint}." if hint else ""))
            pairs.append((name.strip(), caption.strip()))
    return pairs

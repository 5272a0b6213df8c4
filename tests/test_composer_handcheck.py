"""The hand-checked CRG decompositions of 100 Flickr8k captions (docs/composer_crg_accuracy.md).

tests/data/composer_crg_handcheck.tsv holds, per caption, the predicates the spaCy backend gives and a
verdict against what a Penn-style (benepar) parse + App. A would give. A converter or model change that
alters any of them fails here: re-check the changed captions by hand, then update the file and the page.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from grounding.composer import backend_available, extract_crg, get_parser

TSV = Path(__file__).parent / "data" / "composer_crg_handcheck.tsv"
FLICKR8K_CAPTIONS = 40_460
SAMPLE_SEED = 0
ACCURACY_AFTER, ACCURACY_BEFORE = 73, 62  # captions judged ok, of 100 (docs/composer_crg_accuracy.md)


def _rows() -> list[dict]:
    with TSV.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def predicates_line(crg) -> str:
    """The ``predicates`` column: ``template <- arg | arg ; ...`` in extraction order."""
    return " ; ".join(f"{p.template} <- {' | '.join(p.args)}" for p in crg.predicates)


def test_handcheck_file_is_complete_and_matches_the_reported_accuracy():
    rows = _rows()
    assert len(rows) == 100
    assert [int(r["line"]) for r in rows] == sorted(
        np.random.default_rng(SAMPLE_SEED).choice(FLICKR8K_CAPTIONS, size=100, replace=False).tolist())
    assert {r["verdict"] for r in rows} | {r["verdict_before"] for r in rows} <= {"ok", "wrong"}
    assert all(r["note"] for r in rows if r["verdict"] == "wrong")
    assert all(r["note"] or r["note_before"] for r in rows if r["verdict_before"] == "wrong")
    assert sum(r["verdict"] == "ok" for r in rows) == ACCURACY_AFTER
    assert sum(r["verdict_before"] == "ok" for r in rows) == ACCURACY_BEFORE


@pytest.mark.shared_data
def test_handcheck_captions_are_the_sampled_flickr8k_lines(shared_data):
    lines = (shared_data / "flickr8k" / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) == FLICKR8K_CAPTIONS
    for r in _rows():
        key, caption = lines[int(r["line"])].split("\t", 1)
        assert (key, caption.strip()) == (r["image"], r["caption"])


def test_spacy_backend_still_gives_the_hand_checked_decompositions():
    ok, why = backend_available("spacy")
    if not ok:
        pytest.skip(f"spaCy backend not installed: {why}")
    rows = _rows()
    trees = get_parser("spacy").parse([r["caption"] for r in rows])
    changed = [r["line"] for r, t in zip(rows, trees) if predicates_line(extract_crg(t)) != r["predicates"]]
    assert not changed, (f"decompositions changed for Flickr8k lines {changed}: re-check them by hand and update "
                         f"{TSV.name} and docs/composer_crg_accuracy.md")

"""WordNet 3.0 for NLTK, installed offline."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from grounding.lexicon import WordNetUnavailable, lexnames_from_manpage, wordnet


def test_wordnet_is_version_3_with_the_full_noun_hierarchy():
    wn = wordnet()
    assert wn.get_version() == "3.0"
    assert wn.synset("dog.n.01").lexname() == "noun.animal"  # needs the generated lexnames file
    assert "automobile" in wn.synset("car.n.01").lemma_names()
    assert wn.synset("dog.n.01").wup_similarity(wn.synset("cat.n.01")) == pytest.approx(0.857142857)


def test_lexnames_rebuilt_from_the_man_page():
    page = Path("/usr/share/man/man5/lexnames.5WN.gz")
    if page.is_file():
        text = gzip.decompress(page.read_bytes()).decode("latin-1")
    else:  # the table rows as the man page prints them
        names = ["adj.all", "adj.pert", "adv.all"] + [f"noun.x{i}" for i in range(26)] + [f"verb.y{i}" for i in range(15)] + ["adj.ppl"]
        text = "\n".join(f"{i:02d}\t{n}\tdescription" for i, n in enumerate(names))
    rows = lexnames_from_manpage(text).splitlines()
    assert len(rows) == 45
    assert rows[0].split("\t") == ["00", "adj.all", "3"]
    assert rows[3].split("\t")[2] == "1" and rows[-1].split("\t")[2] == "3"


def test_truncated_man_page_is_rejected():
    with pytest.raises(WordNetUnavailable, match="45"):
        lexnames_from_manpage("00\tadj.all\tall adjective clusters\n")

"""Parser backends (each skipped with its install instructions when not installed here)."""

from __future__ import annotations

import pytest
from nltk import Tree

from grounding.composer import backend_available, extract_crg, get_parser, parse_captions
from grounding.composer.parsing import _lg_word, tree_to_string


def _require(backend: str):
    ok, why = backend_available(backend)
    if not ok:
        pytest.skip(f"parser backend {backend!r} is not installed: {why}")
    return get_parser(backend)


def _is_penn(tree: Tree) -> bool:
    """Every leaf sits under a POS preterminal and phrases contain only trees."""
    for sub in tree.subtrees():
        if len(sub) == 1 and isinstance(sub[0], str):
            continue
        if any(isinstance(c, str) for c in sub):
            return False
    return True


def test_spacy_backend_gives_the_app_a_decomposition():
    parser = _require("spacy")
    (tree,) = parser.parse(["Two dogs are running on the grass ."])
    assert _is_penn(tree) and tree.leaves() == ["Two", "dogs", "are", "running", "on", "the", "grass", "."]
    assert dict(tree.pos())["dogs"] == "NNS"
    crg = extract_crg(tree)
    assert crg.predicates[0].template == "[NP] are running on [NP]"
    assert crg.predicates[0].args == ("two dogs", "the grass")


def test_spacy_backend_relative_clause_and_coordination():
    parser = _require("spacy")
    t1, t2 = parser.parse(["A man who is wearing a red hat sits on the bench .", "A man and a woman sit on a bench ."])
    assert ("[NP] [SBAR]", ("a man", "who is wearing a red hat")) in {(p.template, p.args) for p in extract_crg(t1).predicates}
    assert ("[NP] and [NP]", ("a man", "a woman")) in {(p.template, p.args) for p in extract_crg(t2).predicates}


def test_spacy_backend_follows_penn_for_relatives_lists_and_compounds():
    parser = _require("spacy")
    rel, lst, cpd = parser.parse(["A dog that is running on the grass .", "A dog , a cat and a bird .",
                                  "Two dogs are peeing at a red fire hydrant ."])
    assert "(SBAR (WHNP (WDT that)) (S (VP" in tree_to_string(rel)
    got = {(p.template, p.args) for p in extract_crg(rel).predicates}
    assert {("[NP] [SBAR]", ("a dog", "that is running on the grass")), ("that [S]", ("is running on the grass",)),
            ("is running on [NP]", ("the grass",))} <= got
    assert extract_crg(lst).predicates[0].template == "[NP] [NP] and [NP]"
    assert extract_crg(lst).predicates[0].args == ("a dog", "a cat", "a bird")
    got = {(p.template, p.args) for p in extract_crg(cpd).predicates}
    assert ("[NP] are peeing at [NP]", ("two dogs", "a red fire hydrant")) in got
    assert ("a red [NN] [NN]", ("fire", "hydrant")) in got


def test_link_grammar_backend_trees_have_pos_preterminals():
    parser = _require("link-grammar")
    tree, = parser.parse(["A man who is wearing a red hat sits on the bench near the lake ."])
    assert _is_penn(tree)
    assert tree.leaves()[:3] == ["a", "man", "who"] or tree.leaves()[:3] == ["A", "man", "who"]
    crg = extract_crg(tree)
    assert crg.root == "a man who is wearing a red hat sits on the bench near the lake"
    assert "bench" in crg.primitives and "the bench" in crg.levels
    assert _lg_word("dogs.n") == "dogs" and _lg_word("asdf[?].v") == "asdf" and _lg_word("[the]") == "the"
    assert _lg_word(".") == "."


def test_benepar_backend_when_installed():
    parser = _require("benepar")
    tree, = parser.parse(["Two dogs are running on the grass ."])
    assert extract_crg(tree).predicates[0].template == "[NP] are running on [NP]"


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown parser backend"):
        get_parser("stanza")


def test_parse_cache_cold_then_warm_and_failures_counted(tmp_path):
    _require("spacy")
    caps = ["A dog runs on the grass .", "   ", "Two children play in the snow ."]
    cold = parse_captions(caps, backend="spacy", cache=tmp_path)
    assert not cold.from_cache and cold.cache_file.is_file() and cold.cache_file.parent == tmp_path
    assert cold.failed == 1 and cold.trees[1] is None  # the empty caption is counted, not fatal
    warm = parse_captions(caps, backend="spacy", cache=tmp_path)
    assert warm.from_cache and warm.cache_file == cold.cache_file
    assert [tree_to_string(t) if t is not None else None for t in warm.trees] == \
           [tree_to_string(t) if t is not None else None for t in cold.trees]
    other = parse_captions(caps[:1], backend="spacy", cache=tmp_path)  # different input -> different key
    assert other.cache_file != cold.cache_file
    assert list(tmp_path.glob(".*tmp*")) == []  # atomic write left no temporaries


def test_parallel_parsing_matches_serial(tmp_path):
    _require("spacy")
    caps = [f"A dog number {i} runs on the grass near {i} trees ." for i in range(12)]
    serial = parse_captions(caps, backend="spacy", workers=1, cache=False)
    parallel = parse_captions(caps, backend="spacy", workers=2, cache=False, chunk_size=4)
    assert [tree_to_string(t) for t in serial.trees] == [tree_to_string(t) for t in parallel.trees]

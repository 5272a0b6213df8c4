"""spaCy dependency parse -> Penn-style constituency tree (parsing.dependency_to_constituency).

Each case is a hand-written dependency parse (the analysis spaCy's en_core_web_sm gives), so only the
spaCy library is needed, not its model. The trees must follow the Penn conventions of the paper's
benepar trees, so that App. A extraction gives the paper's decomposition (§2, App. A, Table 8).
"""

from __future__ import annotations

import pytest
from nltk import Tree

from grounding.composer import dependency_to_constituency, extract_crg
from grounding.composer.parsing import tree_to_string

pytest.importorskip("spacy", reason="spaCy is not installed (the converter reads spaCy Docs)")


def _doc(rows: str):
    """One token a line: ``word TAG UPOS dep head`` (head = 0-based token index, itself for the root)."""
    from spacy.tokens import Doc
    from spacy.vocab import Vocab

    toks = [ln.split() for ln in rows.strip().splitlines()]
    return Doc(Vocab(), words=[t[0] for t in toks], tags=[t[1] for t in toks], pos=[t[2] for t in toks],
               deps=[t[3] for t in toks], heads=[int(t[4]) for t in toks])


def _convert(rows: str) -> tuple[Tree, set]:
    tree = dependency_to_constituency(_doc(rows))
    return tree, {(p.template, p.args) for p in extract_crg(tree).predicates}


DOG_THAT_RUNS = """
a DT DET det 1
dog NN NOUN ROOT 1
that WDT PRON nsubj 4
is VBZ AUX aux 4
running VBG VERB relcl 1
on IN ADP prep 4
the DT DET det 7
grass NN NOUN pobj 5
"""


def test_relative_clause_has_whnp_outside_s():
    tree, preds = _convert(DOG_THAT_RUNS)
    assert tree_to_string(tree) == ("(NP (NP (DT a) (NN dog)) (SBAR (WHNP (WDT that)) (S (VP (VBZ is) (VBG running) "
                                    "(PP (IN on) (NP (DT the) (NN grass)))))))")
    assert preds == {("[NP] [SBAR]", ("a dog", "that is running on the grass")),
                     ("that [S]", ("is running on the grass",)),
                     ("is running on [NP]", ("the grass",)),
                     ("a [NN]", ("dog",)), ("the [NN]", ("grass",))}


def test_object_relative_and_where_clause_front_their_wh_phrase():
    _, preds = _convert("""
the DT DET det 1
ball NN NOUN ROOT 1
that WDT PRON dobj 5
the DT DET det 4
dog NN NOUN nsubj 5
holds VBZ VERB relcl 1
""")
    assert ("that [S]", ("the dog holds",)) in preds and ("[NP] holds", ("the dog",)) in preds
    tree, preds = _convert("""
a DT DET det 1
field NN NOUN ROOT 1
where WRB SCONJ advmod 5
a DT DET det 4
dog NN NOUN nsubj 5
runs VBZ VERB relcl 1
""")
    assert "(SBAR (WHADVP (WRB where)) (S (NP (DT a) (NN dog)) (VP (VBZ runs))))" in tree_to_string(tree)
    assert ("where [S]", ("a dog runs",)) in preds


def test_subordinate_clause_without_subject_keeps_its_s():
    # "while holding ...": (SBAR (IN while) (S (VP ...))), as benepar brackets it
    _, preds = _convert("""
a DT DET det 1
crowd NN NOUN nsubj 3
is VBZ AUX aux 3
looking VBG VERB ROOT 3
at IN ADP prep 3
a DT DET det 6
shrine NN NOUN pobj 4
while IN SCONJ mark 8
holding VBG VERB advcl 3
hats NNS NOUN dobj 8
""")
    assert ("[NP] is looking at [NP] [SBAR]", ("a crowd", "a shrine", "while holding hats")) in preds
    assert ("while [S]", ("holding hats",)) in preds and ("holding [NP]", ("hats",)) in preds


LIST_APPOS = """
a DT DET det 1
dog NN NOUN ROOT 1
, , PUNCT punct 1
a DT DET det 4
cat NN NOUN appos 1
and CC CCONJ cc 4
a DT DET det 7
bird NN NOUN conj 4
"""
LIST_CHAIN = """
a DT DET det 1
man NN NOUN ROOT 1
, , PUNCT punct 1
a DT DET det 4
boy NN NOUN conj 1
, , PUNCT punct 4
and CC CCONJ cc 4
a DT DET det 8
dog NN NOUN conj 4
"""
LIST_FLAT = """
a DT DET det 1
man NN NOUN ROOT 1
, , PUNCT punct 1
a DT DET det 4
boy NN NOUN conj 1
and CC CCONJ cc 1
a DT DET det 7
dog NN NOUN conj 1
"""


@pytest.mark.parametrize("rows, words", [(LIST_APPOS, ("a dog", "a cat", "a bird")), (LIST_CHAIN, ("a man", "a boy", "a dog")),
                                         (LIST_FLAT, ("a man", "a boy", "a dog"))], ids=["appos+conj", "conj-chain", "conj-flat"])
def test_list_of_three_is_one_flat_np(rows, words):
    tree, preds = _convert(rows)
    assert tree.label() == "NP" and [c.label() for c in tree if c.label() == "NP"] == ["NP"] * 3
    assert all(len(c.leaves()) == 2 for c in tree if c.label() == "NP")  # no NP nests two conjuncts
    roots = [p for p in preds if p[1] == words]
    assert len(roots) == 1 and roots[0][0] == "[NP] [NP] and [NP]"  # punctuation is not part of a template
    assert not any(t in ("[NP] [NP]", "[NP] and [NP]") for t, _ in preds)  # no nested binary templates


def test_apposition_to_a_plural_stays_an_apposition():
    # "two dogs, a pitbull and a labrador": the enumeration describes "two dogs"
    _, preds = _convert("""
two CD NUM nummod 1
dogs NNS NOUN ROOT 1
, , PUNCT punct 1
a DT DET det 4
pitbull NN NOUN appos 1
and CC CCONJ cc 4
a DT DET det 7
labrador NN NOUN conj 4
""")
    assert ("[NP] [NP]", ("two dogs", "a pitbull and a labrador")) in preds
    assert ("[NP] and [NP]", ("a pitbull", "a labrador")) in preds


@pytest.mark.parametrize("rows", ["""
a DT DET det 3
red JJ ADJ amod 2
fire NN NOUN compound 3
hydrant NN NOUN ROOT 3
""", """
a DT DET det 2
red JJ ADJ amod 3
fire NN NOUN compound 3
hydrant NN NOUN ROOT 3
""", """
a DT DET det 2
red JJ ADJ amod 2
fire NN NOUN compound 3
hydrant NN NOUN ROOT 3
"""], ids=["adj-on-head", "det-on-compound", "det-and-adj-on-compound"])
def test_noun_compound_stays_one_np(rows):
    tree, preds = _convert(rows)
    assert tree_to_string(tree) == "(NP (DT a) (JJ red) (NN fire) (NN hydrant))"
    assert preds == {("a red [NN] [NN]", ("fire", "hydrant"))}


def test_compound_inside_a_pp_is_spliced_too():
    _, preds = _convert("""
people NNS NOUN ROOT 0
on IN ADP prep 0
a DT DET det 5
rock NN NOUN compound 4
climbing NN NOUN compound 5
wall NN NOUN pobj 1
""")
    assert preds == {("[NP] on [NP]", ("people", "a rock climbing wall")), ("a [NN] [NN] [NN]", ("rock", "climbing", "wall"))}


def test_verbs_sharing_a_subject_coordinate_as_vps():
    tree, preds = _convert("""
a DT DET det 1
dog NN NOUN nsubj 2
jumps VBZ VERB ROOT 2
and CC CCONJ cc 2
catches VBZ VERB conj 2
a DT DET det 6
ball NN NOUN dobj 4
""")
    assert tree_to_string(tree).startswith("(S (NP (DT a) (NN dog)) (VP (VP (VBZ jumps)) (CC and) (VP (VBZ catches)")
    assert ("[NP] jumps and catches [NP]", ("a dog", "a ball")) in preds
    _, preds = _convert("""
a DT DET det 1
man NN NOUN nsubj 2
sits VBZ VERB ROOT 2
and CC CCONJ cc 2
a DT DET det 5
woman NN NOUN nsubj 6
stands VBZ VERB conj 2
""")
    assert ("[S] and [S]", ("a man sits", "a woman stands")) in preds


def test_noun_phrase_hung_on_a_verb_becomes_its_np():
    # spaCy sometimes makes the noun a `compound` of the following participle ("little girl swimming")
    tree, preds = _convert("""
little JJ ADJ amod 1
girl NN NOUN compound 2
swimming VBG VERB ROOT 2
in IN ADP prep 2
a DT DET det 5
pool NN NOUN pobj 3
""")
    assert tree_to_string(tree) == "(NP (NP (JJ little) (NN girl)) (VP (VBG swimming) (PP (IN in) (NP (DT a) (NN pool)))))"
    assert ("[NP] swimming in [NP]", ("little girl", "a pool")) in preds


def test_every_word_is_kept_in_order():
    for rows in (DOG_THAT_RUNS, LIST_APPOS, LIST_CHAIN, LIST_FLAT):
        doc = _doc(rows)
        assert dependency_to_constituency(doc).leaves() == [t.text for t in doc]

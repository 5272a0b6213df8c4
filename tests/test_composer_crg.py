"""CRG extraction (App. A) on hand-built trees: no parser needed."""

from __future__ import annotations

import numpy as np
import pytest
from nltk import Tree

from grounding.composer import ConceptGraph, degrade_tree, extract_crg

APP_A = "(S (NP (CD two) (NNS dogs)) (VP (VBP are) (VP (VBG running) (PP (IN on) (NP (DT the) (NN grass))))) (. .))"


def templates(crg):
    return {(p.template, p.args, p.result) for p in crg.predicates}


def test_app_a_example_decomposes_as_in_the_paper():
    crg = extract_crg(Tree.fromstring(APP_A))
    assert crg.root == "two dogs are running on the grass"
    first = crg.predicates[0]
    assert first.template == "[NP] are running on [NP]"
    assert first.args == ("two dogs", "the grass") and first.arg_types == ("NP", "NP") and first.arity == 2
    assert templates(crg) == {
        ("[NP] are running on [NP]", ("two dogs", "the grass"), "two dogs are running on the grass"),
        ("two [NNS]", ("dogs",), "two dogs"),
        ("the [NN]", ("grass",), "the grass"),
    }
    assert crg.primitives == ["dogs", "grass"]
    assert crg.levels == {"dogs": 0, "grass": 0, "two dogs": 1, "the grass": 1, "two dogs are running on the grass": 2}
    assert crg.height == 2


def test_nested_pp_decomposes_breadth_first_outermost_first():
    # "a child in a pink dress on a set of stairs": NP -> NP PP, PP -> IN NP, NP -> NP PP
    t = Tree.fromstring(
        "(NP (NP (DT a) (NN child)) (PP (IN in) (NP (DT a) (JJ pink) (NN dress)))"
        " (PP (IN on) (NP (NP (DT a) (NN set)) (PP (IN of) (NP (NNS stairs))))))")
    crg = extract_crg(t)
    assert crg.predicates[0].template == "[NP] in [NP] on [NP]"
    assert crg.predicates[0].args == ("a child", "a pink dress", "a set of stairs")
    got = templates(crg)
    assert ("[NP] of [NP]", ("a set", "stairs"), "a set of stairs") in got
    assert ("a pink [NN]", ("dress",), "a pink dress") in got
    # single-word NP "stairs" is a primitive argument typed by its phrase, never decomposed further
    assert crg.levels["stairs"] == 0 and "stairs" in crg.primitives
    assert crg.levels["a set of stairs"] == 2 and crg.height == 3


def test_relative_clause_is_an_sbar_concept_with_its_own_predicate():
    t = Tree.fromstring(
        "(S (NP (NP (DT a) (NN man)) (SBAR (WHNP (WP who)) (S (VP (VBZ is) (VP (VBG wearing) (NP (DT a) (JJ red) (NN hat)))))))"
        " (VP (VBZ sits) (PP (IN on) (NP (DT the) (NN bench)))))")
    crg = extract_crg(t)
    got = templates(crg)
    assert ("[NP] sits on [NP]", ("a man who is wearing a red hat", "the bench"), crg.root) in got
    assert ("[NP] [SBAR]", ("a man", "who is wearing a red hat"), "a man who is wearing a red hat") in got
    # the S under SBAR spans the VP only; VP is not a concept tag, so S "is wearing a red hat" is the argument
    assert ("who [S]", ("is wearing a red hat",), "who is wearing a red hat") in got
    assert ("is wearing [NP]", ("a red hat",), "is wearing a red hat") in got
    assert crg.height == 5


def test_that_relative_clause_gives_the_that_s_level():
    # benepar / Penn: (NP (NP a dog) (SBAR (WHNP that) (S (VP is (VP running (PP on (NP the grass)))))))
    t = Tree.fromstring("(NP (NP (DT a) (NN dog)) (SBAR (WHNP (WDT that)) (S (VP (VBZ is) (VP (VBG running)"
                        " (PP (IN on) (NP (DT the) (NN grass))))))))")
    assert [(p.template, p.args) for p in extract_crg(t).predicates] == [
        ("[NP] [SBAR]", ("a dog", "that is running on the grass")), ("a [NN]", ("dog",)),
        ("that [S]", ("is running on the grass",)), ("is running on [NP]", ("the grass",)), ("the [NN]", ("grass",))]


def test_list_of_three_is_one_predicate_with_three_arguments():
    t = Tree.fromstring("(NP (NP (DT a) (NN dog)) (, ,) (NP (DT a) (NN cat)) (CC and) (NP (DT a) (NN bird)))")
    crg = extract_crg(t)
    assert crg.predicates[0].template == "[NP] [NP] and [NP]"
    assert crg.predicates[0].args == ("a dog", "a cat", "a bird") and crg.height == 2


def test_noun_compound_is_one_np_over_its_nouns():
    t = Tree.fromstring("(S (NP (DT a) (NN dog)) (VP (VBZ sits) (PP (IN by) (NP (DT a) (JJ red) (NN fire) (NN hydrant)))))")
    assert templates(extract_crg(t)) == {
        ("[NP] sits by [NP]", ("a dog", "a red fire hydrant"), "a dog sits by a red fire hydrant"),
        ("a [NN]", ("dog",), "a dog"), ("a red [NN] [NN]", ("fire", "hydrant"), "a red fire hydrant")}


def test_phrases_without_primitives_and_non_concept_tags_stay_in_the_template():
    # ADJP/VP/PP are not concept tags; "each other" (no noun) is not a concept
    t = Tree.fromstring("(NP (NP (DT a) (NN dog)) (VP (VBG playing) (PP (IN with) (NP (DT each) (JJ other)))))")
    crg = extract_crg(t)
    assert crg.predicates[0].template == "[NP] playing with each other"
    assert crg.predicates[0].args == ("a dog",)


def test_unary_chain_root_and_punctuation_and_no_noun():
    # root S -> NP spans the whole caption: searched through, not an argument of itself
    crg = extract_crg(Tree.fromstring("(S (NP (DT a) (JJ big) (NN dog)) (. .))"))
    assert templates(crg) == {("a big [NN]", ("dog",), "a big dog")}
    assert extract_crg(Tree.fromstring("(S (VP (VBG running) (ADVP (RB fast))))")).root is None
    # a lone noun is a primitive with no predicate
    lone = extract_crg(Tree.fromstring("(NP (NNS dogs))"))
    assert lone.root == "dogs" and lone.predicates == [] and lone.height == 0


def test_repeated_template_gives_distinct_applications():
    t = Tree.fromstring("(NP (NP (DT a) (NN man)) (CC and) (NP (DT a) (NN woman)))")
    crg = extract_crg(t)
    assert templates(crg) == {("[NP] and [NP]", ("a man", "a woman"), "a man and a woman"),
                              ("a [NN]", ("man",), "a man"), ("a [NN]", ("woman",), "a woman")}


def test_degradation_keeps_words_and_is_seeded():
    t = Tree.fromstring(APP_A)
    assert degrade_tree(t, 0.0, 0) == t
    flat = degrade_tree(t, 1.0, 0)
    assert flat.leaves() == t.leaves() and flat.pos() == t.pos()
    assert all(isinstance(c, Tree) and len(c) == 1 and isinstance(c[0], str) for c in flat)  # only preterminals left
    a, b = degrade_tree(t, 0.5, 3), degrade_tree(t, 0.5, 3)
    assert a == b
    # fully flattened: the caption is one concept over its two primitives
    crg = extract_crg(flat)
    assert crg.predicates[0].template == "two [NNS] are running on the [NN]"
    with pytest.raises(ValueError):
        degrade_tree(t, 1.5)


def test_degradation_rate_matches_probability():
    t = Tree.fromstring(APP_A)
    n_phr = sum(1 for s in t.subtrees() if s.height() > 2) - 1  # phrase nodes below the root
    rng = np.random.default_rng(0)
    kept = [sum(1 for s in degrade_tree(t, 0.3, rng).subtrees() if s.height() > 2) - 1 for _ in range(2000)]
    assert abs(1 - np.mean(kept) / n_phr - 0.3) < 0.03


def _graph():
    trees = [APP_A,
             "(S (NP (DT a) (NN dog)) (VP (VBZ runs) (PP (IN on) (NP (DT the) (NN grass)))))",
             "(NP (NP (DT a) (NN man)) (CC and) (NP (DT a) (NN woman)))",
             "(S (VP (VBG running)))"]
    crgs = [extract_crg(Tree.fromstring(t)) for t in trees] + [None]
    return ConceptGraph.build(crgs, caption_image=[0, 0, 1, 1, 2], image_names=["a.jpg", "b.jpg", "c.jpg"])


def test_concept_graph_queries_and_round_trip(tmp_path):
    g = _graph()
    s = g.stats()
    assert s["captions"] == 5 and s["parse_failed"] == 1 and s["no_concept"] == 1
    assert s["primitives"] == 5  # dogs grass dog man woman
    assert s["concepts"] == 8 and s["predicates"] == 6
    assert s["avg_height"] == pytest.approx((2 + 2 + 2) / 3)
    assert g.denotation("the grass").tolist() == [0]
    assert g.denotation("a man").tolist() == [1]
    assert sorted(g.concept_text[int(c)] for c in g.children("a man and a woman")) == ["a man", "a woman"]
    assert sorted(g.concept_text[int(c)] for c in g.parents("the grass")) == [
        "a dog runs on the grass", "two dogs are running on the grass"]
    path = g.save(tmp_path / "crg.npz")
    h = ConceptGraph.load(path)
    assert h.stats() == s
    assert h.caption_tree(0) == g.caption_tree(0)
    tree0 = h.caption_tree(0)
    assert [len(level) for level in tree0["levels"]] == [2, 1]
    assert tree0["levels"][1][0]["predicate"] == "[NP] are running on [NP]"


def test_composition_schedule_is_bottom_up_and_complete():
    g = _graph()
    sched = g.composition_schedule([0, 1, 2])
    assert [b.height for b in sched] == [1, 2]
    done = set(np.flatnonzero(g.concept_is_primitive).tolist())
    for b in sched:  # every argument is available before its level runs
        assert set(b.args.tolist()) <= done
        assert len(b.args_indptr) == len(b.application) + 1
        done |= set(b.result.tolist())
    roots = {int(g.caption_root[c]) for c in (0, 1, 2)}
    assert roots <= done
    assert sum(len(b.application) for b in sched) == int(g.caption_app_indptr[3] - g.caption_app_indptr[0])

"""Concept & Relation Graph extraction from one constituency tree (paper §2, App. A).

A caption's Penn-style tree (``nltk.Tree`` with POS preterminals) is decomposed top-down: the
sentence is a concept; a breadth-first search over its constituents finds the largest
sub-constituents that are themselves concepts (or primitive words), replaces each by a typed
placeholder ``[TAG]`` and keeps the remaining words as the predicate's lexical template.
The search is repeated on every sub-concept until only primitives remain.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
from nltk import Tree

# App. A criterion (1): single words with these POS tags are primitives.
PRIMITIVE_TAGS = frozenset({"NN", "NNS", "NNP", "NNPS"})
# App. A criterion (2): phrases with these constituency tags that contain a primitive are concepts.
CONCEPT_TAGS = frozenset({"S", "SBAR", "SBARQ", "SQ", "SINV", "NP", "NX"})
# Punctuation preterminals are dropped before extraction so "a dog ." and "a dog" are one concept.
PUNCT_TAGS = frozenset({".", ",", ":", "``", "''", "-LRB-", "-RRB-", "HYPH", "NFP", "$", "#", "-NONE-", "_SP", "SP"})


def base_label(label: str) -> str:
    """``NP-SBJ=2`` -> ``NP`` (function tags and indices are not part of the type)."""
    if label.startswith("-"):  # -LRB-, -NONE-
        return label
    return label.split("-")[0].split("=")[0]


@dataclass(frozen=True)
class Predicate:
    """One predicate application: ``template`` with ``arity`` typed placeholders -> ``result``."""

    template: str                 # e.g. "[NP] are running on [NP]"
    arg_types: tuple[str, ...]    # e.g. ("NP", "NP")
    args: tuple[str, ...]         # argument concept texts, in template order
    result: str                   # the composed concept's text

    @property
    def arity(self) -> int:
        return len(self.arg_types)


@dataclass
class CaptionCRG:
    """The concepts and predicates of one caption; ``levels`` maps concept text -> height."""

    root: str | None
    primitives: list[str] = field(default_factory=list)
    concepts: list[str] = field(default_factory=list)       # non-primitive concepts, root first
    predicates: list[Predicate] = field(default_factory=list)
    levels: dict[str, int] = field(default_factory=dict)

    @property
    def height(self) -> int:
        return self.levels.get(self.root, 0) if self.root is not None else 0


def _clean(tree: Tree, lowercase: bool) -> Tree | None:
    """Copy without punctuation preterminals and empty phrases; leaves lower-cased."""
    if isinstance(tree, str):
        return tree.lower() if lowercase else tree
    if len(tree) == 1 and isinstance(tree[0], str):  # preterminal
        if tree.label() in PUNCT_TAGS or not tree[0].strip():
            return None
        return Tree(tree.label(), [tree[0].lower() if lowercase else tree[0]])
    kids = [k for k in (_clean(c, lowercase) for c in tree) if k is not None]
    return Tree(tree.label(), kids) if kids else None


def _is_preterminal(t: Tree) -> bool:
    return len(t) == 1 and isinstance(t[0], str)


class _Node:
    """Flattened tree node with its leaf span (computed once per tree)."""

    __slots__ = ("label", "children", "start", "end", "has_primitive")

    def __init__(self, label, children, start, end, has_primitive):
        self.label, self.children, self.start, self.end, self.has_primitive = label, children, start, end, has_primitive


def _index(tree: Tree, words: list[str], tags: list[str]) -> _Node:
    if _is_preterminal(tree):
        i = len(words)
        words.append(tree[0])
        tags.append(tree.label())
        return _Node(tree.label(), [], i, i + 1, tree.label() in PRIMITIVE_TAGS)
    start = len(words)
    kids = [_index(c, words, tags) for c in tree if not isinstance(c, str)]
    return _Node(base_label(tree.label()), kids, start, len(words), any(k.has_primitive for k in kids))


def _is_argument(node: _Node, tags: list[str]) -> bool:
    """App. A: a primitive word, or a >=2-word concept-tagged phrase containing a primitive."""
    if node.end - node.start == 1:
        return tags[node.start] in PRIMITIVE_TAGS
    return node.label in CONCEPT_TAGS and node.has_primitive


def extract_crg(tree: Tree | str, lowercase: bool = True) -> CaptionCRG:
    """Decompose a caption's constituency tree into concepts and predicates (App. A).

    The caption itself is always a concept (y in C, §3) when it contains a primitive, whatever
    its root tag (captions are often NP fragments or FRAG). Arguments of a concept are found by
    breadth-first search; a node spanning the whole concept (unary chain) is searched through.
    """
    if isinstance(tree, str):
        tree = Tree.fromstring(tree)
    tree = _clean(tree, lowercase)
    if tree is None or isinstance(tree, str):
        return CaptionCRG(root=None)
    words: list[str] = []
    tags: list[str] = []
    root = _index(tree, words, tags)
    if not root.has_primitive:
        return CaptionCRG(root=None)

    def text(n: _Node) -> str:
        return " ".join(words[n.start:n.end])

    out = CaptionCRG(root=text(root))
    seen_concepts: set[str] = set()
    primitives: list[str] = []
    # Decompose every concept; children are decomposed after their parent (outer BFS), and
    # levels are filled bottom-up afterwards.
    pending = deque([root])
    children_of: dict[str, list[str]] = {}
    while pending:
        concept = pending.popleft()
        ctext = text(concept)
        if concept.end - concept.start == 1:  # a primitive: nothing to decompose
            if ctext not in out.levels:
                out.levels[ctext] = 0
                primitives.append(ctext)
            continue
        if ctext in seen_concepts:  # same text twice in a caption: decomposed once
            continue
        seen_concepts.add(ctext)
        out.concepts.append(ctext)
        args: list[_Node] = []
        queue = deque(concept.children)
        while queue:  # breadth-first search for the outermost argument constituents
            node = queue.popleft()
            spans_all = node.start == concept.start and node.end == concept.end
            if not spans_all and _is_argument(node, tags):
                args.append(node)
            else:
                queue.extend(node.children)
        args.sort(key=lambda n: n.start)
        pieces, pos = [], concept.start
        for a in args:
            pieces.extend(words[pos:a.start])
            pieces.append(f"[{a.label}]")
            pos = a.end
        pieces.extend(words[pos:concept.end])
        out.predicates.append(Predicate(" ".join(pieces), tuple(a.label for a in args), tuple(text(a) for a in args), ctext))
        children_of[ctext] = [text(a) for a in args]
        pending.extend(args)
    out.primitives = primitives

    def level(c: str) -> int:  # height: primitives 0, a concept 1 + its highest argument
        if c not in out.levels:
            out.levels[c] = 1 + max(level(a) for a in children_of[c])
        return out.levels[c]

    for c in reversed(out.concepts):
        level(c)
    return out


def degrade_tree(tree: Tree | str, prob: float, rng: np.random.Generator | int | None = None) -> Tree:
    """Randomly remove branches of a parse (Table 7): each phrase node below the root is
    dissolved with probability ``prob`` and its children attach to its parent. Words and POS
    preterminals are kept, so the caption text is unchanged while bracketing is lost.
    """
    if isinstance(tree, str):
        tree = Tree.fromstring(tree)
    if not 0.0 <= prob <= 1.0:
        raise ValueError(f"degradation probability must be in [0, 1], got {prob}")
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)

    def walk(t: Tree, is_root: bool) -> list:
        if isinstance(t, str) or _is_preterminal(t):
            return [t.copy() if isinstance(t, Tree) else t]
        kids = [k for c in t for k in walk(c, False)]
        if not is_root and rng.random() < prob:
            return kids
        return [Tree(t.label(), kids)]

    return walk(tree, True)[0]

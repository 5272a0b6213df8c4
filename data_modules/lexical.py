"""Loaders for the lexical resources of the semantic-space evaluation (VG-BERT §4, App. B).

* SemCat (Şenel et al. 2018): a folder of category files ``<name>-<N>.txt``, one word per line,
  N = the number of words. Entries are kept as listed (a word may sit in several categories and,
  rarely, twice in one file): the paper counts 9,197 entries, 6,238 unique words.
* Brysbaert, Warriner & Kuperman (2014) concreteness: tab-separated with a header holding at least
  ``Word``, ``Bigram`` and ``Conc.M`` (1 = abstract ... 5 = concrete).
* CSLB concept property norms v1.1 ``norms.dat``: tab-separated with a header holding
  ``feature type``, ``concept``, ``feature`` and ``pf`` (production frequency).
* Word lists: one word or phrase per line (``#`` comments and blank lines ignored).
* Word-similarity sets: ``w1<TAB>w2<TAB>score`` lines (the shared ``word-similarity/`` folder: MC-30, RG-65, WS-353
  and its two halves, MTurk-287, MEN, RW, SimLex-999), or SimLex-999's original release (a header with POS).

Every path is explicit or defaults to ``grounding.paths.shared_data_dir()``; a missing or
malformed file raises :class:`LexicalDataError` naming the file, what was expected and the fix.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from grounding.errors import UserInputError
from grounding.paths import shared_data_dir

__all__ = [
    "LexicalDataError", "SemCat", "PropertyNorms", "load_semcat", "load_concreteness",
    "load_cslb_norms", "load_word_list", "default_path", "CSLB_FEATURE_TYPES", "read_word_similarity",
    "read_simlex_release", "load_word_similarity_sets",
]

CSLB_FEATURE_TYPES = ("visual perceptual", "other perceptual", "functional", "encyclopaedic", "taxonomic")
_SEMCAT_FILE = re.compile(r"^(?P<name>.+)-(?P<n>\d+)\.txt$")
_DEFAULT_SUBDIRS = {
    "semcat": "semcat",
    "concreteness": "concreteness/Concreteness_ratings_Brysbaert_et_al_BRM.txt",
    "cslb": "cslb/norms.dat",
    "word_similarity": "word-similarity",
}


class LexicalDataError(UserInputError, ValueError):
    """A lexical resource is missing or not in the expected format."""


def default_path(resource: str, data_root: str | Path | None = None) -> Path:
    """Where ``resource`` ("semcat", "concreteness", "cslb") lives under ``data_root``
    (default: ``grounding.paths.shared_data_dir()``)."""
    if resource not in _DEFAULT_SUBDIRS:
        raise KeyError(f"unknown lexical resource {resource!r}; known: {sorted(_DEFAULT_SUBDIRS)}")
    if data_root is None:
        data_root = shared_data_dir()
    return Path(data_root).expanduser() / _DEFAULT_SUBDIRS[resource]


def _missing(path: Path, what: str, how: str) -> LexicalDataError:
    return LexicalDataError(f"{what} not found at {path}. {how}")


# --------------------------------------------------------------------------------------------
# SemCat
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SemCat:
    """SemCat entries in file order: ``words[i]`` belongs to ``categories[category_index[i]]``."""

    categories: list[str]
    words: list[str]
    category_index: np.ndarray  # (n_entries,) int
    root: Path | None = None

    @property
    def vocabulary(self) -> list[str]:
        """Unique words in first-appearance order (the paper's vocabulary set S, 6,238 words)."""
        return list(dict.fromkeys(self.words))

    def category_words(self, category: str) -> list[str]:
        k = self.categories.index(category)
        return [w for w, c in zip(self.words, self.category_index) if c == k]

    def subset(self, categories: list[str] | None = None, max_words_per_category: int | None = None) -> "SemCat":
        """A smaller SemCat (for tests and quick runs): some categories, the first words of each."""
        keep = list(self.categories if categories is None else categories)
        unknown = [c for c in keep if c not in self.categories]
        if unknown:
            raise LexicalDataError(f"SemCat has no categories {unknown}; available: {self.categories}")
        words, index = [], []
        for new_k, name in enumerate(keep):
            ws = self.category_words(name)[: max_words_per_category]
            words += ws
            index += [new_k] * len(ws)
        return SemCat(keep, words, np.asarray(index, dtype=np.int64), self.root)


def load_semcat(root: str | Path | None = None, check_counts: bool = True) -> SemCat:
    """Read every ``<name>-<N>.txt`` under ``root`` (default ``<shared data>/semcat``), sorted by name.

    ``check_counts``: the number of non-empty lines must equal N (the SemCat convention); a
    mismatch means a truncated or edited file.
    """
    root = Path(root).expanduser() if root is not None else default_path("semcat")
    if not root.is_dir():
        raise _missing(root, "SemCat folder", "Point `semcat` (or --data-root) at the folder of SemCat category "
                       "files `<name>-<N>.txt` (github.com/avaapm/SEMCATdataset2018), or set GROUNDING_SHARED_DATA.")
    files = sorted(p for p in root.iterdir() if p.suffix == ".txt" and _SEMCAT_FILE.match(p.name))
    if not files:
        raise LexicalDataError(f"No SemCat category files `<name>-<N>.txt` in {root}: expected files such as "
                               "`animal-268.txt` holding one word per line.")
    categories, words, index = [], [], []
    for k, path in enumerate(files):
        m = _SEMCAT_FILE.match(path.name)
        try:
            lines = [w.strip().lower() for w in path.read_text(encoding="utf-8").splitlines()]
        except UnicodeDecodeError as e:
            raise LexicalDataError(f"SemCat file {path} is not UTF-8 text ({e}); expected one word per line.") from e
        lines = [w for w in lines if w]
        if check_counts and len(lines) != int(m["n"]):
            raise LexicalDataError(
                f"SemCat file {path} holds {len(lines)} words but its name says {m['n']}: the file is truncated or "
                "edited. Restore it from the SemCat release, or load with check_counts=False.")
        categories.append(m["name"])
        words += lines
        index += [k] * len(lines)
    return SemCat(categories, words, np.asarray(index, dtype=np.int64), root)


# --------------------------------------------------------------------------------------------
# Brysbaert concreteness
# --------------------------------------------------------------------------------------------
def load_concreteness(path: str | Path | None = None, include_bigrams: bool = True) -> dict[str, float]:
    """``{lower-cased word or bigram: Conc.M}`` from the Brysbaert et al. (2014) ratings file."""
    path = Path(path).expanduser() if path is not None else default_path("concreteness")
    if not path.is_file():
        raise _missing(path, "Brysbaert concreteness ratings", "Point `concreteness` at "
                       "Concreteness_ratings_Brysbaert_et_al_BRM.txt (tab-separated, columns Word, Bigram, Conc.M, ...), "
                       "the supplementary file of Brysbaert, Warriner & Kuperman (2014).")
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        header = [h.strip() for h in next(reader, [])]
        need = ("Word", "Bigram", "Conc.M")
        if any(h not in header for h in need):
            raise LexicalDataError(f"{path}: expected a tab-separated header with columns {list(need)}, got {header[:10]}. "
                                   "Is this the Brysbaert et al. (2014) concreteness file?")
        iw, ib, ic = (header.index(h) for h in need)
        ratings: dict[str, float] = {}
        for line_no, row in enumerate(reader, start=2):
            if not row or not row[iw].strip():
                continue
            try:
                value, bigram = float(row[ic]), row[ib].strip() not in ("0", "")
            except (ValueError, IndexError) as e:
                raise LexicalDataError(f"{path}, line {line_no}: Conc.M must be a number (row {row[:4]}).") from e
            if bigram and not include_bigrams:
                continue
            ratings.setdefault(row[iw].strip().lower(), value)  # first rating wins on case duplicates
    if not ratings:
        raise LexicalDataError(f"{path} has a header but no ratings.")
    return ratings


# --------------------------------------------------------------------------------------------
# CSLB property norms
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PropertyNorms:
    """Binary concept x feature labels: ``labels[c, f]`` = concept c has feature f."""

    concepts: list[str]          # CSLB concept names (e.g. "bat_(animal)")
    features: list[str]          # normalised feature labels (e.g. "has wheels")
    feature_types: list[str]     # one of CSLB_FEATURE_TYPES per feature
    labels: np.ndarray           # (n_concepts, n_features) bool
    path: Path | None = field(default=None, compare=False)

    def concept_texts(self, keep_sense: bool = False) -> list[str]:
        """Text fed to the language stream: underscores become spaces; the sense tag
        ("bat_(animal)") is dropped unless ``keep_sense`` (then "bat animal")."""
        out = []
        for c in self.concepts:
            base, _, sense = c.partition("_(")
            text = base if not keep_sense or not sense else f"{base} {sense.rstrip(')')}"
            out.append(text.replace("_", " ").strip())
        return out


def load_cslb_norms(path: str | Path | None = None, min_pf: int = 5, min_concepts: int = 5) -> PropertyNorms:
    """Binary features from CSLB ``norms.dat``.

    A concept has a feature when its production frequency ``pf`` >= ``min_pf`` (CSLB's own
    "5pf" convention, which gives the paper's 2,725 features), and a feature is kept when at least
    ``min_concepts`` concepts have it (the paper's 390 features: 156 visual perceptual, 29 other
    perceptual, 94 functional, 65 encyclopaedic, 46 taxonomic). All 638 concepts are rows.
    """
    path = Path(path).expanduser() if path is not None else default_path("cslb")
    if not path.is_file():
        raise _missing(path, "CSLB norms file", "Point `cslb` at norms.dat of the CSLB concept property norms v1.1 "
                       "(tab-separated with header: domain, feature type, concept, feature, pf, ...).")
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        header = [h.strip().lower() for h in next(reader, [])]
        need = ("feature type", "concept", "feature", "pf")
        if any(h not in header for h in need):
            raise LexicalDataError(f"{path}: expected a tab-separated header with columns {list(need)}, got {header}. "
                                   "Is this the CSLB norms.dat file?")
        it, ic, iff, ip = (header.index(h) for h in need)
        rows = []
        for line_no, row in enumerate(reader, start=2):
            if not row or not any(cell.strip() for cell in row):
                continue
            try:
                rows.append((row[ic].strip(), row[iff].strip(), row[it].strip(), int(row[ip])))
            except (ValueError, IndexError) as e:
                raise LexicalDataError(f"{path}, line {line_no}: expected {len(header)} tab-separated fields with an "
                                       f"integer pf, got {row[:5]}.") from e
    if not rows:
        raise LexicalDataError(f"{path} has a header but no concept/feature rows.")
    bad_types = sorted({t for _, _, t, _ in rows} - set(CSLB_FEATURE_TYPES))
    if bad_types:
        raise LexicalDataError(f"{path}: unknown feature types {bad_types}; expected {list(CSLB_FEATURE_TYPES)}.")
    concepts = sorted({c for c, _, _, _ in rows})
    cidx = {c: i for i, c in enumerate(concepts)}
    positives: dict[str, set[int]] = {}
    ftype: dict[str, str] = {}
    for concept, feature, t, pf in rows:
        ftype.setdefault(feature, t)
        if pf >= min_pf:
            positives.setdefault(feature, set()).add(cidx[concept])
    features = sorted(f for f, cs in positives.items() if len(cs) >= min_concepts)
    labels = np.zeros((len(concepts), len(features)), dtype=bool)
    for j, feat in enumerate(features):
        labels[list(positives[feat]), j] = True
    return PropertyNorms(concepts, features, [ftype[f] for f in features], labels, path)


# --------------------------------------------------------------------------------------------
# Word lists
# --------------------------------------------------------------------------------------------
def load_word_list(path: str | Path) -> list[str]:
    """One word or phrase per line; blank lines and ``#`` comments are skipped."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise _missing(path, "word list", "Expected a UTF-8 text file with one word or phrase per line.")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise LexicalDataError(f"word list {path} is not UTF-8 text ({e}).") from e
    words = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    words = [w for w in words if w]
    if not words:
        raise LexicalDataError(f"word list {path} is empty: expected one word or phrase per line.")
    return words


# ------------------------------------------------------------------------------------------ word similarity
SIMLEX_HEADER = ("word1", "word2", "POS", "SimLex999")


def read_word_similarity(path: str | Path) -> list[tuple[str, str, float]]:
    """``w1<TAB>w2<TAB>score`` lines (blank lines and ``#`` comments skipped)."""
    path = Path(path)
    pairs = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t") if "\t" in line else line.split()
        if len(parts) != 3:
            raise ValueError(f"{path}:{n}: expected 'w1<TAB>w2<TAB>score', got {line!r}")
        try:
            pairs.append((parts[0].strip(), parts[1].strip(), float(parts[2])))
        except ValueError as e:
            raise ValueError(f"{path}:{n}: score {parts[2]!r} is not a number (expected 'w1<TAB>w2<TAB>score')") from e
    return pairs


def read_simlex_release(path: str | Path) -> tuple[list[tuple[str, str, float]], list[str]] | None:
    """The original release's layout (a header ``word1 word2 POS SimLex999 ...``): its pairs and POS column;
    None for any other file."""
    lines = [line for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    if not lines or tuple(lines[0].split("\t")[:4]) != SIMLEX_HEADER:
        return None
    pairs, pos = [], []
    for n, line in enumerate(lines[1:], 2):
        parts = line.split("\t")
        try:
            pairs.append((parts[0].strip(), parts[1].strip(), float(parts[3])))
        except (IndexError, ValueError) as e:
            raise ValueError(f"{path}:{n}: expected the SimLex-999 release's columns (word1 word2 POS SimLex999 ...)") from e
        pos.append(parts[2].strip().upper())
    return pairs, pos


def load_word_similarity_sets(folder: str | Path | None = None) -> list[tuple[str, list[tuple[str, str, float]]]]:
    """``(file stem, pairs)`` of every ``*.txt`` set in ``folder`` (default: the shared ``word-similarity/``), sorted
    by name; a missing folder or one without sets is a :class:`LexicalDataError` naming it."""
    folder = Path(folder).expanduser() if folder is not None else default_path("word_similarity")
    files = sorted(folder.glob("*.txt")) if folder.is_dir() else []
    if not files:
        raise _missing(folder, "Word-similarity sets (*.txt, w1<TAB>w2<TAB>score)",
                       "Point `word_similarity` at a folder of them (the shared data's word-similarity/).")
    out = []
    for path in files:
        release = read_simlex_release(path)
        try:
            out.append((path.stem, release[0] if release else read_word_similarity(path)))
        except ValueError as e:
            raise LexicalDataError(f"{e}; fix the file or leave it out of {folder}") from None
    return out

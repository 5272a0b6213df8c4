"""STE evaluation (SemCLIP §5): synonym coverage (Table 1) and word similarity (Table 2).

* Synonym coverage, the full protocol by default: every single-sense WordNet noun (a written form, lower
  case, with exactly one noun synset) that has a synonym (another written form in its synset) is a query:
  74,909 on WordNet 3.0 (the paper reports 71,895, a count no plain variant of this definition reproduces).
  It counts as covered when at least one synonym is among its 10 nearest distinct written forms (cosine, the
  query itself excluded). STE neighbours are lemma items (their written forms are compared, the first 10
  distinct ones kept); a text encoder embeds every written noun form once and its neighbours are written
  forms. Vectorised over chunks of queries (``neighbour_coverage``); ``sample`` draws a seeded subset.
* Word similarity: Spearman correlation (scipy.stats) between cosine similarity and the human
  scores of every ``w1<TAB>w2<TAB>score`` file, on all pairs a model can embed and on the
  WordNet-filtered subset (both words are WordNet nouns). A word maps to all STE items with that
  written form (or its WordNet base form); a pair scores the best cosine over their senses.
  SimLex-999 is also scored on its 666 noun pairs (the paper's EN-SIMLEX, ``<stem>-N``): the release's POS
  column, or its block order in a copy without the column (``simlex_noun_subset``).
* The similarity lists' 64-member cap: what it truncates (``list_cap_statistics``).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats

from data_modules.lexical import read_simlex_release, read_word_similarity
from data_modules.wordnet_lists import SimilarityListConfig, SimilarityLists, config_key, lemma_surface, load_or_build
from grounding.docs_tables import provenance, write_record
from grounding.encoders import load_text_encoder, load_tokenizer
from grounding.errors import MissingInputError, UserInputError
from grounding.lexicon import wordnet
from grounding.paths import cache_dir, shared_data_dir
from grounding.semclip.ste import STEEmbedding
from grounding.summary_tables import finite_float
from grounding.utils.io import atomic_path, sha1_of_json

# ------------------------------------------------------------------------------------------
# Queries
# ------------------------------------------------------------------------------------------


@dataclass
class SynonymQueries:
    words: list[str]              # written form of each query
    synonyms: list[set[str]]      # written forms of its synonyms
    keys: list[str]               # the query's lemma key (its single sense)


def single_sense_noun_queries(wn=None) -> SynonymQueries:
    """Single-sense WordNet nouns with at least one synonym (the Table 1 queries)."""
    if wn is None:
        wn = wordnet()
    senses: dict[str, int] = {}
    synsets = list(wn.all_synsets("n"))
    for s in synsets:
        for form in {lem.name().replace("_", " ").lower() for lem in s.lemmas()}:
            senses[form] = senses.get(form, 0) + 1
    words, syns, keys = [], [], []
    for s in synsets:
        forms = {}
        for lem in s.lemmas():
            forms.setdefault(lem.name().replace("_", " ").lower(), f"{s.name()}.{lem.name()}")
        for form, key in forms.items():
            others = set(forms) - {form}
            if senses[form] == 1 and others:
                words.append(form)
                syns.append(others)
                keys.append(key)
    return SynonymQueries(words, syns, keys)


def noun_forms(wn=None) -> list[str]:
    """Every written noun form in WordNet (lower case, spaces), sorted: a text encoder's vocabulary."""
    if wn is None:
        wn = wordnet()
    return sorted({name.replace("_", " ").lower() for name in wn.all_lemma_names("n")})


# ------------------------------------------------------------------------------------------
# Text encoders as word embedders
# ------------------------------------------------------------------------------------------
class TextEncoderEmbedder:
    """Mean-pooled, L2-normalised text-encoder embeddings of short strings (Sentence-BERT pooling)."""

    def __init__(self, name: str = "minilm", batch_size: int = 512, max_length: int = 16, device: str = "cpu"):
        self.name = name
        self.tokenizer = load_tokenizer(name)
        self.model = load_text_encoder(name).to(device).eval()
        self.batch_size, self.max_length, self.device = batch_size, max_length, device

    @torch.inference_mode()
    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        out = []
        order = np.argsort([len(t) for t in texts], kind="stable")  # similar lengths: less padding
        for start in range(0, len(texts), self.batch_size):
            part = [texts[i] for i in order[start:start + self.batch_size]]
            tok = self.tokenizer(part, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt").to(self.device)
            hidden = self.model(**tok).last_hidden_state
            mask = tok["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            out.append(F.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1), dim=-1).float().cpu())
        enc = torch.cat(out) if out else torch.empty(0, 0)
        result = torch.empty_like(enc)
        result[torch.as_tensor(order)] = enc
        return result


def cached_encode(embedder: TextEncoderEmbedder, texts: Sequence[str], cache: Path | None, chunk: int = 8192) -> torch.Tensor:
    """Encode ``texts`` once, in chunks each cached atomically under ``cache`` (keyed by encoder
    and texts), so an interrupted run resumes where it stopped."""
    if cache is None:
        return embedder.encode(texts)
    folder = cache / f"{embedder.name.replace('/', '_')}-{sha1_of_json(list(texts))[:12]}"
    parts = []
    for start in range(0, len(texts), chunk):
        path = folder / f"{start:08d}.pt"
        if path.is_file():
            parts.append(torch.load(path, map_location="cpu", weights_only=True))
            continue
        parts.append(embedder.encode(texts[start:start + chunk]))
        with atomic_path(path, suffix=".pt") as tmp:
            torch.save(parts[-1], tmp)
    return torch.cat(parts)


# ------------------------------------------------------------------------------------------
# Table 1: synonym coverage
# ------------------------------------------------------------------------------------------
class FormIds:
    """Written forms -> integer ids (one id space for a bank's items, the queries and their synonyms)."""

    def __init__(self):
        self.ids: dict[str, int] = {}

    def __call__(self, form: str) -> int:
        return self.ids.setdefault(form, len(self.ids))

    def get(self, form: str) -> int:
        return self.ids.get(form, -1)


def neighbour_coverage(query_vectors: torch.Tensor, bank: torch.Tensor, bank_form: torch.Tensor,
                       query_row: torch.Tensor, query_form: torch.Tensor, synonym_codes: np.ndarray, n_forms: int,
                       k: int = 10, chunk: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """For every query: whether a synonym is among its ``k`` nearest *distinct written forms* of ``bank`` (cosine;
    rows normalised), and how many of its synonyms are. Vectorised in chunks of ``chunk`` queries (a chunk holds
    ``chunk x len(bank)`` similarities).

    ``bank_form``: the form id of each bank row (several rows may share one: an STE's sense items);
    ``query_row``: the query's own bank row (excluded; -1: none); ``query_form``: its form id (never counted as a
    neighbour); ``synonym_codes``: sorted ``query * n_forms + form`` of every (query, synonym form) pair. The
    ``3k`` best rows are taken and their first occurrences of each form kept; a query left with fewer than ``k``
    distinct forms is redone with twice as many rows, up to the whole bank.
    """
    n = len(query_vectors)
    hits = np.zeros(n, bool)
    found = np.zeros(n, np.int64)
    limit = len(bank)
    for start in range(0, n, chunk):
        sims = query_vectors[start:start + chunk] @ bank.T
        rows = query_row[start:start + chunk]
        valid = rows >= 0
        sims[torch.arange(len(rows))[valid], rows[valid]] = float("-inf")
        todo = torch.arange(len(rows))
        m = min(3 * k, limit)
        while len(todo):
            top = sims[todo].topk(m, dim=-1).indices
            forms = bank_form[top]                                         # (q, m)
            qform = query_form[start + todo]
            repeated = (forms[:, :, None] == forms[:, None, :]).tril(-1).any(-1)
            keep = ~repeated & (forms != qform[:, None])
            if rows.numel():
                keep &= top != rows[todo][:, None]                        # the query's own row (-inf, still in a full top)
            rank = keep.cumsum(1)
            short = rank[:, -1] < k
            keep &= rank <= k
            q = (start + todo).numpy()
            codes = q[:, None] * n_forms + forms.numpy()
            pos = np.searchsorted(synonym_codes, codes).clip(max=max(len(synonym_codes) - 1, 0))
            is_syn = (synonym_codes[pos] == codes) if len(synonym_codes) else np.zeros_like(codes, bool)
            got = is_syn & keep.numpy()
            done = ~short.numpy() | (m >= limit)
            hits[q[done]] = got[done].any(1)
            found[q[done]] = got[done].sum(1)
            todo = todo[~torch.as_tensor(done)]
            m = min(2 * m, limit)
    return hits, found


def _coverage_result(queries: SynonymQueries, known: np.ndarray, hits: np.ndarray, found: np.ndarray) -> dict:
    n = len(queries.words)
    total = sum(len(s) for s in queries.synonyms)
    return {"queries": n, "synonyms_in_top10": int(hits.sum()), "coverage": float(hits.sum() / n) if n else float("nan"),
            "synonym_recall": float(found.sum() / total) if total else float("nan"), "queries_in_vocabulary": int(known.sum())}


def _synonym_codes(queries: SynonymQueries, form_ids: FormIds, n_forms: int) -> np.ndarray:
    codes = [q * n_forms + form_ids.get(s) for q, syns in enumerate(queries.synonyms) for s in syns if form_ids.get(s) >= 0]
    return np.unique(np.asarray(codes, np.int64))


def _bank_coverage(bank: torch.Tensor, bank_forms: Sequence[str], query_rows: Sequence[int], queries: SynonymQueries,
                   k: int, chunk: int) -> dict:
    form_ids = FormIds()
    bank_form = torch.tensor([form_ids(f) for f in bank_forms], dtype=torch.long)
    query_form = torch.tensor([form_ids(w) for w in queries.words], dtype=torch.long)
    n_forms = len(form_ids.ids) + 1
    rows = torch.as_tensor(np.asarray(query_rows, np.int64))
    known = (rows >= 0).numpy()
    hits = np.zeros(len(rows), bool)
    found = np.zeros(len(rows), np.int64)
    if known.any():
        idx = torch.nonzero(torch.as_tensor(known)).flatten()
        sub_codes = _synonym_codes(SynonymQueries([queries.words[i] for i in idx.tolist()],
                                                  [queries.synonyms[i] for i in idx.tolist()], []), form_ids, n_forms)
        h, f = neighbour_coverage(bank[rows[idx]], bank, bank_form, rows[idx], query_form[idx], sub_codes, n_forms,
                                  min(k, len(bank) - 1), chunk)
        hits[idx.numpy()], found[idx.numpy()] = h, f
    return _coverage_result(queries, known, hits, found)


def ste_synonym_coverage(ste: STEEmbedding, queries: SynonymQueries, k: int = 10, chunk: int = 512) -> dict:
    """Table 1 for the STE: neighbours are lemma items, compared by written form (the first ``k`` distinct forms;
    several sense items share a form)."""
    surfaces = [lemma_surface(key) for key in ste.keys]
    rows = [ste.index.get(key, -1) for key in queries.keys]
    return _bank_coverage(ste.normalized, surfaces, rows, queries, k, chunk)


def encoder_synonym_coverage(vectors: torch.Tensor, forms: Sequence[str], queries: SynonymQueries, k: int = 10,
                             chunk: int = 512) -> dict:
    """Table 1 for a text encoder: ``vectors`` (normalised) embed ``forms`` (WordNet's noun forms, one row each)."""
    index = {f: i for i, f in enumerate(forms)}
    rows = [index.get(w, -1) for w in queries.words]
    return _bank_coverage(vectors, forms, rows, queries, k, chunk)


def coverage_from_neighbours(neighbour_forms: Sequence[Sequence[str]], queries: SynonymQueries) -> dict:
    hits = sum(bool(q_syn & set(nb)) for q_syn, nb in zip(queries.synonyms, neighbour_forms))
    found = sum(len(q_syn & set(nb)) for q_syn, nb in zip(queries.synonyms, neighbour_forms))
    total = sum(len(s) for s in queries.synonyms)
    n = len(queries.words)
    return {"queries": n, "synonyms_in_top10": hits, "coverage": hits / n if n else float("nan"),
            "synonym_recall": found / total if total else float("nan")}


# ------------------------------------------------------------------------------------------
# Table 2: word similarity
# ------------------------------------------------------------------------------------------
def wordnet_noun(word: str, wn) -> bool:
    return bool(wn.synsets(word.replace(" ", "_"), pos="n"))


def ste_word_rows(ste: STEEmbedding, word: str, wn=None) -> list[int]:
    """STE rows of every sense item of ``word`` (by written form, else its WordNet noun base form)."""
    idx = ste.surface_index()
    form = word.lower().replace("_", " ")
    rows = idx.get(form)
    if not rows and wn is not None:
        base = wn.morphy(form.replace(" ", "_"), "n")
        rows = idx.get(base.replace("_", " ").lower()) if base else None
    return rows or []


def ste_pair_similarity(ste: STEEmbedding, w1: str, w2: str, wn=None) -> float | None:
    r1, r2 = ste_word_rows(ste, w1, wn), ste_word_rows(ste, w2, wn)
    if not r1 or not r2:
        return None
    return float((ste.normalized[r1] @ ste.normalized[r2].T).max())


def spearman(pred: Sequence[float], gold: Sequence[float]) -> float:
    if len(pred) < 3:
        return float("nan")
    return float(stats.spearmanr(pred, gold).statistic)


def word_similarity_table(datasets: Sequence, scorers: dict[str, Callable[[str, str], float | None]], wn) -> list[dict]:
    """One row per (benchmark, model): pair counts and Spearman on the full and WordNet-filtered sets.
    ``datasets``: files (``w1<TAB>w2<TAB>score``) or ``(name, pairs)``."""
    rows = []
    for item in datasets:
        name, pairs = item if isinstance(item, tuple) else (Path(item).stem, read_word_similarity(item))
        in_wn = [wordnet_noun(a, wn) and wordnet_noun(b, wn) for a, b, _ in pairs]
        for model, score in scorers.items():
            preds = [score(a, b) for a, b, _ in pairs]
            full = [(p, g) for p, (_, _, g) in zip(preds, pairs) if p is not None]
            filt = [(p, g) for p, f, (_, _, g) in zip(preds, in_wn, pairs) if p is not None and f]
            rows.append({"dataset": name, "model": model, "pairs": len(pairs), "wordnet_filtered": sum(in_wn),
                         "covered_full": len(full), "spearman_full": spearman(*zip(*full)) if full else float("nan"),
                         "covered_wordnet": len(filt),
                         "spearman_wordnet": spearman(*zip(*filt)) if filt else float("nan")})
    return rows


# ------------------------------------------------------------------------------------------
# SimLex-999's nouns (the paper's EN-SIMLEX: 666 pairs)
# ------------------------------------------------------------------------------------------
# The release (SimLex-999.txt: word1 word2 POS SimLex999 ...) lists its pairs by part of speech: 111 adjective,
# 666 noun and 222 verb pairs, in that order. A copy without the POS column that keeps the order gets the POS
# back from the position; these pairs (0-based row: words) at the blocks' edges check that the order is the
# release's.
SIMLEX_BLOCKS = (("A", 111), ("N", 666), ("V", 222))
SIMLEX_EDGES = {0: ("old", "new"), 110: ("dirty", "narrow"), 111: ("wife", "husband"), 776: ("bowl", "tail"),
                777: ("go", "come"), 998: ("attend", "arrive")}


def simlex_parts_of_speech(pairs: Sequence[tuple[str, str, float]]) -> list[str] | None:
    """Each pair's POS from the release's block order (adjectives, nouns, verbs), when ``pairs`` are the 999 pairs
    in that order (checked on the pairs at the blocks' edges); None otherwise."""
    if len(pairs) != sum(n for _, n in SIMLEX_BLOCKS):
        return None
    if any((pairs[i][0].lower(), pairs[i][1].lower()) != words for i, words in SIMLEX_EDGES.items()):
        return None
    return [pos for pos, n in SIMLEX_BLOCKS for _ in range(n)]


def noun_only(word: str, wn) -> bool:
    """A WordNet noun with no verb, adjective or adverb sense (the WordNet-only stand-in for a POS column)."""
    w = word.replace(" ", "_")
    return bool(wn.synsets(w, pos="n")) and not any(wn.synsets(w, pos=p) for p in "vasr")


def simlex_noun_subset(path: str | Path, wn=None) -> tuple[list[tuple[str, str, float]], dict]:
    """SimLex-999's noun pairs (the paper's 666-pair EN-SIMLEX) and how they were found: the release's POS column,
    else its block order (:func:`simlex_parts_of_speech`), else (a file in another order) the pairs whose words
    are both WordNet nouns without any other part of speech. The dict says which, with the counts of the
    WordNet-based alternatives for comparison."""
    release = read_simlex_release(path)
    pairs, pos = release if release else (read_word_similarity(path), None)
    method = "the release's POS column" if release else None
    if pos is None:
        pos = simlex_parts_of_speech(pairs)
        method = "the release's block order (111 A, 666 N, 222 V; checked on the pairs at the blocks' edges)" if pos else None
    info: dict = {"pairs": len(pairs)}
    if wn is not None:
        both_nouns = [wordnet_noun(a, wn) and wordnet_noun(b, wn) for a, b, _ in pairs]
        only_nouns = [noun_only(a, wn) and noun_only(b, wn) for a, b, _ in pairs]
        info.update(wordnet_noun_pairs=sum(both_nouns), wordnet_noun_only_pairs=sum(only_nouns))
        if pos is not None:
            info.update(pos_nouns_that_are_wordnet_nouns=sum(b for b, p in zip(both_nouns, pos) if p == "N"),
                        wordnet_noun_only_pairs_among_pos_nouns=sum(o for o, p in zip(only_nouns, pos) if p == "N"))
    if pos is None:
        if wn is None:
            raise ValueError(f"{path}: neither the SimLex-999 release's POS column nor its pair order; "
                             "the noun subset needs WordNet (noun-only pairs)")
        pos = ["N" if o else "?" for o in only_nouns]
        method = "WordNet: both words nouns with no other part of speech (the file has no POS column and not the release's order)"
    nouns = [p for p, tag in zip(pairs, pos) if tag == "N"]
    info.update(method=method, noun_pairs=len(nouns))
    return nouns, info


def is_simlex(path: str | Path) -> bool:
    return "simlex" in Path(path).stem.lower()


class WordSimilarityFileError(UserInputError, ValueError):
    """A word-similarity file with a line that is not ``w1<TAB>w2<TAB>score`` (the message names file and line)."""


def check_word_similarity_files(folder: Path, required: bool = True) -> list[Path]:
    """The ``*.txt`` files of a word-similarity folder, each read once (``w1<TAB>w2<TAB>score`` lines): a missing
    folder, no file, or a malformed line is a :class:`MissingInputError` / :class:`WordSimilarityFileError` naming it (only when
    ``required``: the shared folder may be absent from a user's clone, and the report then leaves its table out)."""
    files = sorted(folder.glob("*.txt")) if folder.is_dir() else []
    if not files:
        if required:
            raise MissingInputError(f"No word-similarity files (*.txt, w1<TAB>w2<TAB>score) in {folder}; give "
                                    "--word-similarity a folder of them")
        return []
    for path in files:
        if read_simlex_release(path) is None:
            try:
                read_word_similarity(path)
            except ValueError as e:
                raise WordSimilarityFileError(f"{e}; fix the file or leave it out of {folder}") from None
    return files


def benchmark_datasets(files: Sequence[Path], wn=None) -> tuple[list[tuple[str, list]], dict]:
    """``(name, pairs)`` of every file, SimLex-999 followed by its noun subset (``<stem>-N``); with the subset's
    derivation (:func:`simlex_noun_subset`) per SimLex file."""
    datasets, notes = [], {}
    for path in files:
        release = read_simlex_release(path)
        datasets.append((path.stem, release[0] if release else read_word_similarity(path)))
        if is_simlex(path):
            nouns, info = simlex_noun_subset(path, wn)
            datasets.append((f"{path.stem}-N", nouns))
            notes[f"{path.stem}-N"] = info
    return datasets, notes


# ------------------------------------------------------------------------------------------
# The similarity lists' size cap (SimilarityListConfig.max_list_size)
# ------------------------------------------------------------------------------------------
_SYNSET_PREFIX = re.compile(r"^(.+?\.[nvasr]\.\d+)\.")


def _synset_of(key: str) -> str:
    """``"a.d..n.01.A.D."`` -> ``"a.d..n.01"`` (a lemma key's synset; lemma names may hold dots)."""
    m = _SYNSET_PREFIX.match(key)
    return m[1] if m else key.rsplit(".", 1)[0]


def list_cap_statistics(uncapped: SimilarityLists, cap: int = 64, wn=None, examples: int = 5) -> dict:
    """What ``max_list_size = cap`` does to the lists built without a cap (``uncapped``), as the traversal applies
    it: a list keeps its synonyms (all of them, even beyond the cap) and then its best-scored neighbours, sorted by
    Wu–Palmer score (descending) and synset name, up to ``cap`` items; the rest is dropped. Counts the truncated
    lists and dropped pairs, whether a cut falls inside a group of equal scores (the name decides) or splits one
    synset's lemmas, the scores kept and dropped and, with ``wn``, the share of hypernym-side and hyponym-side
    neighbours (within the traversal's depth differential) among every, the kept and the dropped pair."""
    sizes = np.diff(uncapped.indptr)
    is_syn = uncapped.scores >= 1.0
    starts = uncapped.indptr[:-1]
    synonyms = np.zeros(len(sizes), np.int64)
    nonempty = sizes > 0
    synonyms[nonempty] = np.add.reduceat(is_syn.astype(np.int64), starts[nonempty])
    keep = np.minimum(sizes, np.maximum(cap, synonyms))
    truncated = sizes > keep
    rows = np.flatnonzero(truncated)
    cut = starts[rows] + keep[rows]                       # the first dropped pair of each truncated list
    kept_mask = np.ones(len(uncapped.indices), bool)
    for a, c in zip(starts[rows] + sizes[rows], cut):
        kept_mask[c:a] = False
    last_kept, first_dropped = uncapped.scores[cut - 1], uncapped.scores[cut]
    vocab = uncapped.vocab
    split = sum(_synset_of(vocab[uncapped.indices[c - 1]]) == _synset_of(vocab[uncapped.indices[c]]) for c in cut)
    dropped_scores = uncapped.scores[~kept_mask]
    kept_scores = uncapped.scores[kept_mask]
    out = {
        "cap": cap, "lists": int(len(sizes)), "pairs_uncapped": int(sizes.sum()), "pairs_capped": int(keep.sum()),
        "lists_truncated": int(truncated.sum()), "lists_truncated_share": float(truncated.mean()) if len(sizes) else 0.0,
        "pairs_dropped": int((sizes - keep).sum()),
        "pairs_dropped_share": float((sizes - keep).sum() / sizes.sum()) if sizes.sum() else 0.0,
        "lists_with_more_synonyms_than_cap": int((synonyms > cap).sum()),
        "largest_list_uncapped": int(sizes.max()) if len(sizes) else 0,
        "truncated_list_size_median": float(np.median(sizes[rows])) if len(rows) else 0.0,
        "cuts_inside_equal_scores": int((last_kept == first_dropped).sum()),
        "cuts_splitting_a_synset": int(split),
        "lowest_kept_score_in_truncated_lists_median": float(np.median(last_kept)) if len(rows) else None,
        "dropped_score_max": float(dropped_scores.max()) if len(dropped_scores) else None,
        "dropped_score_median": float(np.median(dropped_scores)) if len(dropped_scores) else None,
        "synonym_share_uncapped": float(is_syn.mean()) if len(is_syn) else 0.0,
        "synonym_share_capped": float(is_syn[kept_mask].mean()) if kept_mask.any() else 0.0,
        "kept_score_median": float(np.median(kept_scores)) if len(kept_scores) else None,
        "largest_truncated": [{"anchor": vocab[uncapped.anchors[r]], "size": int(sizes[r]), "kept": int(keep[r])}
                              for r in rows[np.argsort(-sizes[rows], kind="stable")][:examples]],
    }
    if wn is not None:
        depth_diff = int((uncapped.metadata.get("config") or {}).get("max_depth_diff", 2))
        owner = np.repeat(np.arange(len(sizes)), sizes)
        up = _hypernym_side(uncapped, owner, ~is_syn, wn, depth_diff)
        for label, mask in (("all", np.ones_like(kept_mask)), ("kept", kept_mask), ("dropped", ~kept_mask)):
            neigh = ~is_syn & mask
            n = int(neigh.sum())
            out[f"hypernym_side_share_{label}"] = float((up & neigh).sum() / n) if n else None
    return out


def _hypernym_side(lists: SimilarityLists, owner: np.ndarray, neighbour: np.ndarray, wn, depth_diff: int) -> np.ndarray:
    """For each pair: whether the member's synset is a hypernym of the anchor's, at most ``depth_diff`` edges up."""
    ups: dict[str, set[str]] = {}

    def hypernyms(name: str) -> set[str]:
        got = ups.get(name)
        if got is None:
            got, frontier = set(), [wn.synset(name)]
            for _ in range(depth_diff):
                frontier = [h for s in frontier for h in s.hypernyms() + s.instance_hypernyms()]
                got.update(h.name() for h in frontier)
            ups[name] = got
        return got

    out = np.zeros(len(lists.indices), bool)
    for i in np.flatnonzero(neighbour):
        anchor = _synset_of(lists.vocab[lists.anchors[owner[i]]])
        out[i] = _synset_of(lists.vocab[lists.indices[i]]) in hypernyms(anchor)
    return out


def uncapped_lists(config: SimilarityListConfig | None = None) -> SimilarityLists:
    """The whole-WordNet lists of ``config`` (default: the STE's traversal) without the size cap, built once
    (about a minute) into the cache folder where SimilarityListsDataModule looks for them."""
    config = dataclasses.replace(config or SimilarityListConfig(), max_list_size=None)
    return load_or_build(cache_dir() / "semclip" / f"similarity_lists-{config_key(config)}.npz", config)


# ------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------
def _csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    if rows:
        w = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)
    return buf.getvalue()


def write_report(ste: str | Path, out: str | Path, encoders: Sequence[str] = ("minilm",), word_similarity: str | Path | None = None,
                 sample: int | None = None, batch_size: int = 512, seed: int = 0, max_queries: int | None = None,
                 cap_statistics: bool = True, wn=None, queries: SynonymQueries | None = None,
                 forms: Sequence[str] | None = None, chunk: int = 512, record: str | Path | None = None) -> Path:
    """Table 1 + Table 2 for the STE (and text encoders) into ``out/`` (README.md + CSVs + meta.json); with
    ``record`` (a path), also both tables as a record there (:func:`write_report_record`).

    Table 1 is the full protocol (every single-sense noun query) unless ``sample`` (``max_queries``, its older
    name) draws that many queries (seeded). ``cap_statistics``: the 64-member list cap's effect on the whole-WordNet
    lists (built uncapped once, cached). ``wn`` / ``queries`` / ``forms``: WordNet, the Table 1 queries and the
    encoders' noun forms (default: from WordNet 3.0)."""

    sample = sample if sample is not None else max_queries
    # the word-similarity files first: a missing or malformed one stops the report before minutes of work
    ws_dir = Path(word_similarity) if word_similarity else shared_data_dir() / "word-similarity"
    files = check_word_similarity_files(ws_dir, required=bool(word_similarity))
    wn = wn if wn is not None else wordnet()
    t0 = time.perf_counter()
    emb = STEEmbedding.load(ste)
    queries = queries if queries is not None else single_sense_noun_queries(wn)
    all_queries = len(queries.words)
    # An STE trained on part of WordNet (e.g. the world config) is scored on the queries it knows.
    in_vocab = [i for i, key in enumerate(queries.keys) if key in emb.index]
    if len(in_vocab) < len(queries.keys):
        print(f"STE vocabulary covers {len(in_vocab)} of {len(queries.keys)} synonym queries; scoring those", flush=True)
        queries = _subset(queries, in_vocab)
    if sample is not None and sample < len(queries.words):
        queries = _subset(queries, np.sort(np.random.default_rng(seed).choice(len(queries.words), sample, replace=False)))
    protocol = (f"a seeded sample of {len(queries.words)} queries (seed {seed})" if sample is not None and
                len(queries.words) < len(in_vocab) else f"all {len(queries.words)} queries")
    protocol_text = (f"the full protocol, all {all_queries:,} WordNet 3.0 queries" if len(queries.words) == all_queries
                     else f"{protocol.replace('queries', f'of the {all_queries:,} WordNet 3.0 queries', 1)}"
                     + ("" if len(in_vocab) == all_queries else f" ({len(in_vocab):,} in the STE's vocabulary)"))
    timings = {}
    coverage = [{"embedding": "STE", **ste_synonym_coverage(emb, queries, chunk=chunk)}]
    timings["ste_coverage_s"] = round(time.perf_counter() - t0, 1)
    print(f"STE synonym coverage: {coverage[0]} ({timings['ste_coverage_s']}s)", flush=True)
    forms = list(forms) if forms is not None else (noun_forms(wn) if encoders else [])
    encoder_vectors = {}
    for name in encoders:
        t = time.perf_counter()
        embedder = TextEncoderEmbedder(name, batch_size=batch_size)
        vectors = cached_encode(embedder, forms, cache_dir() / "semclip" / "encoder_vectors")
        encoder_vectors[name] = (embedder, vectors, {f: i for i, f in enumerate(forms)})
        coverage.append({"embedding": name, **encoder_synonym_coverage(vectors, forms, queries, chunk=chunk)})
        timings[f"{name}_coverage_s"] = round(time.perf_counter() - t, 1)
        print(f"{name} synonym coverage: {coverage[-1]} ({timings[f'{name}_coverage_s']}s)", flush=True)

    datasets, subset_notes = benchmark_datasets(files, wn)
    scorers: dict[str, Callable] = {"STE": lambda a, b: ste_pair_similarity(emb, a, b, wn)}
    for name, (embedder, vectors, index) in encoder_vectors.items():
        # words outside WordNet's noun forms are encoded in one batch up front
        extra = sorted({w.lower() for _, pairs in datasets for a, b, _ in pairs for w in (a, b)} - set(index))
        extra_vectors = dict(zip(extra, embedder.encode(extra))) if extra else {}

        def score(a, b, vectors=vectors, index=index, extra_vectors=extra_vectors):
            va = [vectors[index[w.lower()]] if w.lower() in index else extra_vectors[w.lower()] for w in (a, b)]
            return float(va[0] @ va[1])
        scorers[name] = score
    ws_rows = word_similarity_table(datasets, scorers, wn)
    cap = None
    if cap_statistics:
        t = time.perf_counter()
        cap = list_cap_statistics(uncapped_lists(), SimilarityListConfig().max_list_size, wn)
        timings["cap_statistics_s"] = round(time.perf_counter() - t, 1)

    out = Path(out)
    readme = report_markdown(ste, emb, coverage, ws_rows, protocol=protocol_text, all_queries=all_queries,
                             subset_notes=subset_notes, cap=cap)
    with atomic_path(out) as tmp:
        tmp.mkdir()
        (tmp / "README.md").write_text(readme)
        (tmp / "synonym_coverage.csv").write_text(_csv(coverage))
        (tmp / "word_similarity.csv").write_text(_csv(ws_rows))
        (tmp / "table2.csv").write_text(_csv(table2_rows(ws_rows)))
        (tmp / "meta.json").write_text(json.dumps({"ste": str(ste), "encoders": list(encoders), "word_similarity": str(ws_dir),
                                                   "protocol": protocol, "wordnet_queries": all_queries,
                                                   "sample": sample, "seed": seed, "simlex_nouns": subset_notes,
                                                   "list_cap": cap, "timings": timings,
                                                   # the paper's STE numbers, kept with the report: a sweep summary
                                                   # reads them from the run's files
                                                   "paper": {"table1_coverage": PAPER_TABLE1["STE"][2],
                                                             "table2": {d: [v[3], v[4]] for d, v in PAPER_TABLE2.items()}},
                                                   "seconds": round(time.perf_counter() - t0, 1)}, indent=2))
    if record is not None:
        write_report_record(record, coverage, ws_rows, provenance(config=[str(ste), str(ws_dir)]), encoders=list(encoders),
                            protocol=protocol, wordnet_queries=all_queries, sample=sample,
                            sample_seed=seed if sample is not None else None, report=str(out / "README.md"))
    return out


def _subset(queries: SynonymQueries, rows) -> SynonymQueries:
    return SynonymQueries(*([lst[i] for i in rows] for lst in (queries.words, queries.synonyms, queries.keys)))


def table2_rows(ws_rows: list[dict]) -> list[dict]:
    """Table 2 laid out as the paper's: one row per benchmark, our models' Spearman on the WordNet-filtered pairs
    (``<model>``) and on every pair (``<model> all pairs``), beside the paper's STE columns."""
    rows = []
    for ds in dict.fromkeys(r["dataset"] for r in ws_rows):
        paper = PAPER_TABLE2.get(ds)
        row = {"dataset": ds, "pairs": None, "wordnet_filtered": None}
        for r in ws_rows:
            if r["dataset"] == ds:
                row.update(pairs=r["pairs"], wordnet_filtered=r["wordnet_filtered"])
                row[r["model"]] = r["spearman_wordnet"]
                row[f"{r['model']} all pairs"] = r["spearman_full"]
        row.update({"paper dataset": paper[0] if paper else "", "paper pairs": paper[1] if paper else None,
                    "paper WordNet filtered": paper[2] if paper else None, "paper STE": paper[3] if paper else None,
                    "paper STE (similar subset)": paper[4] if paper else None})
        rows.append(row)
    return rows


# The paper's Table 2: our file stem -> (its name, original pairs, WordNet filtered, STE, STE on the "similar
# subset"). Its EN-SIMLEX is the 666 noun pairs (our <stem>-N); EN-MTurk-771, EN-YP-130 and the *-SYNS sets are
# not in the shared data.
PAPER_TABLE2 = {
    "EN-MC-30": ("EN-MC-30", 30, 30, 0.650, 0.650),
    "EN-MEN-TR-3k": ("EN-MEN-TR-3k", 3000, 2657, 0.257, 0.780),
    "EN-MTurk-287": ("EN-MTurk-287", 287, 243, 0.300, 0.810),
    "EN-RG-65": ("EN-RG-65", 65, 64, 0.640, 0.820),
    "EN-RW-STANFORD": ("EN-RW-STANFORD", 2034, 910, 0.217, 0.590),
    "EN-SIMLEX-999-N": ("EN-SIMLEX", 666, 666, 0.398, 0.670),
    "EN-WS-353-ALL": ("EN-WS-353-ALL", 352, 348, 0.303, 0.720),
    "EN-WS-353-REL": ("EN-WS-353-REL", 252, 248, 0.0, 0.0),
    "EN-WS-353-SIM": ("EN-WS-353-SIM", 203, 201, 0.820, 0.820),
}
# The paper's Table 1 (71,895 queries each).
PAPER_TABLE1 = {"CLIP": (71895, 28070, 0.4927), "SBERT": (71895, 37888, 0.527), "STE": (71895, 67309, 0.877)}


TABLE1_COLUMNS = ("embedding", "queries", "queries_in_vocabulary", "synonyms_in_top10", "coverage", "synonym_recall")


def table1_rows(coverage: list[dict]) -> list[dict]:
    """Table 1 as the report shows it: our embeddings' coverage rows, then the paper's."""
    return list(coverage) + [{"embedding": f"paper: {k}", "queries": q, "synonyms_in_top10": h, "coverage": c}
                             for k, (q, h, c) in PAPER_TABLE1.items()]


def table2_columns(ws_rows: list[dict]) -> list[str]:
    """The report's Table 2 columns (:func:`table2_rows`' keys, as its header prints them)."""
    models = list(dict.fromkeys(r["model"] for r in ws_rows))
    return ["dataset", "pairs", "wordnet_filtered", *models, *[f"{m} all pairs" for m in models],
            "paper pairs", "paper WordNet filtered", "paper STE", "paper STE (similar subset)"]


def _record_key(header: str) -> str:
    """A report header as a record column: ``STE all pairs`` -> ``ste_all_pairs``."""
    return re.sub(r"[^0-9a-z]+", "_", header.lower()).strip("_") or "column"


def _record_value(value):
    """A report cell as JSON: a count as an integer, a number as a float (not finite: null), text as text."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return finite_float(value)
    return str(value)


REPORT_TABLES = {1: "Synonym coverage (Table 1)", 2: "Word similarity (Table 2), Spearman"}


def report_record_table(coverage: list[dict], ws_rows: list[dict]) -> dict:
    """Tables 1 and 2 of the report (README.md) as one record table: ``columns``, ``labels``, ``rows`` and ``tables``.
    Table 1's rows (:func:`table1_rows`, ``table`` 1), then Table 2's (:func:`table2_rows`, ``table`` 2), each cell
    under its header made a key (``STE all pairs`` -> ``ste_all_pairs``; ``labels``: the headers as printed).
    ``tables``: each table's title and columns (a marker shows one with ``where=table=N columns=...``)."""
    parts = {1: (table1_rows(coverage), list(TABLE1_COLUMNS)), 2: (table2_rows(ws_rows), table2_columns(ws_rows))}
    labels, rows, tables = {"table": "table"}, [], {}
    for number, (table, headers) in parts.items():
        keys = {h: _record_key(h) for h in headers}
        clash = [k for k in keys.values() if k in labels or list(keys.values()).count(k) > 1]
        if clash:
            raise ValueError(f"Table {number}: two of its headers ({headers}) or another table's make the record "
                             f"column {clash[0]!r}; give the encoders distinct names")
        labels |= {k: h for h, k in keys.items()}
        tables[str(number)] = {"title": REPORT_TABLES[number], "columns": list(keys.values())}
        rows += [{"table": number, **{k: _record_value(r.get(h)) for h, k in keys.items()}} for r in table]
    return {"columns": list(labels), "labels": labels, "rows": rows, "tables": tables}


REPORT_RECORD_NOTE = ("Written by python -m grounding.semclip report --record: Tables 1 and 2 of the STE report "
                      "(README.md) in one table, `table` 1 or 2 (show one with where=table=N and that table's columns, "
                      "listed under `tables`). Table 1: synonym coverage of each embedding (the STE, then each text "
                      "encoder) under `protocol`, then the paper's rows. Table 2: Spearman of each benchmark on its "
                      "WordNet-filtered pairs (a model's column) and on every pair it embeds (`all pairs`), beside the "
                      "paper's Table 2. config: the STE export and the word-similarity folder read. seeds is null: the "
                      "STE's training seed is its run's, not known to this command (sample_seed: the query sample's).")


def write_report_record(path: str | Path, coverage: list[dict], ws_rows: list[dict], provenance_keys: dict,
                        **extra) -> Path:
    """Tables 1 and 2 (:func:`report_record_table`) as a record at ``path`` with ``provenance_keys``
    (:func:`grounding.docs_tables.provenance`) and ``extra`` (the encoders compared, the protocol, ...)."""
    t = report_record_table(coverage, ws_rows)
    return write_record(path, t["columns"], t["rows"], provenance_keys, title="SemCLIP STE report: Tables 1 and 2",
                        provenance_note=REPORT_RECORD_NOTE, labels=t["labels"], tables=t["tables"], **extra)


def _fmt_cell(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return "—" if v != v else f"{v:.3f}"
    return str(v)


def _md(rows: list[dict], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def report_markdown(ste, emb: STEEmbedding, coverage: list[dict], ws_rows: list[dict], protocol: str, all_queries: int,
                    subset_notes: dict, cap: dict | None) -> str:
    ws_cols = ["dataset", "model", "pairs", "wordnet_filtered", "covered_full", "spearman_full", "covered_wordnet",
               "spearman_wordnet"]
    lines = ["# SemCLIP STE report\n", f"STE: `{ste}` ({len(emb.keys)} lemma items, dimension {emb.dim}).\n",
             "## Synonym coverage (Table 1)\n",
             f"Protocol: {protocol}. A query is a written noun form (lower case) "
             "with exactly one noun synset, that synset having another written form (its synonyms). Covered = a synonym "
             "among the query's 10 nearest distinct written forms (cosine, the query excluded); an STE's neighbours "
             "are its lemma items, a text encoder's every WordNet noun form (embedded once). "
             "The paper counts 71,895 queries (\"70,000 single sense nouns\") without a definition that gives that "
             "number on WordNet 3.0; its rows are shown for reference.\n",
             _md(table1_rows(coverage), TABLE1_COLUMNS),
             "\n## Word similarity (Table 2), Spearman\n",
             "Model columns: the WordNet-filtered pairs (both words WordNet nouns), as the paper's STE column; "
             "`all pairs`: every pair the model embeds. `-N`: SimLex-999's noun pairs (the paper's EN-SIMLEX). "
             "The paper's columns: its Table 2 (STE, and STE on its \"similar subset\").\n",
             _md(table2_rows(ws_rows), table2_columns(ws_rows))]
    for name, info in subset_notes.items():
        lines.append(f"\n`{name}`: {info['noun_pairs']} noun pairs of {info['pairs']}, from {info['method']}."
                     + (f" For comparison: {info['wordnet_noun_pairs']} pairs have both words as WordNet nouns, "
                        f"{info['wordnet_noun_only_pairs']} both as nouns with no other WordNet part of speech"
                        if "wordnet_noun_pairs" in info else "")
                     + (f"; of the {info['noun_pairs']} noun pairs {info['pos_nouns_that_are_wordnet_nouns']} have "
                        "both words as WordNet nouns." if "pos_nouns_that_are_wordnet_nouns" in info else "."))
    lines += ["\n### Pair coverage\n", _md(ws_rows, ws_cols)]
    if cap is not None:
        lines += ["\n## The similarity lists' size cap\n", cap_markdown(cap)]
    return "\n".join(lines) + "\n"


def cap_markdown(cap: dict) -> str:
    pct = lambda v: "—" if v is None else f"{100 * v:.1f} %"  # noqa: E731
    text = (f"`max_list_size = {cap['cap']}` (data_modules/wordnet_lists.py): a list keeps all its synonyms, then its "
            "neighbours by Wu–Palmer score (descending; equal scores by synset name, lemma by lemma), up to "
            f"{cap['cap']} members. On the whole-WordNet lists (default traversal: depth differential 2, Wu–Palmer ≥ 0.8, "
            f"no siblings) it truncates **{cap['lists_truncated']:,} of {cap['lists']:,} lists** "
            f"({pct(cap['lists_truncated_share'])}) and drops **{cap['pairs_dropped']:,} of {cap['pairs_uncapped']:,} "
            f"pairs** ({pct(cap['pairs_dropped_share'])}); {cap['lists_with_more_synonyms_than_cap']} lists have more "
            f"synonyms than the cap. The truncated lists are the anchors with large subtrees (median uncapped size "
            f"{cap['truncated_list_size_median']:.0f}, largest {cap['largest_list_uncapped']:,}). "
            f"{cap['cuts_inside_equal_scores']:,} cuts fall inside a group of equal scores (the synset name decides) "
            f"and {cap['cuts_splitting_a_synset']:,} split one synset's lemmas. The median lowest kept score of a "
            f"truncated list is {cap['lowest_kept_score_in_truncated_lists_median']:.3f}; dropped scores reach "
            f"{cap['dropped_score_max']:.3f} (median {cap['dropped_score_median']:.3f}). Synonym share of the pairs: "
            f"{pct(cap['synonym_share_uncapped'])} uncapped, {pct(cap['synonym_share_capped'])} capped.")
    if cap.get("hypernym_side_share_all") is not None:
        text += (f" Hypernym-side share of the non-synonym pairs: {pct(cap['hypernym_side_share_all'])} uncapped, "
                 f"{pct(cap['hypernym_side_share_kept'])} kept, {pct(cap['hypernym_side_share_dropped'])} dropped "
                 "(the rest are hyponyms).")
    if cap.get("largest_truncated"):
        text += " Largest: " + ", ".join(f"`{e['anchor']}` {e['size']:,} → {e['kept']}" for e in cap["largest_truncated"]) + "."
    return text + "\n"

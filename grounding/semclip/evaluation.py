"""STE evaluation (SemCLIP §5): synonym coverage (Table 1) and word similarity (Table 2).

* Synonym coverage: every single-sense WordNet noun (a written form with exactly one noun synset)
  that has a synonym (another written form in its synset) is a query; it counts as covered when
  at least one synonym is among its 10 nearest neighbours (cosine, the query itself excluded).
  STE neighbours are lemma items (their written forms are compared); a text encoder embeds every
  written noun form once and its neighbours are written forms.
* Word similarity: Spearman correlation (scipy.stats) between cosine similarity and the human
  scores of every ``w1<TAB>w2<TAB>score`` file, on all pairs a model can embed and on the
  WordNet-filtered subset (both words are WordNet nouns). A word maps to all STE items with that
  written form (or its WordNet base form); a pair scores the best cosine over their senses.
"""

from __future__ import annotations

import csv
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats

from data_modules.wordnet_lists import lemma_surface
from grounding.encoders import load_text_encoder, load_tokenizer
from grounding.errors import MissingInputError
from grounding.lexicon import wordnet
from grounding.paths import cache_dir, shared_data_dir
from grounding.semclip.ste import STEEmbedding
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
            parts.append(torch.load(path))
            continue
        parts.append(embedder.encode(texts[start:start + chunk]))
        with atomic_path(path, suffix=".pt") as tmp:
            torch.save(parts[-1], tmp)
    return torch.cat(parts)


# ------------------------------------------------------------------------------------------
# Table 1: synonym coverage
# ------------------------------------------------------------------------------------------
def _topk_rows(queries: torch.Tensor, bank: torch.Tensor, k: int, self_rows: torch.Tensor | None, chunk: int = 512):
    out = []
    for start in range(0, len(queries), chunk):
        sims = queries[start:start + chunk] @ bank.T
        if self_rows is not None:
            part = self_rows[start:start + chunk]
            valid = part >= 0
            sims[torch.arange(len(part))[valid], part[valid]] = -2.0
        out.append(sims.topk(k, dim=-1).indices)
    return torch.cat(out) if out else torch.empty(0, k, dtype=torch.long)


def coverage_from_neighbours(neighbour_forms: Sequence[Sequence[str]], queries: SynonymQueries) -> dict:
    hits = sum(bool(q_syn & set(nb)) for q_syn, nb in zip(queries.synonyms, neighbour_forms))
    found = sum(len(q_syn & set(nb)) for q_syn, nb in zip(queries.synonyms, neighbour_forms))
    total = sum(len(s) for s in queries.synonyms)
    n = len(queries.words)
    return {"queries": n, "synonyms_in_top10": hits, "coverage": hits / n if n else float("nan"),
            "synonym_recall": found / total if total else float("nan")}


def ste_synonym_coverage(ste: STEEmbedding, queries: SynonymQueries, k: int = 10) -> dict:
    """Table 1 for the STE: neighbours are lemma items, compared by written form."""

    rows = torch.tensor([ste.index.get(key, -1) for key in queries.keys])
    known = rows >= 0
    surfaces = [lemma_surface(key) for key in ste.keys]
    # take extra neighbours: several items can share a written form; keep the first k distinct forms
    top = _topk_rows(ste.normalized[rows[known]], ste.normalized, min(3 * k, len(ste.keys) - 1), rows[known])
    forms_per_query: list[list[str]] = [[] for _ in queries.words]
    for q, nb in zip(torch.nonzero(known).flatten().tolist(), top.tolist()):
        seen: dict[str, None] = {}
        for r in nb:
            form = surfaces[r]
            if form != queries.words[q]:
                seen.setdefault(form, None)
            if len(seen) == k:
                break
        forms_per_query[q] = list(seen)
    result = coverage_from_neighbours(forms_per_query, queries)
    result["queries_in_vocabulary"] = int(known.sum())
    return result


def encoder_synonym_coverage(vectors: torch.Tensor, forms: Sequence[str], queries: SynonymQueries, k: int = 10) -> dict:
    """Table 1 for a text encoder: ``vectors`` (normalised) embed ``forms`` (WordNet's noun forms)."""
    index = {f: i for i, f in enumerate(forms)}
    rows = torch.tensor([index.get(w, -1) for w in queries.words])
    known = rows >= 0
    top = _topk_rows(vectors[rows[known]], vectors, k, rows[known])
    forms_per_query: list[list[str]] = [[] for _ in queries.words]
    for q, nb in zip(torch.nonzero(known).flatten().tolist(), top.tolist()):
        forms_per_query[q] = [forms[r] for r in nb]
    result = coverage_from_neighbours(forms_per_query, queries)
    result["queries_in_vocabulary"] = int(known.sum())
    return result


# ------------------------------------------------------------------------------------------
# Table 2: word similarity
# ------------------------------------------------------------------------------------------
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


def word_similarity_table(files: Sequence[Path], scorers: dict[str, Callable[[str, str], float | None]], wn) -> list[dict]:
    """One row per (benchmark, model): pair counts and Spearman on the full and WordNet-filtered sets."""
    rows = []
    for path in files:
        pairs = read_word_similarity(path)
        in_wn = [wordnet_noun(a, wn) and wordnet_noun(b, wn) for a, b, _ in pairs]
        for model, score in scorers.items():
            preds = [score(a, b) for a, b, _ in pairs]
            full = [(p, g) for p, (_, _, g) in zip(preds, pairs) if p is not None]
            filt = [(p, g) for p, f, (_, _, g) in zip(preds, in_wn, pairs) if p is not None and f]
            rows.append({"dataset": path.stem, "model": model, "pairs": len(pairs), "wordnet_filtered": sum(in_wn),
                         "covered_full": len(full), "spearman_full": spearman(*zip(*full)) if full else float("nan"),
                         "covered_wordnet": len(filt),
                         "spearman_wordnet": spearman(*zip(*filt)) if filt else float("nan")})
    return rows


# ------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------
def _markdown(rows: list[dict], columns: Sequence[str]) -> str:
    def fmt(v):
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    if rows:
        w = csv.DictWriter(buf, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return buf.getvalue()


def write_report(ste: str | Path, out: str | Path, encoders: Sequence[str] = ("minilm",), word_similarity: str | Path | None = None,
                 max_queries: int | None = None, batch_size: int = 512, seed: int = 0) -> Path:
    """Table 1 + Table 2 for the STE (and text encoders) into ``out/`` (README.md + CSVs + meta.json)."""

    wn = wordnet()
    t0 = time.perf_counter()
    emb = STEEmbedding.load(ste)
    queries = single_sense_noun_queries(wn)
    # An STE trained on part of WordNet (e.g. the tiny config) is scored on the queries it knows.
    in_vocab = [i for i, key in enumerate(queries.keys) if key in emb.index]
    if len(in_vocab) < len(queries.keys):
        print(f"STE vocabulary covers {len(in_vocab)} of {len(queries.keys)} synonym queries; scoring those", flush=True)
        queries = SynonymQueries(*([lst[i] for i in in_vocab] for lst in (queries.words, queries.synonyms, queries.keys)))
    if max_queries is not None and max_queries < len(queries.words):
        pick = np.sort(np.random.default_rng(seed).choice(len(queries.words), max_queries, replace=False))
        queries = SynonymQueries(*([lst[i] for i in pick] for lst in (queries.words, queries.synonyms, queries.keys)))
    timings = {}
    coverage = [{"embedding": "STE", **ste_synonym_coverage(emb, queries)}]
    timings["ste_coverage_s"] = round(time.perf_counter() - t0, 1)
    print(f"STE synonym coverage: {coverage[0]} ({timings['ste_coverage_s']}s)", flush=True)
    forms = noun_forms(wn)
    encoder_vectors = {}
    for name in encoders:
        t = time.perf_counter()
        embedder = TextEncoderEmbedder(name, batch_size=batch_size)
        vectors = cached_encode(embedder, forms, cache_dir() / "semclip" / "encoder_vectors")
        encoder_vectors[name] = (embedder, vectors, {f: i for i, f in enumerate(forms)})
        coverage.append({"embedding": name, **encoder_synonym_coverage(vectors, forms, queries)})
        timings[f"{name}_coverage_s"] = round(time.perf_counter() - t, 1)
        print(f"{name} synonym coverage: {coverage[-1]} ({timings[f'{name}_coverage_s']}s)", flush=True)

    ws_dir = Path(word_similarity) if word_similarity else shared_data_dir() / "word-similarity"
    files = sorted(p for p in ws_dir.glob("*.txt")) if ws_dir.is_dir() else []
    if word_similarity and not files:
        raise MissingInputError(f"No word-similarity files (*.txt, w1<TAB>w2<TAB>score) in {ws_dir}")
    scorers: dict[str, Callable] = {"STE": lambda a, b: ste_pair_similarity(emb, a, b, wn)}
    for name, (embedder, vectors, index) in encoder_vectors.items():
        # words outside WordNet's noun forms are encoded in one batch up front
        extra = sorted({w.lower() for f in files for a, b, _ in read_word_similarity(f) for w in (a, b)} - set(index))
        extra_vectors = dict(zip(extra, embedder.encode(extra))) if extra else {}

        def score(a, b, vectors=vectors, index=index, extra_vectors=extra_vectors):
            va = [vectors[index[w.lower()]] if w.lower() in index else extra_vectors[w.lower()] for w in (a, b)]
            return float(va[0] @ va[1])
        scorers[name] = score
    ws_rows = word_similarity_table(files, scorers, wn)

    out = Path(out)
    cov_cols = ["embedding", "queries", "queries_in_vocabulary", "synonyms_in_top10", "coverage", "synonym_recall"]
    ws_cols = ["dataset", "model", "pairs", "wordnet_filtered", "covered_full", "spearman_full", "covered_wordnet", "spearman_wordnet"]
    pivot = []
    for ds in dict.fromkeys(r["dataset"] for r in ws_rows):
        row = {"dataset": ds}
        for r in ws_rows:
            if r["dataset"] == ds:
                row.update(pairs=r["pairs"], wordnet_filtered=r["wordnet_filtered"])
                row[f"{r['model']} full"] = r["spearman_full"]
                row[f"{r['model']} WordNet"] = r["spearman_wordnet"]
        pivot.append(row)
    readme = ["# SemCLIP STE report\n", f"STE: `{ste}` ({len(emb.keys)} lemma items, dimension {emb.dim}).\n",
              "## Synonym coverage (Table 1)\n",
              "Single-sense WordNet nouns with a synonym; covered = a synonym among the 10 nearest neighbours.\n",
              _markdown(coverage, cov_cols), "\n## Word similarity (Table 2), Spearman\n",
              "`full`: every pair the model can embed; `WordNet`: pairs whose words are both WordNet nouns.\n",
              _markdown(pivot, list(pivot[0]) if pivot else ["dataset"]), "\n### Pair coverage\n", _markdown(ws_rows, ws_cols), ""]
    with atomic_path(out) as tmp:
        tmp.mkdir()
        (tmp / "README.md").write_text("\n".join(readme))
        (tmp / "synonym_coverage.csv").write_text(_csv(coverage))
        (tmp / "word_similarity.csv").write_text(_csv(ws_rows))
        (tmp / "meta.json").write_text(json.dumps({"ste": str(ste), "encoders": list(encoders), "word_similarity": str(ws_dir),
                                                   "max_queries": max_queries, "timings": timings,
                                                   "seconds": round(time.perf_counter() - t0, 1)}, indent=2))
    return out

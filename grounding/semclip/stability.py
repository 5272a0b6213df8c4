"""SemCLIP retrieval evaluation (§5, Tables 3–4) and the alignment fit (§4): the pieces shared by the embedded
world (here: ``evaluate_world``) and real photos (``grounding.semclip.photo_evaluation``).

* Table 3, retrieval stability: for every object noun with synonyms, the image lists retrieved for
  "A photo of a <noun>" and for each synonym variant ("A photo of an orb"); overlap@k averaged over
  the (query, variant) pairs, SemCLIP versus the base VLM.
* Table 4, text→image and image→text NDCG@10 / mAP / R@10 with synonym-augmented ground truth:
  an image is relevant to every noun query (canonical word or synonym) naming a kind it contains;
  for image→text the candidates are the noun queries.
* The nearest-neighbour recovery error of Γ_t on the training and held-out alignment pairs.

Every number is computed from the models and the annotations (world.json, or the photos' captions).
Per-query values (:func:`retrieval_per_query`, :func:`pair_overlaps`) feed the bootstrap intervals of
:func:`bootstrap_means`.
"""

from __future__ import annotations

import csv
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from scipy import stats

from grounding.docs_tables import write_record
from grounding.errors import MissingInputError
from grounding.retrieval_metrics import break_ties
from grounding.semclip.alignment import overlap_at_k, recovery_error
from grounding.semclip.store import SemCLIPStore
from grounding.summary_tables import finite_float
from grounding.utils.io import atomic_path

PROMPT = "A photo of"
DIRECTIONS = ("t2i", "i2t")
TABLE4_METRICS = ("ndcg@10", "map", "recall@10")
WORLD_TABLE4_HEADERS = {"ndcg@10": "NDCG", "map": "mAP", "recall@10": "R@10"}  # the world report's Table 4 header


@dataclass
class NounQuery:
    text: str     # "A photo of an orb"
    word: str     # "orb"
    kind: str     # what it names: the world object kind ("ball"), or a caption noun whose synonym it is
    canonical: bool  # the kind's own word (a noun of the captions), not a synonym variant


def article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def noun_queries(objects: Sequence[dict], prompt: str = PROMPT) -> list[NounQuery]:
    """One query per object word and synonym of the world vocabulary (world.json "vocabulary.objects")."""
    out = []
    for obj in objects:
        for word, canonical in [(obj["name"], True)] + [(s["word"], False) for s in obj.get("synonyms", [])]:
            out.append(NounQuery(f"{prompt} {article(word)} {word}", word, obj["name"], canonical))
    return out


def world_images(world: str | Path, splits: Sequence[str] = ("val", "test")) -> tuple[list[Path], list[set[str]], dict]:
    """Image paths, the object kinds of each image and world.json, for the given world splits.

    Paths point into the COCO layout (``coco/val2017`` holds the val and test images) when it
    exists, in image-id order, so the suite VLM's cached backbone maps are reused."""
    world = Path(world)
    meta_file = world / "world.json"
    if not meta_file.is_file():
        raise MissingInputError(f"{meta_file} not found: generate the embedded world with `make world` "
                                "(python -m data_modules.synthetic --out data/world).")
    meta = json.loads(meta_file.read_text())
    unknown = set(splits) - {"train", "val", "test"}
    if unknown:
        raise ValueError(f"splits must be among train/val/test, got {sorted(unknown)}")
    images = sorted((im for im in meta["images"] if im["split"] in splits), key=lambda im: im["image_id"])
    if not images:
        raise ValueError(f"{meta_file} has no images in splits {list(splits)}")
    paths = []
    for im in images:
        coco = world / "coco" / ("train2017" if im["split"] == "train" else "val2017") / im["file_name"]
        paths.append(coco if coco.is_file() else world / "images" / im["file_name"])
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise MissingInputError(f"{len(missing)} world image(s) missing, e.g. {missing[0]}; regenerate with `make world`.")
    return paths, [{o["kind"] for o in im["objects"]} for im in images], meta


def ranked(scores: torch.Tensor, k: int, seed: int = 0) -> torch.Tensor:
    """Top-k ids per row, ties broken at random with a fixed seed (grounding.retrieval_metrics.break_ties)."""
    return break_ties(scores, seed).topk(k, dim=-1).indices


def synonym_pairs(queries: Sequence[NounQuery]) -> list[tuple[int, int]]:
    """(canonical query, synonym variant) index pairs."""
    canon = {q.kind: i for i, q in enumerate(queries) if q.canonical}
    return [(canon[q.kind], i) for i, q in enumerate(queries) if not q.canonical and q.kind in canon]


def pair_overlaps(scores: torch.Tensor, queries: Sequence[NounQuery], k: int) -> torch.Tensor:
    """|top-k(q) ∩ top-k(q')| / k for every (noun, synonym) pair (P,)."""
    pairs = synonym_pairs(queries)
    if not pairs:
        raise ValueError("No (noun, synonym) query pairs: the world vocabulary lists no synonyms.")
    a, b = torch.tensor([p[0] for p in pairs]), torch.tensor([p[1] for p in pairs])
    top = ranked(scores, min(k, scores.shape[1]))
    return (top[a][:, :, None] == top[b][:, None, :]).any(-1).float().mean(-1)


def stability(scores: torch.Tensor, queries: Sequence[NounQuery], ks: Sequence[int]) -> dict[int, float]:
    """Table 3: mean overlap@k between each canonical query's list and each of its synonym variants'."""
    pairs = synonym_pairs(queries)
    if not pairs:
        raise ValueError("No (noun, synonym) query pairs: the world vocabulary lists no synonyms.")
    a, b = torch.tensor([p[0] for p in pairs]), torch.tensor([p[1] for p in pairs])
    out = {}
    for k in ks:
        top = ranked(scores, min(k, scores.shape[1]))
        out[k] = overlap_at_k(top[a], top[b][:, None, :])
    return out


def relevance(queries: Sequence[NounQuery], kinds: Sequence[set[str]]) -> torch.Tensor:
    """(Q, N) synonym-augmented ground truth: query q is relevant to image n when n contains q's kind. Built from a
    (kinds, N) incidence matrix, one row gathered per query (stores of thousands of photos x queries)."""
    index = {kind: i for i, kind in enumerate(dict.fromkeys([q.kind for q in queries]))}
    incidence = torch.zeros(len(index) + 1, len(kinds), dtype=torch.bool)  # the last row: kinds no query asks for
    pairs = [(index[k], n) for n, ks in enumerate(kinds) for k in ks if k in index]
    if pairs:
        rows, cols = torch.tensor(pairs).T
        incidence[rows, cols] = True
    return incidence[torch.tensor([index[q.kind] for q in queries], dtype=torch.long)]


def per_query_retrieval(scores: torch.Tensor, relevant: torch.Tensor, k: int = 10) -> dict[str, torch.Tensor]:
    """Per row of a (Q, N) score matrix (no ties left, every row with a relevant item): NDCG@k (binary gains,
    log2(rank + 1) discount), AP and R@k, the definitions of torchmetrics.retrieval (whose means
    grounding.semclip.alignment.retrieval_scores gives)."""
    n = scores.shape[1]
    rel = relevant.gather(-1, scores.argsort(dim=-1, descending=True)).double()  # relevance in rank order
    n_rel = rel.sum(-1)
    rank = torch.arange(1, n + 1, dtype=torch.float64)
    top = min(k, n)
    discount = 1.0 / torch.log2(rank[:top] + 1)
    ideal = (discount[None] * (rank[None, :top] <= n_rel[:, None])).sum(-1)  # all relevant items first
    return {f"ndcg@{k}": (rel[:, :top] * discount).sum(-1) / ideal,
            "map": (rel * rel.cumsum(-1) / rank).sum(-1) / n_rel,  # precision at each relevant rank, averaged
            f"recall@{k}": rel[:, :top].sum(-1) / n_rel}


def retrieval_per_query(scores: torch.Tensor, relevant: torch.Tensor, k: int = 10, seed: int = 0) -> dict[str, dict]:
    """Table 4 per query of a (Q, N) query-image score matrix: t2i over queries with a relevant image, i2t over images
    with a relevant query (candidates: the noun queries); ``rows``: which queries / images each value belongs to."""
    t2i_rows, i2t_rows = relevant.any(1), relevant.any(0)
    scores = break_ties(scores, seed)  # tied items in a seeded random order, not in a sort's
    return {"t2i": {**per_query_retrieval(scores[t2i_rows], relevant[t2i_rows], k), "rows": t2i_rows.nonzero()[:, 0]},
            "i2t": {**per_query_retrieval(scores.T[i2t_rows], relevant.T[i2t_rows], k), "rows": i2t_rows.nonzero()[:, 0]}}


def retrieval(scores: torch.Tensor, relevant: torch.Tensor, k: int = 10) -> dict[str, dict]:
    """Table 4: the means of :func:`retrieval_per_query` and the number of queries of each direction."""
    return {d: {**{m: float(v.mean()) for m, v in per.items() if m != "rows"}, "queries": len(per["rows"])}
            for d, per in retrieval_per_query(scores, relevant, k).items()}


def bootstrap_means(values: np.ndarray, clusters: np.ndarray, n_resamples: int = 1000, confidence: float = 0.95,
                    seed: int = 0) -> dict[str, np.ndarray]:
    """Percentile bootstrap over queries of the means of S systems' per-unit values ``values`` (S, U) and of each
    system's paired difference to system 0 (same resamples for all systems: S x S - system 0).

    ``clusters`` (U,): the query each unit belongs to (a noun with its synonym variants, an image); whole clusters
    are resampled and a mean is the sum over the drawn clusters' units / their number (so the point estimate is
    the plain mean over units). Returns ``mean`` (S,), ``low`` / ``high`` (S,), ``diff`` / ``diff_low`` /
    ``diff_high`` (S,; row 0 is 0). scipy.stats.bootstrap, vectorised over resamples, seeded."""
    values = np.asarray(values, dtype=np.float64)
    _, cid = np.unique(np.asarray(clusters), return_inverse=True)
    n_clusters = int(cid.max()) + 1 if cid.size else 0
    sums = np.zeros((values.shape[0], n_clusters))
    np.add.at(sums, (slice(None), cid), values)
    counts = np.bincount(cid, minlength=n_clusters).astype(np.float64)
    mean = sums.sum(1) / max(counts.sum(), 1.0)
    out = {"mean": mean, "diff": mean - mean[0], "clusters": n_clusters}
    if n_clusters < 2:  # nothing to resample: no interval
        nan = np.full_like(mean, np.nan)
        return {**out, "low": nan, "high": nan, "diff_low": nan, "diff_high": nan}

    def statistic(c, *s, axis=-1):
        m = np.stack([x.sum(axis) for x in s]) / c.sum(axis)
        return np.concatenate([m, m - m[:1]])

    res = stats.bootstrap((counts, *sums), statistic, paired=True, vectorized=True, method="percentile",
                          n_resamples=n_resamples, confidence_level=confidence, rng=np.random.default_rng(seed))
    low, high = res.confidence_interval
    s = len(mean)
    return {**out, "low": low[:s], "high": high[:s], "diff_low": low[s:], "diff_high": high[s:]}


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(a.float(), dim=-1) @ torch.nn.functional.normalize(b.float(), dim=-1).T


def method_name(query_mode: str) -> str:
    return f"SemCLIP ({'STE' if query_mode == 'ste' else 'Γ_t'} query)"


@torch.no_grad()
def system_scores(vlm, transform, ste, image_vlm: torch.Tensor, query_texts: Sequence[str], query_vlm: torch.Tensor,
                  bank_texts: Sequence[str], bank_vlm: torch.Tensor, query_modes: Sequence[str] = ("ste", "transform"),
                  targets=None, ids: Sequence | None = None, image_neighbours: int = 1,
                  ) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """(Q, N) query-image cosine scores of the base VLM and of SemCLIP for each query mode, with each SemCLIP
    image's nearest bank text (None for the VLM). SemCLIP is §4's content store: the bank texts in SemCLIP space by
    Γ_t, each image as Γ_t of its nearest bank text (Eq. 7), queries by the STE of their nouns or by Γ_t (the full
    score matrix: exact). ``targets``: the CaptionTargets of the STE queries (e.g. with lexical variants);
    ``image_neighbours``: :class:`grounding.semclip.store.SemCLIPStore`'s."""
    out = {"VLM": (cosine(query_vlm, image_vlm), None)}
    for mode in query_modes:
        store = SemCLIPStore(vlm, transform, ste, query_mode=mode, targets=targets, image_neighbours=image_neighbours)
        store.add_texts(bank_texts, bank_vlm)
        nearest = store.ingest(vlm_embeddings=image_vlm, ids=ids)
        out[method_name(mode)] = (store.scores(list(query_texts)), nearest)
    return out


@torch.no_grad()
def evaluate_world(vlm, transform, ste, world: str | Path, pairs: dict | None = None,
                   train_idx: torch.Tensor | None = None, val_idx: torch.Tensor | None = None,
                   bank_captions: Sequence[str] | None = None, splits: Sequence[str] = ("val", "test"),
                   ks: Sequence[int] = (1, 5, 10, 50), query_modes: Sequence[str] = ("ste", "transform"),
                   prompt: str = PROMPT, image_neighbours: int = 1) -> dict:
    """Every number of the SemCLIP world report (see the module docstring).

    ``pairs``: the alignment pairs cache (captions, vlm_text, targets) whose captions (with their
    cached VLM embeddings) form the store's text bank together with the world's object words;
    ``train_idx`` / ``val_idx``: its split, for the recovery errors."""

    t0 = time.perf_counter()
    paths, kinds, meta = world_images(world, splits)
    objects = meta["vocabulary"]["objects"]
    queries = noun_queries(objects, prompt)
    words = [q.word for q in queries]
    image_vlm = vlm.encode_image(paths)
    query_vlm = vlm.encode_text([q.text for q in queries])
    relevant = relevance(queries, kinds)

    results: dict = {"n_images": len(paths), "splits": list(splits), "n_queries": len(queries),
                     "n_pairs": sum(not q.canonical for q in queries), "ks": list(ks),
                     "queries": [q.__dict__ for q in queries], "methods": {}}
    pairs_idx = synonym_pairs(queries)
    per_pair = lambda sc: [[queries[a].word, queries[b].word] + [float(v) for v in  # noqa: E731
                            torch.stack([pair_overlaps(sc, queries, k) for k in ks], 1)[i]]
                           for i, (a, b) in enumerate(pairs_idx)]

    bank_texts, bank_vlm = [], []
    if pairs is not None:
        bank_texts, bank_vlm = list(pairs["captions"]), [pairs["vlm_text"]]
    if bank_captions:
        bank_texts += list(bank_captions)
        bank_vlm.append(vlm.encode_text(list(bank_captions)))
    bank_texts += words  # the base noun vocabulary of the world
    bank_vlm.append(vlm.encode_text(words))
    systems = system_scores(vlm, transform, ste, image_vlm, [q.text for q in queries], query_vlm, bank_texts,
                            torch.cat(bank_vlm), query_modes, ids=[p.name for p in paths], image_neighbours=image_neighbours)
    for name, (scores, nearest) in systems.items():
        results["methods"][name] = {"stability": stability(scores, queries, ks), **retrieval(scores, relevant),
                                    "pairs": per_pair(scores)}
        if nearest is not None:
            results["methods"][name]["distinct_image_vectors"] = int(nearest.unique().numel())
            results["bank_size"] = len(bank_texts)
            results["nearest_text_examples"] = [(p.name, sorted(k), bank_texts[j]) for p, k, j in
                                                list(zip(paths, kinds, nearest.tolist()))[:5]]

    if pairs is not None:
        rec = {}
        for split, idx in (("train", train_idx), ("val", val_idx)):
            if idx is not None and len(idx):
                pred = transform(pairs["vlm_text"][idx].float())
                rec[split] = {"pairs": int(len(idx)), "recovery_error": recovery_error(pred, pairs["targets"][idx]),
                              "mse": float(((pred - pairs["targets"][idx]) ** 2).sum(-1).mean())}
        results["recovery"] = rec
    results["seconds"] = round(time.perf_counter() - t0, 2)
    return results


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------
def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence]) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows)


def write_world_report(results: dict, out: str | Path, provenance: dict | None = None) -> Path:
    """``out/`` with README.md (Tables 3–4, recovery error), stability.csv (+ per pair:
    stability_pairs.csv), retrieval.csv, recovery.csv and results.json; each file written atomically."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    n, ks = results["n_images"], results["ks"]
    methods = results["methods"]
    write_csv(out / "stability.csv", ["method", "k", "k_effective", "overlap"],
               [[m, k, min(k, n), f"{r['stability'][k]:.4f}"] for m, r in methods.items() for k in ks])
    write_csv(out / "retrieval.csv", ["method", "direction", "queries", "ndcg@10", "map", "recall@10"],
               [[m, d, r[d]["queries"], f"{r[d]['ndcg@10']:.4f}", f"{r[d]['map']:.4f}", f"{r[d]['recall@10']:.4f}"]
                for m, r in methods.items() for d in ("t2i", "i2t")])
    write_csv(out / "stability_pairs.csv", ["method", "noun", "synonym"] + [f"overlap@{k}" for k in ks],
               [[m, *row[:2], *(f"{v:.4f}" for v in row[2:])] for m, r in methods.items() for row in r.get("pairs", [])])
    rec = results.get("recovery") or {}
    write_csv(out / "recovery.csv", ["split", "pairs", "recovery_error", "mse"],
               [[s, r["pairs"], f"{r['recovery_error']:.4f}", f"{r['mse']:.4f}"] for s, r in rec.items()])
    with atomic_path(out / "results.json") as tmp:
        tmp.write_text(json.dumps({**results, "provenance": provenance or {}}, indent=2, default=str))

    lines = ["# SemCLIP on the embedded world (Tables 3–4)", ""]
    if provenance:
        lines += [f"- {k}: `{v}`" for k, v in provenance.items() if v is not None] + [""]
    lines += [f"Images: {n} (world splits {', '.join(results['splits'])}); noun queries: {results['n_queries']} "
              f"(\"{PROMPT} <noun>\" for every object word and synonym), {results['n_pairs']} (noun, synonym) pairs; "
              f"SemCLIP text bank: {results.get('bank_size', 0)} texts (alignment captions + object words).", "",
              "## Table 3: retrieval stability (overlap@k of a noun's and its synonyms' image lists)", "",
              "| Method | " + " | ".join(metric_header(f"overlap@{k}") for k in ks) + " |", "|---" * (len(ks) + 1) + "|"]
    lines += [f"| {m} | " + " | ".join(f"{r['stability'][k]:.3f}" for k in ks) + " |" for m, r in methods.items()]
    capped = [k for k in ks if k >= n]
    if capped:
        lines += ["", f"k ≥ {n} (the number of images) returns every image: overlap@{', '.join(map(str, capped))} is 1 by "
                      "construction."]
    lines += ["", "## Table 4: retrieval with synonym-augmented ground truth (@10)", "",
              "| Method | " + " | ".join(metric_header(f"{d} {x}", WORLD_TABLE4_HEADERS) for d in DIRECTIONS
                                       for x in TABLE4_METRICS) + " |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {m} | " + " | ".join(f"{r[d][x]:.3f}" for d in DIRECTIONS for x in TABLE4_METRICS)
              + " |" for m, r in methods.items()]
    lines += ["", "t2i: one query per object word or synonym with at least one relevant image (R@10 is bounded by "
                  "10 / the number of relevant images); i2t: each image ranks the noun queries, relevant = the words "
                  "(any synonym) naming a kind it contains. Ties (SemCLIP images sharing their nearest text share a "
                  "vector) are broken at random with a fixed seed in both tables (grounding.retrieval_metrics.break_ties), "
                  "never by image order."]
    distinct = {m: r["distinct_image_vectors"] for m, r in methods.items() if "distinct_image_vectors" in r}
    if distinct:
        lines += ["", "Distinct SemCLIP image vectors (distinct nearest bank texts, Eq. 7): "
                  + ", ".join(f"{m}: {v} of {n}" for m, v in distinct.items()) + "."]
    if rec:
        lines += ["", "## Alignment transform Γ_t: nearest-neighbour recovery error (§4; paper < 4%)", "",
                  "| Pairs | N | Recovery error | MSE (Eq. 8) |", "|---|---|---|---|"]
        lines += [f"| {s} | {r['pairs']} | {100 * r['recovery_error']:.2f}% | {r['mse']:.4f} |" for s, r in rec.items()]
    lines += ["", f"Computed in {results['seconds']} s by `python -m grounding.semclip evaluate`.", ""]
    with atomic_path(out / "README.md") as tmp:
        tmp.write_text("\n".join(lines), encoding="utf-8")
    return out


# ------------------------------------------------------------------------------------------------
# Records (grounding.docs_tables): Tables 3–4 as data
# ------------------------------------------------------------------------------------------------
def record_column(metric: str) -> str:
    """A Tables 3–4 metric as a record's column: ``overlap@10`` -> ``overlap_at10``, ``t2i ndcg@10`` ->
    ``t2i_ndcg_at10``."""
    return metric.replace(" ", "_").replace("@", "_at")


def metric_header(metric: str, names: dict[str, str] | None = None) -> str:
    """A Tables 3–4 metric's column header in a report: ``overlap@10`` -> ``Overlap@10``, ``t2i ndcg@10`` -> ``t2i``
    and its name in ``names`` (the world report's ``NDCG``, the photo report's ``NDCG@10``)."""
    if metric.startswith("overlap@"):
        return "Overlap@" + metric.partition("@")[2]
    direction, _, name = metric.partition(" ")
    return f"{direction} {(names or WORLD_TABLE4_HEADERS)[name]}"


def world_record_table(results: dict) -> tuple[list[str], dict[str, str], list[dict]]:
    """Tables 3–4 of :func:`write_world_report` as one record table (``columns``, ``labels``, ``rows``): a row per
    method (``system``) with its overlap@k for each k (``overlap_at<k>``) and the six Table 4 metrics
    (``t2i_ndcg_at10``, ``t2i_map``, ``t2i_recall_at10``, the same for i2t); labels: the report's headers. A value
    that is not finite is null."""
    ks, methods = results["ks"], results["methods"]
    metrics = [f"overlap@{k}" for k in ks] + [f"{d} {x}" for d in DIRECTIONS for x in TABLE4_METRICS]
    labels = {"system": "Method"} | {record_column(m): metric_header(m, WORLD_TABLE4_HEADERS) for m in metrics}

    def value(r: dict, metric: str):
        if metric.startswith("overlap@"):
            return finite_float(r["stability"][int(metric.partition("@")[2])])
        direction, _, name = metric.partition(" ")
        return finite_float(r[direction][name])
    rows = [{"system": m, **{record_column(x): value(r, x) for x in metrics}} for m, r in methods.items()]
    return list(labels), labels, rows


WORLD_RECORD_NOTE = ("Written by python -m grounding.semclip evaluate --record (world mode): Tables 3–4 of the report "
                     "(README.md) as one table, a row per method: overlap@k of a noun's and its synonyms' image lists, "
                     "then Table 4's NDCG@10 / mAP / R@10 text→image and image→text with synonym-augmented ground truth, "
                     "each a mean over the queries (no intervals on the world). seeds is null: the VLM's, the STE's and "
                     "Γ_t's training seeds are their runs', not known to this command.")


def write_world_record(path: str | Path, results: dict, provenance_keys: dict, inputs: dict | None = None,
                       report: str | Path | None = None) -> Path:
    """The world report's Tables 3–4 (:func:`world_record_table`) as a record at ``path``, with ``provenance_keys``
    (:func:`grounding.docs_tables.provenance`), the models compared, the images and queries behind the rows, Γ_t's
    recovery error, the inputs and the report's path."""
    columns, labels, rows = world_record_table(results)
    return write_record(path, columns, rows, provenance_keys, title="SemCLIP on the embedded world (Tables 3–4)",
                        provenance_note=WORLD_RECORD_NOTE, labels=labels, systems=list(results["methods"]),
                        ks=list(results["ks"]), n_images=results["n_images"], splits=list(results["splits"]),
                        n_queries=results["n_queries"], n_pairs=results["n_pairs"], bank_size=results.get("bank_size"),
                        recovery=results.get("recovery") or {}, inputs=jsonable(inputs or {}),
                        report=None if report is None else str(report))


def jsonable(value):
    """``value`` as plain JSON data (a path or another object as its text)."""
    return json.loads(json.dumps(value, default=str))

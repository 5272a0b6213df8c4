"""Compound divergence and maximum-compound-divergence (MCD) evaluation splits (§5.1, App. B).

Atoms are primitives and compounds are predicates (lexical templates). Following Keysers et al.
(2020) and the released NQG code, the divergence of an evaluation set from a training set is
``D = 1 - C_alpha(P_train || P_eval)`` with the Chernoff coefficient
``C_alpha(P || Q) = sum_k p_k^alpha q_k^(1 - alpha)``, alpha = 0.1 for compounds and 0.5 for atoms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import scipy.sparse as sp

from grounding.utils.io import atomic_write_json

from .captions import MCD_CAPTIONS_PER_IMAGE, CaptionSet
from .concept_graph import ConceptGraph

COMPOUND_ALPHA = 0.1
ATOM_ALPHA = 0.5


def _dense(x) -> np.ndarray:
    return np.asarray(x.todense() if sp.issparse(x) else x, dtype=np.float64).ravel()


def chernoff_coefficient(p, q, alpha: float) -> float:
    """``sum_k p_k^alpha q_k^(1-alpha)`` of two count or probability vectors (normalised here)."""
    p, q = _dense(p), _dense(q)
    if p.shape != q.shape:
        raise ValueError(f"distributions over different supports: {p.shape} vs {q.shape}")
    if p.sum() <= 0 or q.sum() <= 0:
        raise ValueError("a distribution has no mass (empty set of atoms/compounds)")
    p, q = p / p.sum(), q / q.sum()
    both = (p > 0) & (q > 0)  # 0^a = 0 for 0 < a < 1: only the shared support contributes
    return float(np.sum(p[both] ** alpha * q[both] ** (1.0 - alpha)))


def divergence(train_counts, eval_counts, alpha: float) -> float:
    """``1 - C_alpha(P_train || P_eval)``: 0 for identical, 1 for disjoint distributions."""
    return 1.0 - chernoff_coefficient(train_counts, eval_counts, alpha)


def compound_divergence(train_counts, eval_counts) -> float:
    return divergence(train_counts, eval_counts, COMPOUND_ALPHA)


def atom_divergence(train_counts, eval_counts) -> float:
    return divergence(train_counts, eval_counts, ATOM_ALPHA)


def rowwise_divergence(train_counts, rows: sp.csr_matrix, alpha: float) -> np.ndarray:
    """Divergence of every row of a sparse count matrix (one candidate set per row) from train."""
    p = _dense(train_counts)
    p = p / p.sum()
    rows = sp.csr_matrix(rows, dtype=np.float64)
    totals = np.asarray(rows.sum(axis=1)).ravel()
    r = np.repeat(np.arange(rows.shape[0]), np.diff(rows.indptr))
    terms = p[rows.indices] ** alpha * (rows.data / np.maximum(totals[r], 1e-300)) ** (1.0 - alpha)
    sim = np.bincount(r, weights=terms, minlength=rows.shape[0])
    return np.where(totals > 0, 1.0 - sim, np.nan)


def removal_deltas(train_counts, image_counts: sp.csr_matrix, alpha: float = COMPOUND_ALPHA) -> tuple[float, np.ndarray]:
    """``CD_ALL`` and ``Delta_i = CD_i - CD_ALL`` (App. B) for every image i, where ``CD_i`` is the
    divergence of the candidate set with image i removed. Exact and vectorised: only the
    compounds present in image i change, so ``sum_k p_k^a c_k^(1-a)`` is updated per non-zero.
    """
    p = _dense(train_counts)
    p = p / p.sum()
    m = sp.csr_matrix(image_counts, dtype=np.float64)
    c = np.asarray(m.sum(axis=0)).ravel()
    n_total = c.sum()
    pa, b = p ** alpha, 1.0 - alpha
    s_all = float(np.sum(pa * c ** b))
    cd_all = 1.0 - s_all / n_total ** b
    r = np.repeat(np.arange(m.shape[0]), np.diff(m.indptr))
    k = m.indices
    change = pa[k] * (c[k] ** b - np.maximum(c[k] - m.data, 0.0) ** b)
    s_i = s_all - np.bincount(r, weights=change, minlength=m.shape[0])
    n_i = n_total - np.asarray(m.sum(axis=1)).ravel()
    with np.errstate(divide="ignore", invalid="ignore"):
        cd_i = np.where(n_i > 0, 1.0 - s_i / np.maximum(n_i, 1e-300) ** b, 1.0)
    return cd_all, cd_i - cd_all


def align_columns(train_vocab: Sequence[str], cand_vocab: Sequence[str]) -> tuple[np.ndarray, int]:
    """Map candidate column ids to a joint vocabulary (train's ids first, then new ones)."""
    index = {v: i for i, v in enumerate(train_vocab)}
    out = np.empty(len(cand_vocab), dtype=np.int64)
    n = len(index)
    for j, v in enumerate(cand_vocab):
        i = index.get(v)
        if i is None:
            i = index[v] = n
            n += 1
        out[j] = i
    return out, n


def _remap(m: sp.csr_matrix, cols: np.ndarray, width: int) -> sp.csr_matrix:
    m = sp.csr_matrix(m)
    return sp.csr_matrix((m.data, cols[m.indices], m.indptr), shape=(m.shape[0], width))


@dataclass
class MCDInputs:
    train_compounds: np.ndarray      # (V,) training compound counts in the joint vocabulary
    cand_compounds: sp.csr_matrix    # (n_kept, V) per-image compound counts of kept candidates
    train_atoms: np.ndarray
    cand_atoms: sp.csr_matrix
    kept: np.ndarray                 # candidate image rows kept (all primitives seen in training)
    dropped: int


def mcd_inputs(train: ConceptGraph, cand: ConceptGraph) -> MCDInputs:
    """Joint compound/atom count matrices; drops candidates with primitives unseen in training (App. B)."""
    cols, width = align_columns(train.predicate_template.tolist(), cand.predicate_template.tolist())
    train_c = np.zeros(width)
    train_c[: train.n_predicates] = np.asarray(train.image_compound_counts().sum(axis=0)).ravel()
    cand_c = _remap(cand.image_compound_counts(), cols, width)
    tr_text, ca_text = train.concept_text.tolist(), cand.concept_text.tolist()
    train_prims = [tr_text[i] for i in np.flatnonzero(train.concept_is_primitive)]
    prim_cols, a_width = align_columns(train_prims, ca_text)
    train_a = np.zeros(a_width)
    train_atoms_m = train.image_atom_counts()[:, np.flatnonzero(train.concept_is_primitive)]
    train_a[: len(train_prims)] = np.asarray(train_atoms_m.sum(axis=0)).ravel()
    cand_a = _remap(cand.image_atom_counts(), prim_cols, a_width)
    unseen = np.asarray(cand_a[:, len(train_prims):].sum(axis=1)).ravel() > 0
    has_compound = np.asarray(cand_c.sum(axis=1)).ravel() > 0
    kept = np.flatnonzero(~unseen & has_compound)
    return MCDInputs(train_c, cand_c[kept], train_a, cand_a[kept], kept, int(len(unseen) - len(kept)))


def tokens(raw: str) -> list[str]:
    return re.findall(r"[a-z0-9]+(?:'[a-z]+)?", raw.lower())


def write_karpathy_split(path: str | Path, captions: CaptionSet, images: Sequence[int], meta: dict | None = None,
                         captions_per_image: int | None = MCD_CAPTIONS_PER_IMAGE) -> Path:
    """Karpathy-layout JSON of the given images, every image split "test". Each image keeps its first
    ``captions_per_image`` captions in file order (§5.1: 1,000 images, 5,000 queries; COCO images with
    6-7 captions are capped); ``None`` keeps all."""
    if captions_per_image is not None and captions_per_image < 1:
        raise ValueError(f"captions_per_image must be >= 1 or None, got {captions_per_image}")
    out, sentid = [], 0
    for imgid, i in enumerate(images):
        name = captions.image_names[i]
        entry = {}
        if "/" in name:
            entry["filepath"], entry["filename"] = name.rsplit("/", 1)
        else:
            entry["filename"] = name
        entry["imgid"] = imgid
        if captions.image_ids is not None:
            entry["cocoid" if captions.dataset == "coco" else "source_id"] = int(captions.image_ids[i])
        entry["split"] = "test"
        sents = []
        for raw in captions.captions_of(i)[:captions_per_image]:
            sents.append({"raw": raw, "tokens": tokens(raw), "imgid": imgid, "sentid": sentid})
            sentid += 1
        entry["sentences"] = sents
        entry["sentids"] = [s["sentid"] for s in sents]
        out.append(entry)
    obj = {"images": out, "dataset": captions.dataset or "captions"}
    if meta:
        obj["mcd"] = meta
    return atomic_write_json(path, obj)


def sliding_windows(order: np.ndarray, k: int, stride: int) -> np.ndarray:
    """Start offsets of the windows of k consecutive ranked candidates (last window included)."""
    n = len(order)
    starts = np.arange(0, max(n - k, 0) + 1, max(stride, 1))
    if len(starts) and starts[-1] != max(n - k, 0):
        starts = np.append(starts, max(n - k, 0))
    return starts


def window_divergences(train_counts, ranked: sp.csr_matrix, starts: np.ndarray, k: int, alpha: float) -> np.ndarray:
    """Divergence of every window ``ranked[s:s+k]`` (sparse window-indicator product)."""
    n = ranked.shape[0]
    rows = np.repeat(np.arange(len(starts)), np.minimum(k, n - starts))
    cols = np.concatenate([np.arange(s, min(s + k, n)) for s in starts]) if len(starts) else np.zeros(0, np.int64)
    w = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(starts), n))
    return rowwise_divergence(train_counts, w @ ranked, alpha)


def make_mcd_splits(train: ConceptGraph, cand: ConceptGraph, cand_captions: CaptionSet, out_dir: str | Path,
                    k: int = 1000, stride: int | None = None, levels: int = 16, random_baselines: int = 20,
                    seed: int = 0, captions_per_image: int | None = MCD_CAPTIONS_PER_IMAGE) -> dict:
    """Write ``mcd.json`` (top-k by divergence contribution), ``graded/cd_*.json`` (sliding windows
    at evenly spaced divergences, Fig. 4) and ``summary.json``; return the summary. Split files hold
    each image's first ``captions_per_image`` captions (App. B counts compounds over an image's five
    captions: give ``cand`` built from ``cand_captions.first_captions(5)`` so the two agree)."""
    out_dir = Path(out_dir)
    inp = mcd_inputs(train, cand)
    n = len(inp.kept)
    if n < k:
        raise ValueError(f"only {n} candidate images remain after dropping {inp.dropped} with primitives unseen in "
                         f"training (or no predicates); cannot pick k={k}. Lower --k or give a larger candidate set.")
    cd_all, delta = removal_deltas(inp.train_compounds, inp.cand_compounds, COMPOUND_ALPHA)
    # Removing an image that pushes the set towards the training distribution raises CD
    # (Delta_i > 0); the images whose removal lowers CD most contribute most divergence.
    # Rank by ascending Delta_i (stable on ties by image order) and keep the top k.
    order = np.argsort(delta, kind="stable")
    ranked_c = inp.cand_compounds[order]
    ranked_a = inp.cand_atoms[order]
    top = order[:k]
    mcd_cd = compound_divergence(inp.train_compounds, inp.cand_compounds[top].sum(axis=0))
    mcd_ad = atom_divergence(inp.train_atoms, inp.cand_atoms[top].sum(axis=0))
    rng = np.random.default_rng(seed)
    random_sets = (np.stack([rng.choice(n, size=k, replace=False) for _ in range(random_baselines)])
                   if random_baselines else np.zeros((0, k), int))
    ind = sp.csr_matrix((np.ones(random_sets.size), (np.repeat(np.arange(len(random_sets)), k), random_sets.ravel())),
                        shape=(len(random_sets), n))
    random_cd = rowwise_divergence(inp.train_compounds, ind @ inp.cand_compounds, COMPOUND_ALPHA) if len(random_sets) else np.zeros(0)
    random_ad = rowwise_divergence(inp.train_atoms, ind @ inp.cand_atoms, ATOM_ALPHA) if len(random_sets) else np.zeros(0)

    images = inp.kept[top]
    meta = {"k": k, "captions_per_image": captions_per_image, "compound_divergence": mcd_cd, "atom_divergence": mcd_ad,
            "cd_all_candidates": cd_all}
    write_karpathy_split(out_dir / "mcd.json", cand_captions, images, meta, captions_per_image)

    stride = stride or max(1, k // 20)
    starts = sliding_windows(order, k, stride)
    win_cd = window_divergences(inp.train_compounds, ranked_c, starts, k, COMPOUND_ALPHA)
    win_ad = window_divergences(inp.train_atoms, ranked_a, starts, k, ATOM_ALPHA)
    graded = []
    if levels > 0 and len(starts):
        targets = np.linspace(np.nanmin(win_cd), np.nanmax(win_cd), levels)
        chosen = sorted({int(np.nanargmin(np.abs(win_cd - t))) for t in targets}, key=lambda w: -win_cd[w])
        for w in chosen:
            s = int(starts[w])
            imgs = inp.kept[order[s:s + k]]
            name = f"graded/cd_{win_cd[w]:.4f}_start{s}.json"
            write_karpathy_split(out_dir / name, cand_captions, imgs,
                                 {"k": k, "window_start": s, "compound_divergence": float(win_cd[w]), "atom_divergence": float(win_ad[w])},
                                 captions_per_image)
            graded.append({"file": name, "window_start": s, "compound_divergence": float(win_cd[w]), "atom_divergence": float(win_ad[w])})
    summary = {
        "k": k, "captions_per_image": captions_per_image,
        "candidates": int(cand.image_names.__len__()), "candidates_kept": int(n), "candidates_dropped": inp.dropped,
        "cd_all_candidates": cd_all, "mcd": {"file": "mcd.json", "compound_divergence": mcd_cd, "atom_divergence": mcd_ad},
        "random_splits": {"n": int(len(random_cd)), "compound_divergence": random_cd.tolist(), "atom_divergence": random_ad.tolist(),
                          "max_compound_divergence": float(random_cd.max()) if len(random_cd) else None},
        "mcd_beats_all_random": bool(len(random_cd) == 0 or mcd_cd > random_cd.max()),
        "windows": {"stride": stride, "n": int(len(starts)), "compound_divergence_min": float(np.nanmin(win_cd)) if len(starts) else None,
                    "compound_divergence_max": float(np.nanmax(win_cd)) if len(starts) else None},
        "graded": graded,
    }
    atomic_write_json(out_dir / "summary.json", summary, indent=2)
    return summary


# the record of a split (``mcd --record NAME``): a row per split, ``split`` naming its kind (mcd, all_candidates, random,
# graded); the random row is the mean over the random splits, with the sd (over the splits, as printed) and max
SUMMARY_LABELS = {"split": "split", "images": "images", "compound_divergence": "compound divergence",
                  "compound_divergence_sd": "± sd", "compound_divergence_max": "max", "atom_divergence": "atom divergence"}
SUMMARY_KEYS = ("k", "captions_per_image", "candidates", "candidates_kept", "candidates_dropped", "mcd_beats_all_random",
                "windows", "random_splits")


def summary_record_rows(summary: dict) -> list[dict]:
    """The rows of :func:`make_mcd_splits`' summary (``summary.json``): the MCD split, all kept candidates (their
    compound divergence), the random splits' mean (when there are any) and every graded split, in its order."""
    k, rnd = summary["k"], summary["random_splits"]
    rows = [{"split": "mcd", "file": summary["mcd"]["file"], "images": k,
             "compound_divergence": summary["mcd"]["compound_divergence"], "atom_divergence": summary["mcd"]["atom_divergence"]},
            {"split": "all_candidates", "file": None, "images": summary["candidates_kept"],
             "compound_divergence": summary["cd_all_candidates"], "atom_divergence": None}]
    if rnd["n"]:
        cd, ad = np.asarray(rnd["compound_divergence"], float), np.asarray(rnd["atom_divergence"], float)
        rows.append({"split": "random", "file": None, "images": k, "n": rnd["n"], "compound_divergence": float(cd.mean()),
                     "compound_divergence_sd": float(cd.std()), "compound_divergence_max": float(cd.max()),
                     "atom_divergence": float(ad.mean()), "atom_divergence_sd": float(ad.std())})
    rows += [{"split": "graded", "file": g["file"], "images": k, "window_start": g["window_start"],
              "compound_divergence": g["compound_divergence"], "atom_divergence": g["atom_divergence"]}
             for g in summary["graded"]]
    return rows

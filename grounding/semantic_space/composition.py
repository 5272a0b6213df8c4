"""Visually informed composition and nearest neighbours (VG-BERT §4.4, Table 2, Figs. 6/18,
App. B.3.4 Tables 8-11).

A query phrase ("striped horse") is embedded like a word (``[CLS] striped horse [SEP]``,
App. B) and compared by cosine similarity with every word of the vocabulary (the unique SemCat
words, 6,238); the target's rank is 1 + the number of vocabulary words more similar to the query
(so a target outside the vocabulary gets the rank it would have). Neighbour lists give the
top-k vocabulary words of a query word, the word itself excluded.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarities between rows of ``a`` (n, d) and rows of ``b`` (m, d): (n, m)."""
    return _unit(a) @ _unit(b).T


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of each row of ``a`` with the same row of ``b`` (n, d) x (n, d) -> (n,)."""
    return (_unit(a) * _unit(b)).sum(-1)


def query_ranks(query_emb: np.ndarray, target_emb: np.ndarray, vocab_emb: np.ndarray, queries: list[str],
                targets: list[str], vocabulary: list[str]) -> pd.DataFrame:
    """Table 2 for one model: cosine(query, target) and the target's rank among the vocabulary."""
    sims = cosine(query_emb, vocab_emb)                                   # (n_queries, |V|)
    target_sim = np.einsum("ij,ij->i", _unit(query_emb), _unit(target_emb))
    rank = 1 + (sims > target_sim[:, None] + 1e-9).sum(1)
    vocab = set(vocabulary)
    return pd.DataFrame(dict(query=queries, target=targets, cosine=target_sim, rank=rank,
                             target_in_vocabulary=[t in vocab for t in targets], vocabulary_size=len(vocabulary)))


def neighbours(query_emb: np.ndarray, queries: list[str], vocab_emb: np.ndarray, vocabulary: list[str],
               k: int = 15, exclude_self: bool = True) -> pd.DataFrame:
    """Top-``k`` vocabulary words by cosine similarity to each query (Tables 8-11)."""
    sims = cosine(query_emb, vocab_emb)
    index = {w: i for i, w in enumerate(vocabulary)}
    if exclude_self:
        rows = [index[q] for q in queries if q in index]
        sims[[i for i, q in enumerate(queries) if q in index], rows] = -np.inf
    top = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return pd.DataFrame([dict(query=q, rank=r + 1, word=vocabulary[j], cosine=float(sims[i, j]))
                         for i, q in enumerate(queries) for r, j in enumerate(top[i])])


def rank_table(query_vec_a: np.ndarray, query_vec_b: np.ndarray, vocab_a: np.ndarray, vocab_b: np.ndarray,
               vocabulary: list[str], target: str | None = None, top_n: int = 12) -> pd.DataFrame:
    """Data of a slope chart (Figs. 6, 18): the union of both models' top-``top_n`` words (and the
    target) with each word's cosine and rank before (a) and after (b)."""
    sa, sb = cosine(query_vec_a[None], vocab_a)[0], cosine(query_vec_b[None], vocab_b)[0]
    ra = np.empty(len(sa), int)
    ra[np.argsort(-sa, kind="stable")] = np.arange(1, len(sa) + 1)
    rb = np.empty(len(sb), int)
    rb[np.argsort(-sb, kind="stable")] = np.arange(1, len(sb) + 1)
    pick = set(np.flatnonzero(ra <= top_n)) | set(np.flatnonzero(rb <= top_n))
    if target is not None and target in vocabulary:
        pick.add(vocabulary.index(target))
    pick = sorted(pick, key=lambda i: ra[i])
    return pd.DataFrame(dict(word=[vocabulary[i] for i in pick], cosine_before=sa[pick], rank_before=ra[pick],
                             cosine_after=sb[pick], rank_after=rb[pick]))


def plot_slope(table: pd.DataFrame, query: str, names: tuple[str, str], path, target: str | None = None) -> None:
    """Slope chart: words listed by rank before (left) and after (right); orange lines for
    improved ranks, blue for worse, the target in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(table)
    left = table.sort_values("rank_before").reset_index(drop=True)
    right = table.sort_values("rank_after").reset_index(drop=True)
    ypos_l = {w: n - i for i, w in enumerate(left.word)}
    ypos_r = {w: n - i for i, w in enumerate(right.word)}
    fig, ax = plt.subplots(figsize=(6, 0.28 * n + 1.5))
    for _, row in table.iterrows():
        colour = "red" if row.word == target else ("tab:orange" if row.rank_after < row.rank_before else "tab:blue")
        ax.plot([0, 1], [ypos_l[row.word], ypos_r[row.word]], color=colour, lw=2 if row.word == target else 1)
    for _, row in left.iterrows():
        ax.text(-0.03, ypos_l[row.word], f"{row.cosine_before:.2f}  {row.word}  {row.rank_before}", ha="right",
                va="center", fontsize=7, color="red" if row.word == target else "black")
    for _, row in right.iterrows():
        ax.text(1.03, ypos_r[row.word], f"{row.rank_after}  {row.word}  {row.cosine_after:.2f}", ha="left",
                va="center", fontsize=7, color="red" if row.word == target else "black")
    ax.set_xlim(-1.0, 2.0)
    ax.set_ylim(0, n + 1.5)
    ax.text(-0.03, n + 1, f"{names[0]}\ncosine  word  rank", ha="right", fontsize=8, weight="bold")
    ax.text(1.03, n + 1, f"{names[1]}\nrank  word  cosine", ha="left", fontsize=8, weight="bold")
    ax.axis("off")
    ax.set_title(f"Similarity ranking: {query}" + (f" (target: {target})" if target else ""), pad=28)
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)

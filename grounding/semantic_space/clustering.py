"""How well words cluster by SemCat category (VG-BERT §4.3, App. B.3, Fig. 5).

The modified silhouette of Eqs. 12-14 with cosine distance d = 1 - cos: a(i) is the mean
distance from entry i to the other entries of its category, b(i) the mean over the other
N - 1 categories of the mean distance to each (the mean, not the minimum, because SemCat
categories overlap: mammal, bird and fish all sit inside animal), s(i) = (b - a) / max(a, b).
A category's score is the mean s(i) over its entries.

Vectorised: with unit-normalised rows u_i and category sums S_k = sum_{j in C_k} u_j, the mean
distance from i to category k is 1 - u_i . S_k / |C_k|, so the whole computation is one
(n x d) @ (d x N) product instead of an n x n distance matrix.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from grounding.semantic_space.property_norms import one_sided_wilcoxon, stars


def modified_silhouette(embeddings: np.ndarray, category_index: np.ndarray, n_categories: int | None = None) -> np.ndarray:
    """s(i) of Eqs. 12-14 for every entry; entries of single-word categories get NaN (a(i) undefined)."""
    x = np.asarray(embeddings, dtype=np.float64)
    u = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    k = np.asarray(category_index)
    K = int(k.max()) + 1 if n_categories is None else n_categories
    onehot = np.zeros((K, len(k)))
    onehot[k, np.arange(len(k))] = 1.0
    sizes = onehot.sum(1)
    sums = onehot @ u                                        # (K, d)
    mean_dist = 1.0 - (u @ sums.T) / np.maximum(sizes, 1)    # (n, K): mean distance to each category
    own = sizes[k]
    # Eq. 12: leave out j = i, whose distance to itself is 0 (mean over the other |C_i| - 1 entries).
    with np.errstate(invalid="ignore", divide="ignore"):
        a = mean_dist[np.arange(len(k)), k] * own / (own - 1)
    present = sizes > 0
    # Eq. 13: mean over the other (non-empty) categories of the mean distance to each.
    b = (mean_dist[:, present].sum(1) - mean_dist[np.arange(len(k)), k]) / (present.sum() - 1)
    s = (b - a) / np.maximum(a, b)
    s[own < 2] = np.nan
    return s


def per_category_mean(values: np.ndarray, category_index: np.ndarray, n_categories: int) -> np.ndarray:
    """The mean of per-entry values over each category's entries (NaN entries left out; NaN for empty ones)."""
    v = np.asarray(values, dtype=np.float64)
    k = np.asarray(category_index)
    ok = ~np.isnan(v)
    sums = np.bincount(k[ok], weights=v[ok], minlength=n_categories)
    counts = np.bincount(k[ok], minlength=n_categories)
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums / counts


def category_silhouettes(embeddings: np.ndarray, category_index: np.ndarray, categories: list[str]) -> pd.Series:
    s = modified_silhouette(embeddings, category_index, len(categories))
    return pd.Series(per_category_mean(s, category_index, len(categories)), index=categories, name="silhouette")


def nearest_category_correct(embeddings: np.ndarray, category_index: np.ndarray,
                             n_categories: int | None = None) -> np.ndarray:
    """Leave-one-out categorisation of each SemCat entry: 1.0 when the category whose members are closest on average
    (cosine, the entry itself left out of its own category, as Eq. 12's a(i)) is the entry's own, else 0.0; NaN
    for entries of single-word categories. SemCat categories overlap, so another category holding the same word
    can win: the measure is strict."""
    x = np.asarray(embeddings, dtype=np.float64)
    u = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    k = np.asarray(category_index)
    K = int(k.max()) + 1 if n_categories is None else n_categories
    sums = np.zeros((K, u.shape[1]))
    np.add.at(sums, k, u)
    sizes = np.bincount(k, minlength=K).astype(np.float64)
    rows = np.arange(len(k))
    similarity = u @ sums.T                                   # (n, K) summed cosine to each category
    similarity[rows, k] -= 1.0                                # leave the entry out of its own category
    count = np.broadcast_to(sizes, similarity.shape).copy()
    count[rows, k] -= 1
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, similarity / count, -np.inf)
    correct = (mean.argmax(1) == k).astype(np.float64)
    correct[sizes[k] < 2] = np.nan
    return correct


def compare(silhouettes: dict[str, pd.Series], top_k: int = 15) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Summary per model (mean/median, one-sided Wilcoxon vs the first model over categories) and
    the ``top_k`` categories gained by each later model relative to the first."""
    names = list(silhouettes)
    base = silhouettes[names[0]]
    rows, gains = [], []
    for name in names:
        s = silhouettes[name]
        ok = base.notna() & s.notna()
        p = np.nan if name == names[0] else one_sided_wilcoxon(base[ok].to_numpy(), s[ok].to_numpy())
        rows.append(dict(model=name, n_categories=int(s.notna().sum()), mean=float(s.mean()), median=float(s.median()),
                         p_greater_than_first=p, significance="" if name == names[0] else stars(p)))
        if name != names[0]:
            d = (s - base).dropna().sort_values(ascending=False).head(top_k)
            gains += [dict(model=name, rank=r + 1, category=c, gain=float(v), silhouette_first=float(base[c]),
                           silhouette_model=float(s[c])) for r, (c, v) in enumerate(d.items())]
    return pd.DataFrame(rows), pd.DataFrame(gains)


def plot(silhouettes: dict[str, pd.Series], gains: pd.DataFrame, path) -> None:
    """Fig. 5: box plot of category silhouettes per model; bars of the top categories gained."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(silhouettes)
    later = names[1:]
    fig, axes = plt.subplots(1, 1 + len(later), figsize=(3.5 + 4 * len(later), 4), squeeze=False)
    ax = axes[0, 0]
    ax.boxplot([silhouettes[n].dropna().to_numpy() for n in names], whis=1.5)
    ax.set_xticks(range(1, len(names) + 1), names, rotation=15)
    ax.set(ylabel="modified silhouette (per category)", title="Word categorisation (Fig. 5)")
    for ax, name in zip(axes[0, 1:], later):
        g = gains[gains.model == name]
        ax.barh(g.category[::-1], g.gain[::-1], color="tab:orange")
        ax.set(xlabel=f"silhouette gain: {name} - {names[0]}", title=f"top {len(g)} categories gained")
        ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)

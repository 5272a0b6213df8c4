"""The concrete-abstract axis of a semantic space (VG-BERT §4.1, Table 1, Fig. 3, App. B.1).

PCA over the SemCat embeddings; Pearson r between the first principal component and human
concreteness ratings (Brysbaert et al. 2014), at the word level (every rated SemCat entry) and
the category level (per category: mean PC1 vs mean rating over its rated entries), as in the
reference analysis. PC1's sign is arbitrary in PCA; it is fixed so that concrete is positive
(r >= 0 at the word level), which makes |r| the reported number and the figure comparable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats
from sklearn.decomposition import PCA


@dataclass
class ConcretenessResult:
    word_r: float
    word_p: float
    category_r: float
    category_p: float
    n_rated_entries: int
    explained_variance_ratio: np.ndarray   # of the first components
    categories: pd.DataFrame               # category, mean_pc1, mean_concreteness, std_concreteness, n_rated
    extremes: pd.DataFrame                 # pc, end ("top"/"bottom"), rank, word, score
    entry_scores: np.ndarray               # (n_entries, n_components) PCA scores, PC1 sign-fixed
    pc1_flipped: bool
    pca: PCA | None = None


def fit_pca(embeddings: np.ndarray, n_components: int | None = None, seed: int = 0) -> PCA:
    n = min(embeddings.shape) if n_components is None else min(n_components, *embeddings.shape)
    return PCA(n_components=n, svd_solver="full", random_state=seed).fit(embeddings)


def orient_pc1(scores: np.ndarray, ratings: np.ndarray) -> tuple[np.ndarray, bool]:
    """Flip the sign of column 0 if it correlates negatively with ``ratings`` (NaN = unrated).

    Returns the (possibly) flipped copy and whether it was flipped.
    """
    rated = ~np.isnan(ratings)
    r = np.corrcoef(scores[rated, 0], ratings[rated])[0, 1]
    out = scores.copy()
    if r < 0:
        out[:, 0] = -out[:, 0]
    return out, bool(r < 0)


def extreme_words(scores: np.ndarray, words: list[str], n_pcs: int = 6, k: int = 10) -> pd.DataFrame:
    """Top and bottom ``k`` words on each of the first ``n_pcs`` components (unique words)."""
    rows = []
    for pc in range(min(n_pcs, scores.shape[1])):
        order = np.argsort(-scores[:, pc], kind="stable")
        for end, idx in (("top", order[:k]), ("bottom", order[::-1][:k])):
            rows += [dict(pc=pc + 1, end=end, rank=r + 1, word=words[i], score=float(scores[i, pc]))
                     for r, i in enumerate(idx)]
    return pd.DataFrame(rows)


def concreteness_analysis(entry_embeddings: np.ndarray, entry_words: list[str], category_index: np.ndarray,
                          categories: list[str], ratings: dict[str, float], fit_on: str = "entries",
                          n_pcs_report: int = 6, k_extremes: int = 10, seed: int = 0) -> ConcretenessResult:
    """Table 1 numbers and Fig. 3 data for one model.

    ``entry_embeddings``: (n_entries, d) standardised embeddings of the SemCat entries in file
    order (a word listed in two categories appears twice). ``fit_on``: "entries" fits the PCA on
    all entries (the reference analysis keeps PCA scores per entry) or "unique" on unique words.
    """
    if fit_on not in ("entries", "unique"):
        raise ValueError(f"fit_on must be 'entries' or 'unique', got {fit_on!r}")
    uniq = list(dict.fromkeys(entry_words))
    first = {w: i for i, w in reversed(list(enumerate(entry_words)))}
    uniq_rows = np.asarray([first[w] for w in uniq])
    basis = entry_embeddings if fit_on == "entries" else entry_embeddings[uniq_rows]
    pca = fit_pca(basis, seed=seed)
    scores = pca.transform(entry_embeddings)
    conc = np.asarray([ratings.get(w, np.nan) for w in entry_words], dtype=np.float64)
    rated = ~np.isnan(conc)
    if rated.sum() < 3:
        raise ValueError(f"only {int(rated.sum())} SemCat entries have a concreteness rating; need at least 3.")
    scores, flipped = orient_pc1(scores, conc)
    word_r, word_p = stats.pearsonr(scores[rated, 0], conc[rated])

    # Category level: mean PC1 and mean rating over each category's rated entries (vectorised).
    K = len(categories)
    ci = category_index[rated]
    n_rated = np.bincount(ci, minlength=K).astype(float)
    sum_pc1 = np.bincount(ci, weights=scores[rated, 0], minlength=K)
    sum_c = np.bincount(ci, weights=conc[rated], minlength=K)
    sum_c2 = np.bincount(ci, weights=conc[rated] ** 2, minlength=K)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_pc1, mean_c = sum_pc1 / n_rated, sum_c / n_rated
        std_c = np.sqrt(np.maximum(sum_c2 / n_rated - mean_c ** 2, 0))
    ok = n_rated > 0
    cat_r, cat_p = stats.pearsonr(mean_pc1[ok], mean_c[ok]) if ok.sum() >= 3 else (np.nan, np.nan)
    cat_df = pd.DataFrame(dict(category=categories, mean_pc1=mean_pc1, mean_concreteness=mean_c,
                               std_concreteness=std_c, n_rated=n_rated.astype(int)))
    extremes = extreme_words(scores[uniq_rows], uniq, n_pcs=n_pcs_report, k=k_extremes)
    return ConcretenessResult(float(word_r), float(word_p), float(cat_r), float(cat_p), int(rated.sum()),
                              pca.explained_variance_ratio_[:n_pcs_report], cat_df, extremes, scores, flipped, pca)


def plot_categories(results: dict[str, ConcretenessResult], path, label_categories: list[str] | None = None) -> None:
    """Fig. 3 (left) per model: categories on PC1 (x) vs mean concreteness (y), colour = mean
    rating, size ~ rating std, least-squares line with r."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 4), squeeze=False)
    for ax, (name, res) in zip(axes[0], results.items()):
        df = res.categories[res.categories.n_rated > 0]
        x, y = df.mean_pc1.to_numpy(), df.mean_concreteness.to_numpy()
        sc = ax.scatter(x, y, s=40 * df.std_concreteness.to_numpy() + 2, c=y, cmap="jet", vmin=1.5, vmax=5)
        m, b = np.polyfit(x, y, 1)
        xs = np.linspace(x.min(), x.max(), 2)
        ax.plot(xs, m * xs + b, color="grey", alpha=0.6, label=f"r = {res.category_r:.4f}")
        for cat in label_categories or []:
            row = df[df.category == cat]
            if len(row):
                ax.annotate(cat, (row.mean_pc1.iloc[0], row.mean_concreteness.iloc[0]), fontsize=6)
        ax.set(xlabel="principal axis 1 (category mean)", ylabel="human concreteness rating", ylim=(1.5, 5),
               title=name)
        ax.legend(loc="upper left", fontsize=8)
    fig.colorbar(sc, ax=axes[0].tolist(), shrink=0.8, label="mean concreteness")
    fig.suptitle("Abstract-concrete axis (Fig. 3)")
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)

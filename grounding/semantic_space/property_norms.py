"""Reading human property norms out of a semantic space (VG-BERT §4.2, App. B.2, Fig. 4).

For each CSLB binary feature (>= 5 positive concepts, pf >= 5: 390 features in five types), an
L1-regularised logistic regression (Eq. 8) predicts the feature from the concepts' embeddings
projected onto principal axes. The regularisation weight lambda is chosen on a grid by
leave-one-out (Eqs. 9-10), the model is refitted on all concepts, and the F1 score (Eq. 11) is
reported; F1 = 0 means "not predictable". Models are compared per feature with a one-sided
Wilcoxon signed-rank test.

Reading of Eq. 10. As printed, L_ij sums the LOO model's log-likelihood over the words it was
trained on (k != j); that quantity is monotone in lambda (maximal at lambda -> 0, minimal at
lambda -> infinity), so it cannot select lambda. We use what leave-one-out cross-validation
measures: the held-out word j scored by the model trained without it, with the class weights
1/|P| and 1/|N| of Eq. 10 so both classes count equally:
    L(lambda) = sum_{j in P} -log p_{lambda,-j}(y=1|x_j)/|P| + sum_{j in N} -log p_{lambda,-j}(y=0|x_j)/|N|.
Ties go to the larger lambda (the sparser model).

Leave-one-out is computed exactly (one refit per held-out concept: 638 fits per lambda) or, by
default, with the approximate leave-one-out of Rad & Maleki (2020, JRSS-B) for L1-regularised
GLMs, which needs only the full fit: on the active set A (non-zero weights and intercept),
H = X_A (X_A^T D X_A)^-1 X_A^T with D = diag(p(1-p)), and the held-out margin is
eta_j + H_jj (p_j - y_j) / (1 - H_jj p_j (1 - p_j)). The benchmark compares the two.

The intercept is not penalised (Eq. 7 absorbs a bias into w), so the all-zero model predicts the
base rate (all negative) and an unreadable feature scores F1 = 0 rather than "all positive".
"""

from __future__ import annotations

import re
import time
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
import sklearn
from scipy import stats
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score

from data_modules.lexical import CSLB_FEATURE_TYPES

_EPS = 1e-12


def lambda_grid(X: np.ndarray, y: np.ndarray, n_lambdas: int = 16, min_ratio: float = 1e-3) -> np.ndarray:
    """Descending grid from lambda_max (the smallest lambda whose solution is all-zero weights with an
    unpenalised intercept: ||X^T (y - mean(y))||_inf for the summed loss of Eq. 8) down to
    ``min_ratio * lambda_max``, log-spaced."""
    lam_max = float(np.abs(X.T @ (y - y.mean())).max())
    return lam_max * np.logspace(0, np.log10(min_ratio), n_lambdas)


def l1_penalty_args(version: str = sklearn.__version__) -> dict:
    """The L1 penalty in the spelling of the installed scikit-learn: ``penalty="l1"`` before 1.8 (where
    ``l1_ratio`` alone is ignored and the default penalty is L2), ``l1_ratio=1.0`` from 1.8 on (where ``penalty``
    is deprecated)."""
    major, minor = (int(part) for part in re.findall(r"\d+", version)[:2])
    return {"l1_ratio": 1.0} if (major, minor) >= (1, 8) else {"penalty": "l1"}


def _model(lam: float, max_iter: int, tol: float) -> LogisticRegression:
    # liblinear's L1 solver (newGLMNET) gives exact zeros; Eq. 8's lambda is 1/C. The intercept is
    # a constant feature with a large scale so that its L1 penalty is negligible (unpenalised).
    return LogisticRegression(**l1_penalty_args(), C=1.0 / lam, solver="liblinear", intercept_scaling=100.0,
                              max_iter=max_iter, tol=tol)


def _fit(X, y, lam, max_iter=1000, tol=1e-4):
    m = _model(lam, max_iter, tol)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        m.fit(X, y)
    return m.coef_.ravel().copy(), float(m.intercept_[0])


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-np.clip(z, -50, 50)))


def approximate_loo_margins(X: np.ndarray, y: np.ndarray, w: np.ndarray, b: float) -> np.ndarray:
    """Approximate leave-one-out margins (Rad & Maleki 2020) of an L1-logistic fit (w, b)."""
    eta = X @ w + b
    p = _sigmoid(eta)
    active = np.flatnonzero(w)
    XA = np.hstack([X[:, active], np.ones((len(X), 1))])
    d = p * (1 - p)
    G = XA.T @ (XA * d[:, None])
    G[np.diag_indices_from(G)] += 1e-8 * max(np.trace(G) / len(G), 1e-12)  # separable fits: d -> 0
    h = np.einsum("ij,ji->i", XA, np.linalg.solve(G, XA.T))  # H_jj
    return eta + h * (p - y) / np.maximum(1 - h * d, 1e-6)


def exact_loo_margins(X: np.ndarray, y: np.ndarray, lam: float, max_iter: int = 1000, tol: float = 1e-4) -> np.ndarray:
    """Held-out margins from one refit per left-out sample."""
    out = np.empty(len(y))
    keep = np.ones(len(y), dtype=bool)
    for j in range(len(y)):
        keep[j] = False
        w, b = _fit(X[keep], y[keep], lam, max_iter, tol)
        keep[j] = True
        out[j] = X[j] @ w + b
    return out


def balanced_loo_loss(margins: np.ndarray, y: np.ndarray) -> float:
    """The class-balanced held-out negative log-likelihood (our reading of Eqs. 9-10)."""
    # -log sigma(m) = logaddexp(0, -m): stable for large margins.
    nll = np.where(y == 1, np.logaddexp(0, -margins), np.logaddexp(0, margins))
    return float(nll[y == 1].mean() + nll[y == 0].mean())


@dataclass
class FeatureFit:
    lambdas: np.ndarray
    loo_loss: np.ndarray
    best: int
    f1: float          # Eq. 11, model refitted on all concepts at the chosen lambda (paper's protocol)
    loo_f1: float      # F1 of the held-out predictions at the chosen lambda (out-of-sample)
    n_active: int
    seconds: float = 0.0

    @property
    def lam(self) -> float:
        return float(self.lambdas[self.best])


def fit_feature(X: np.ndarray, y: np.ndarray, lambdas: np.ndarray | None = None, loo: str = "approx",
                n_lambdas: int = 16, min_ratio: float = 1e-3, patience: int | None = 3, max_iter: int = 1000,
                tol: float = 1e-4) -> FeatureFit:
    """Select lambda by leave-one-out on the grid, then report F1 of the all-data fit at that lambda.

    The grid is walked from the largest lambda down; with ``patience`` the walk stops once the LOO
    loss has not improved for that many steps (the small-lambda fits are the slow, over-fitted
    ones); unevaluated grid points get a NaN loss.
    """
    t0 = time.perf_counter()
    y = np.asarray(y).astype(int)
    if y.min() == y.max():
        raise ValueError("a feature needs both positive and negative concepts")
    lambdas = lambda_grid(X, y, n_lambdas, min_ratio) if lambdas is None else np.asarray(lambdas, dtype=float)
    losses, fits, loo_margins = [], [], []
    for i, lam in enumerate(lambdas):
        if patience is not None and losses and i - 1 - int(np.argmin(losses)) >= patience:
            break
        w, b = _fit(X, y, lam, max_iter, tol)
        if loo == "approx":
            m = approximate_loo_margins(X, y, w, b)
        elif loo == "exact":
            m = exact_loo_margins(X, y, lam, max_iter, tol)
        else:
            raise ValueError(f"loo must be 'approx' or 'exact', got {loo!r}")
        losses.append(balanced_loo_loss(m, y))
        fits.append((w, b))
        loo_margins.append(m)
    losses = np.concatenate([losses, np.full(len(lambdas) - len(losses), np.nan)])
    best = int(np.flatnonzero(losses <= np.nanmin(losses) + 1e-12)[0])  # descending grid: ties -> larger lambda
    w, b = fits[best]
    pred = (X @ w + b) > 0
    return FeatureFit(lambdas, losses, best, float(f1_score(y, pred, zero_division=0)),
                      float(f1_score(y, loo_margins[best] > 0, zero_division=0)), int(np.count_nonzero(w)),
                      time.perf_counter() - t0)


def _fit_columns(X, Y, columns, kwargs):
    return [fit_feature(X, Y[:, j], **kwargs) for j in columns]


def fit_all_features(X: np.ndarray, Y: np.ndarray, n_jobs: int = 1, **kwargs) -> list[FeatureFit]:
    """``fit_feature`` for every column of ``Y`` (n_concepts, n_features), in ``n_jobs`` processes."""
    cols = np.arange(Y.shape[1])
    if n_jobs == 1:
        return _fit_columns(X, Y, cols, kwargs)
    from joblib import Parallel, delayed

    n_workers = n_jobs if n_jobs > 0 else max(1, __import__("os").cpu_count() or 1)
    chunks = np.array_split(cols, max(1, 4 * n_workers))  # a few chunks per worker: balance and low overhead
    parts = Parallel(n_jobs=n_jobs)(delayed(_fit_columns)(X, Y, c, kwargs) for c in chunks if len(c))
    return [f for part in parts for f in part]


# --------------------------------------------------------------------------------------------
# Summaries across models
# --------------------------------------------------------------------------------------------
def results_frame(features: list[str], feature_types: list[str], fits: list[FeatureFit], n_positive: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame(dict(feature=features, feature_type=feature_types, n_positive=n_positive,
                             lam=[f.lam for f in fits], lambda_index=[f.best for f in fits],
                             f1=[f.f1 for f in fits], loo_f1=[f.loo_f1 for f in fits],
                             n_active=[f.n_active for f in fits], loo_loss=[float(f.loo_loss[f.best]) for f in fits]))


def one_sided_wilcoxon(a: np.ndarray, b: np.ndarray) -> float:
    """p-value of the one-sided Wilcoxon signed-rank test that ``b`` > ``a`` (paired); NaN when
    every pair is tied (zero differences are dropped, Wilcoxon's convention)."""
    d = np.asarray(b, float) - np.asarray(a, float)
    if np.count_nonzero(d) == 0:
        return float("nan")
    return float(stats.wilcoxon(b, a, alternative="greater", zero_method="wilcox").pvalue)


def summarise(frames: dict[str, pd.DataFrame], metric: str = "f1") -> pd.DataFrame:
    """Per model and feature type: count, mean/median F1, features not predictable (F1 = 0), and
    the one-sided Wilcoxon p-value of "this model > the first model"."""
    names = list(frames)
    base = frames[names[0]]
    rows = []
    for name in names:
        df = frames[name]
        for ftype in (*CSLB_FEATURE_TYPES, "all"):
            sel = np.ones(len(df), bool) if ftype == "all" else (df.feature_type == ftype).to_numpy()
            if not sel.any():
                continue
            vals = df[metric].to_numpy()[sel]
            p = np.nan if name == names[0] else one_sided_wilcoxon(base[metric].to_numpy()[sel], vals)
            rows.append(dict(model=name, feature_type=ftype, n_features=int(sel.sum()), mean=float(vals.mean()),
                             median=float(np.median(vals)), not_predictable=int((vals == 0).sum()),
                             p_greater_than_first=p))
    return pd.DataFrame(rows)


def stars(p: float) -> str:
    if not np.isfinite(p):
        return "n/a"
    return "****" if p < 1e-4 else "***" if p < 1e-3 else "**" if p < 1e-2 else "*" if p < 0.05 else "n.s."


def plot_f1_boxes(frames: dict[str, pd.DataFrame], summary: pd.DataFrame, path, metric: str = "f1") -> None:
    """Fig. 4: F1 per feature type, one box per model (whiskers 1.5 IQR), stars vs the first model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(frames)
    types = [t for t in CSLB_FEATURE_TYPES if any((df.feature_type == t).any() for df in frames.values())]
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(2.0 * len(types) + 2, 4))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for m, name in enumerate(names):
        df = frames[name]
        data = [df.loc[df.feature_type == t, metric].to_numpy() for t in types]
        pos = np.arange(len(types)) + (m - (len(names) - 1) / 2) * width
        bp = ax.boxplot(data, positions=pos, widths=width * 0.9, whis=1.5, patch_artist=True, showfliers=True,
                        flierprops=dict(markersize=2))
        for patch in bp["boxes"]:
            patch.set_facecolor(colours[m % len(colours)])
            patch.set_alpha(0.6)
        ax.plot([], [], color=colours[m % len(colours)], lw=6, alpha=0.6, label=name)
        if m > 0:
            for i, t in enumerate(types):
                row = summary[(summary.model == name) & (summary.feature_type == t)]
                ax.text(pos[i], 1.03, stars(float(row.p_greater_than_first.iloc[0])), ha="center", fontsize=7)
    ax.set_xticks(np.arange(len(types)), types, rotation=15)
    ax.set(ylabel=f"{metric.upper().replace('_', ' ')} score", ylim=(-0.03, 1.1),
           title="Predicting CSLB property norms (Fig. 4)")
    ax.legend(fontsize=8, loc="upper right", bbox_to_anchor=(1.0, 0.95))
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)

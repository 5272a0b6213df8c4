"""SemCLIP timings, side by side from one run (2-core CPU numbers go in the README).

  python benchmarks/bench_semclip.py [--lists data/semclip/similarity_lists_wordnet.npz] [--steps 5]

1. Wu–Palmer: NLTK's ``Synset.wup_similarity`` vs the cached WordNetNounGraph (same numbers).
2. STE step on the full noun vocabulary (batch 800, encoding 300): sparse embedding + SparseAdam
   vs a dense embedding with one Adam (the paper's plain setup).
3. SemCLIP store index: query latency at 10k and 100k items (300-d STE space), exact torch matmul
   vs FAISS (IndexFlatIP, exact too, when faiss-cpu is installed: `pip install -e '.[ann]'`).

  python benchmarks/bench_semclip.py --only-index [--index-sizes 10000 100000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from data_modules.similarity_lists import SimilarityListCollator
from data_modules.wordnet_lists import SimilarityLists, WordNetNounGraph
from grounding.semclip.alignment import SemanticIndex
from grounding.semclip.ste import SemanticTextEmbedding, STEEncoder


def bench_wup(n_pairs: int = 300):
    t = time.perf_counter()
    graph = WordNetNounGraph()
    build = time.perf_counter() - t
    rng = np.random.default_rng(0)
    pairs = [(int(i), int(j)) for i, j in rng.integers(0, len(graph.synsets), (n_pairs, 2))]
    t = time.perf_counter()
    ref = [graph.synsets[i].wup_similarity(graph.synsets[j]) for i, j in pairs]
    t_nltk = time.perf_counter() - t
    t = time.perf_counter()
    ours = [graph.wup(i, j) for i, j in pairs]
    t_ours = time.perf_counter() - t
    assert np.allclose(ref, ours)
    print(f"graph build {build:.1f}s | wup per pair: nltk {1e6 * t_nltk / n_pairs:.0f} us, graph {1e6 * t_ours / n_pairs:.0f} us "
          f"(x{t_nltk / max(t_ours, 1e-9):.1f})")


def bench_ste(lists_path: str, steps: int):
    lists = SimilarityLists.load(lists_path)
    collate = SimilarityListCollator(lists)
    rows = np.flatnonzero(np.diff(lists.indptr) > 0)
    batches = [collate(np.random.default_rng(s).choice(rows, 800, replace=False).tolist()) for s in range(steps + 1)]
    print(f"vocabulary {len(lists.vocab)}, {len(rows)} anchors -> {int(np.ceil(len(rows) / 800))} steps an epoch; "
          f"mean candidates a step {np.mean([len(b['candidates']) for b in batches]):.0f}")
    results = {}
    for sparse in (True, False):
        torch.manual_seed(0)
        m = SemanticTextEmbedding(STEEncoder(len(lists.vocab), encoding_size=300, sparse=sparse))
        enc = m.model
        if sparse:
            opts = [torch.optim.SparseAdam(list(enc.embedding.parameters()), lr=1e-2),
                    torch.optim.Adam(list(enc.encoder.parameters()) + list(enc.projection.parameters()), lr=1e-3)]
        else:
            opts = [torch.optim.Adam(enc.parameters(), lr=1e-3)]
        times = []
        for b in batches:
            t = time.perf_counter()
            for o in opts:
                o.zero_grad()
            m.batch_loss(b).backward()
            for o in opts:
                o.step()
            times.append(time.perf_counter() - t)
        results[sparse] = float(np.median(times[1:]))  # first step warms allocators / Adam state
        print(f"{'sparse + SparseAdam' if sparse else 'dense Adam          '}: {results[sparse]:.2f} s/step, "
              f"{results[sparse] * np.ceil(len(rows) / 800) / 60:.1f} min/epoch")
    print(f"dense / sparse step time: x{results[False] / results[True]:.2f}")


def bench_index(sizes=(10_000, 100_000), dim: int = 300, n_queries: int = 64, k: int = 10, repeats: int = 5):
    """Median latency of a batch of ``n_queries`` top-k queries per backend, build time, and the
    approximate backends' recall@k against the exact torch result."""

    try:
        import faiss  # noqa: F401
        backends = ["torch", "faiss", "faiss-ivf", "faiss-hnsw"]
    except ImportError:
        backends = ["torch"]
        print("faiss-cpu not installed: exact torch only (pip install -e '.[ann]' for the FAISS rows)")
    g = torch.Generator().manual_seed(0)
    print(f"\nSemCLIP index: {n_queries} queries x top-{k}, d={dim}, unit vectors, median of {repeats} "
          f"({torch.get_num_threads()} threads)")
    print(f"{'items':>8} {'backend':>11} {'build s':>8} {'ms/batch':>9} {'ms/query':>9} {'vs torch':>9} {'recall@' + str(k):>9}")
    for n in sizes:
        # SemCLIP-like data: images sit on the transforms of their nearest bank texts (Eq. 7), so the
        # collection is clustered: n/10 text vectors, items and queries near them (plus small noise).
        centers = torch.randn(max(1, n // 10), dim, generator=g)
        items = centers[torch.randint(len(centers), (n,), generator=g)] + 0.1 * torch.randn(n, dim, generator=g)
        queries = centers[torch.randint(len(centers), (n_queries,), generator=g)] + 0.1 * torch.randn(n_queries, dim, generator=g)
        exact = None
        for b in backends:
            t0 = time.perf_counter()
            index = SemanticIndex(items, backend=b)
            build = time.perf_counter() - t0
            index.search(queries[:2], k)  # warm-up
            runs = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                _, top = index.search(queries, k)
                runs.append(time.perf_counter() - t0)
            t = float(np.median(runs))
            if b == "torch":
                exact, t_torch = top, t
            recall = (top[:, :, None] == exact[:, None, :]).any(-1).float().mean().item()
            print(f"{n:>8} {b:>11} {build:>8.2f} {1e3 * t:>9.2f} {1e3 * t / n_queries:>9.3f} "
                  f"{'x%.2f' % (t_torch / t):>9} {recall:>9.3f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--lists", default="data/semclip/similarity_lists_wordnet.npz")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--skip-wup", action="store_true")
    p.add_argument("--only-index", action="store_true", help="run only the SemCLIP index benchmark")
    p.add_argument("--index-sizes", nargs="+", type=int, default=[10_000, 100_000])
    a = p.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    if not a.only_index:
        if not a.skip_wup:
            bench_wup()
        bench_ste(a.lists, a.steps)
    bench_index(a.index_sizes)

"""SemCLIP timings, side by side from one run (2-core CPU numbers go in the README).

  python benchmarks/bench_semclip.py [--lists data/semclip/similarity_lists_wordnet.npz] [--steps 5] [--record NAME]

1. Wu–Palmer: NLTK's ``Synset.wup_similarity`` vs the cached WordNetNounGraph (same numbers).
2. STE step on the full noun vocabulary (batch 800, encoding 300): sparse embedding + SparseAdam
   vs a dense embedding with one Adam (the paper's plain setup).
2b. STE fit time per epoch, the suite's path against the earlier dense path (restated below: the
   dense B x C Y and Eq. 3 through log_softmax, nn.Embedding's sparse autograd + torch's SparseAdam,
   MKL GEMMs, 2000 validation anchors, the best checkpoint with optimizer state and the vocabulary
   pickled as a list): training steps interleaved old/new in one process (median), plus one
   validation pass and one epoch's checkpoint writes each; wall and CPU seconds, and the ratio.
3. SemCLIP store index: query latency at 10k and 100k items (300-d STE space), exact torch matmul
   vs FAISS (IndexFlatIP, exact too, when faiss-cpu is installed: `pip install -e '.[ann]'`).

  python benchmarks/bench_semclip.py --only-index [--index-sizes 10000 100000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from table_record import add_record_option, write_table_record

from data_modules.similarity_lists import SimilarityListCollator
from data_modules.wordnet_lists import SimilarityLists, WordNetNounGraph
from grounding.semclip.alignment import SemanticIndex
from grounding.semclip.ste import SemanticTextEmbedding, STEEncoder
from grounding.semclip.ste_loss import multi_positive_contrastive_loss

# the record's columns (--record): a row per printed measurement, its benchmark in "section"; ratio: the printed "x..."
TABLE = [("section", "section"), ("method", "method"), ("items", "items"), ("value", "value"), ("unit", "unit"),
         ("ratio", "ratio"), ("build_s", "build s"), ("recall", "recall@k")]


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
    return report_wup(n_pairs, build, t_nltk, t_ours)


def report_wup(n_pairs: int, build: float, t_nltk: float, t_ours: float) -> list[dict]:
    """Print the Wu–Palmer timings (seconds over ``n_pairs`` pairs); the record's rows (NLTK, then the graph)."""
    print(f"graph build {build:.1f}s | wup per pair: nltk {1e6 * t_nltk / n_pairs:.0f} us, graph {1e6 * t_ours / n_pairs:.0f} us "
          f"(x{t_nltk / max(t_ours, 1e-9):.1f})")
    return [{"section": "wup", "method": "nltk Synset.wup_similarity", "items": n_pairs, "value": 1e6 * t_nltk / n_pairs,
             "unit": "us/pair"},
            {"section": "wup", "method": "WordNetNounGraph.wup", "items": n_pairs, "value": 1e6 * t_ours / n_pairs,
             "unit": "us/pair", "ratio": t_nltk / max(t_ours, 1e-9), "build_s": build}]


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
    return report_ste(results, len(lists.vocab), len(rows), float(np.mean([len(b["candidates"]) for b in batches])))


def report_ste(results: dict[bool, float], vocabulary: int, anchors: int, mean_candidates: float) -> list[dict]:
    """Print the STE step times (``results``: sparse? -> median seconds a step); the record's rows (sparse, dense)."""
    per_epoch, out = int(np.ceil(anchors / 800)), []
    for sparse in (True, False):
        print(f"{'sparse + SparseAdam' if sparse else 'dense Adam          '}: {results[sparse]:.2f} s/step, "
              f"{results[sparse] * per_epoch / 60:.1f} min/epoch")
        out.append({"section": "ste step", "method": "sparse + SparseAdam" if sparse else "dense Adam", "items": 800,
                    "value": results[sparse], "unit": "s/step", "min_per_epoch": results[sparse] * per_epoch / 60,
                    "vocabulary": vocabulary, "anchors": anchors, "steps_per_epoch": per_epoch,
                    "mean_candidates": mean_candidates})
    print(f"dense / sparse step time: x{results[False] / results[True]:.2f}")
    out[-1]["ratio"] = results[False] / results[True]
    return out


class _Clock:
    """Wall and CPU (process) seconds of a block: on a shared machine the CPU seconds are the steadier."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


class _OldSTEPath:
    """The STE fit's earlier dense path, restated: dense Y (B x C), Eq. 3 through log_softmax
    (multi_positive_contrastive_loss), nn.Embedding(sparse=True) autograd + torch.optim.SparseAdam,
    nn.Linear/ReLU (MKL sgemm), validation on 2000 anchors with torch matmul, the best checkpoint
    with optimizer state, the vocabulary pickled as a list."""

    val_anchors = 2000

    def __init__(self, lists, model):
        self.m, self.enc, self.lists = model, model.model, lists
        self.collate = SimilarityListCollator(lists, dense_targets=True)
        self.opts = [torch.optim.SparseAdam(list(self.enc.embedding.parameters()), lr=1e-2),
                     torch.optim.Adam(list(self.enc.encoder.parameters()) + list(self.enc.projection.parameters()), lr=1e-3)]

    def z(self, ids):
        return self.enc.projection(self.enc.encoder(self.enc.embedding(ids)))

    def step(self, rows):
        b = self.collate(rows.tolist())
        for o in self.opts:
            o.zero_grad()
        z = self.z(b["candidates"])
        multi_positive_contrastive_loss(z[b["anchor_position"]], z, b["targets"], 0.05,
                                        anchor_position=b["anchor_position"]).backward()
        for o in self.opts:
            o.step()

    @torch.no_grad()
    def validate(self, rows):
        ids = torch.arange(len(self.lists.vocab))
        vectors = torch.nn.functional.normalize(torch.cat([self.enc.encoder(self.enc.embedding(c)) for c in ids.split(16384)]), dim=-1)
        for part in np.array_split(rows, int(np.ceil(len(rows) / 800))):
            b = self.collate(part.tolist())
            z = self.z(b["candidates"])
            multi_positive_contrastive_loss(z[b["anchor_position"]], z, b["targets"], 0.05, anchor_position=b["anchor_position"])
            sims = vectors[b["anchors"]] @ vectors.T
            sims.topk(10, dim=-1)

    def checkpoints(self, folder):
        full = {"state_dict": self.m.state_dict(), "optimizer_states": [o.state_dict() for o in self.opts],
                "ste_vocab": list(self.lists.vocab)}
        torch.save(full, f"{folder}/best.ckpt")
        torch.save(full, f"{folder}/last.ckpt")


class _NewSTEPath:
    """The suite's path: SemanticTextEmbedding.training_step (row gather, Eq. 3 in list form, oneDNN
    GEMMs, RowSparseAdam) and its validation_step / checkpoint hooks, without a Trainer."""

    val_anchors = 800

    def __init__(self, lists, model):
        self.m, self.lists = model, lists
        self.collate = SimilarityListCollator(lists)
        self.opts = model.configure_optimizers()
        model.optimizers = lambda: self.opts  # the LightningModule's hooks without a Trainer
        model.manual_backward = lambda loss: loss.backward()
        model.log = lambda *a, **k: None
        model.vocab = lists.vocab

    def step(self, rows):
        self.m.training_step(self.collate(rows), 0)

    @torch.no_grad()
    def validate(self, rows):
        self.m.on_validation_epoch_start()
        for i, part in enumerate(np.array_split(rows, int(np.ceil(len(rows) / 800)))):
            self.m.validation_step(self.collate(part), i)
        self.m.on_validation_epoch_end()

    def checkpoints(self, folder):
        full = {"state_dict": self.m.state_dict(), "optimizer_states": [o.state_dict() for o in self.opts]}
        self.m.on_save_checkpoint(full)
        torch.save({k: v for k, v in full.items() if k != "optimizer_states"}, f"{folder}/best.ckpt")  # weights only
        torch.save(full, f"{folder}/last.ckpt")


def bench_ste_epoch(lists_path: str, steps: int, epochs: int = 10):
    """s/epoch of the STE fit, old path vs new, measured side by side (see the module docstring)."""
    import os
    import tempfile

    lists = SimilarityLists.load(lists_path)
    rows = np.flatnonzero(np.diff(lists.indptr) > 0)
    per_epoch = int(np.ceil(len(rows) / 800))
    order = np.random.default_rng(0).permutation(rows)
    paths = {}
    for name, cls in (("old", _OldSTEPath), ("new", _NewSTEPath)):
        torch.manual_seed(0)
        paths[name] = cls(lists, SemanticTextEmbedding(STEEncoder(len(lists.vocab), encoding_size=300), embedding_lr=1e-2))
    load = os.getloadavg()[0]
    print(f"\nSTE fit per epoch: {len(rows)} anchors, batch 800 -> {per_epoch} steps; {torch.get_num_threads()} threads, "
          f"load average {load:.1f} on {os.cpu_count()} CPUs")
    wall, cpu = {k: [] for k in paths}, {k: [] for k in paths}
    for s in range(steps + 1):  # interleaved, the first step of each (allocator, optimizer state) dropped
        for name in (("old", "new") if s % 2 else ("new", "old")):
            with _Clock() as c:
                paths[name].step(order[(s * 800) % len(order):][:800])
            if s:
                wall[name].append(c.wall), cpu[name].append(c.cpu)
    measured = {}
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        for name, path in paths.items():
            val_rows = np.sort(np.random.default_rng(0).choice(rows, path.val_anchors, replace=False))
            with _Clock() as v:
                path.validate(val_rows)
            with _Clock() as k:
                path.checkpoints(tmp)
            measured[name] = {"step": (float(np.median(wall[name])), float(np.median(cpu[name]))), "validation": (v.wall, v.cpu),
                              "checkpoints": (k.wall, k.cpu), "anchors": path.val_anchors,
                              "gb": sum(os.path.getsize(f"{tmp}/{f}") for f in ("best.ckpt", "last.ckpt")) / 1e9}
    return report_ste_epoch(measured, len(rows), per_epoch, epochs, load)


def report_ste_epoch(measured: dict[str, dict], anchors: int, per_epoch: int, epochs: int, load: float) -> list[dict]:
    """Print each STE path's epoch (``measured``: name -> (wall, cpu) seconds of its median ``step``, its ``validation``
    and ``checkpoints``, the validation ``anchors``, the checkpoints' ``gb``); the record's rows (old, then new)."""
    result, out = {}, []
    for name, m in measured.items():
        (step_wall, step_cpu), (val_wall, val_cpu), (ckpt_wall, ckpt_cpu) = m["step"], m["validation"], m["checkpoints"]
        result[name] = (per_epoch * step_wall + val_wall + ckpt_wall, per_epoch * step_cpu + val_cpu + ckpt_cpu)
        print(f"  {name}: step {step_wall:.3f} s ({step_cpu:.3f} cpu s), validation {val_wall:.2f} s "
              f"({m['anchors']} anchors), checkpoints {ckpt_wall:.2f} s ({m['gb']:.2f} GB) -> "
              f"{result[name][0]:.1f} s/epoch ({result[name][1]:.1f} cpu s), {epochs} epochs {epochs * result[name][0] / 60:.1f} min")
        out.append({"section": "ste epoch", "method": name, "items": anchors, "value": result[name][0], "unit": "s/epoch",
                    "cpu_s_per_epoch": result[name][1], "step_s": step_wall, "step_cpu_s": step_cpu,
                    "validation_s": val_wall, "validation_anchors": m["anchors"], "checkpoints_s": ckpt_wall,
                    "checkpoints_gb": m["gb"], "epochs": epochs, "epochs_min": epochs * result[name][0] / 60,
                    "steps_per_epoch": per_epoch, "load_average": load})
    print(f"  old / new per epoch: x{result['old'][0] / result['new'][0]:.2f} wall, x{result['old'][1] / result['new'][1]:.2f} cpu "
          f"(the fit adds start-up, ~15 s, and the export, ~7 s, to both)")
    out[list(measured).index("old")].update(ratio=result["old"][0] / result["new"][0],
                                            cpu_ratio=result["old"][1] / result["new"][1])
    return out


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
    out = []
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
            out.append({"section": "index", "method": b, "items": n, "value": 1e3 * t, "unit": "ms/batch",
                        "ratio": t_torch / t, "build_s": build, "recall": recall, "ms_per_query": 1e3 * t / n_queries,
                        "queries": n_queries, "k": k, "dim": dim})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--lists", default="data/semclip/similarity_lists_wordnet.npz")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--epoch-steps", type=int, default=8, help="interleaved training steps of each STE path")
    p.add_argument("--skip-wup", action="store_true")
    p.add_argument("--only-index", action="store_true", help="run only the SemCLIP index benchmark")
    p.add_argument("--index-sizes", nargs="+", type=int, default=[10_000, 100_000])
    add_record_option(p, help="also write every printed measurement as one record (its benchmark in the 'section' "
                      "column): docs/records/NAME.json, or this path ending in .json")
    a = p.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    rows = []
    if not a.only_index:
        if not a.skip_wup:
            rows += bench_wup()
        rows += bench_ste(a.lists, a.steps)
        rows += bench_ste_epoch(a.lists, a.epoch_steps)
    rows += bench_index(a.index_sizes)
    write_table_record(a.record, "SemCLIP timings: Wu-Palmer, the STE step and epoch, the store index", TABLE, rows,
                       seeds=[0], lists=None if a.only_index else a.lists, threads=torch.get_num_threads())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""COMPOSER data-side throughput: parsing + CRG extraction (cold vs warm parse cache) and
ConceptGraph build time.

    .venv/bin/python benchmarks/bench_composer.py                      # Flickr8k, 2,000-caption subset
    .venv/bin/python benchmarks/bench_composer.py --subset 0 --backends spacy   # all 40,460 captions

Cold = a fresh cache folder (the parser runs); warm = the same call again (parses read back from
the cache). The full-set graph build reuses the parse cache written by `make crg` when present.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from table_record import add_record_option, write_table_record  # noqa: E402

from grounding.composer import ConceptGraph, backend_available, extract_all, parse_captions, read_captions  # noqa: E402
from grounding.paths import shared_data_dir  # noqa: E402

TABLE = [("part", "part"), ("backend", "backend"), ("workers", "workers"), ("captions", "captions"), ("load_s", "load s"),
         ("cold_captions_per_s", "cold cap/s"), ("warm_captions_per_s", "warm cap/s"), ("warm_over_cold", "warm/cold"),
         ("extract_captions_per_s", "extract cap/s"), ("unparsed", "unparsed"), ("parse_s", "parse s"),
         ("extract_s", "extract s"), ("graph_build_s", "graph build s"), ("save_s", "save s"),
         ("load_stats_s", "load+stats s"), ("file_mib", "file MiB"), ("status", "status")]


def time_backend(backend: str, caps: list[str], workers: list[int]) -> list[dict]:
    """Cold and warm parse + extraction rates of one backend at each worker count (printed; the record's rows)."""
    t = time.perf_counter()
    ok, why = backend_available(backend)  # loads the model once; reused by every call below
    load = time.perf_counter() - t
    if not ok:
        print(f"{backend:<13} skipped: {why.split(';')[0]}")
        return [{"part": "subset", "backend": backend, "captions": len(caps), "status": f"skipped: {why.split(';')[0]}"}]
    rows = []
    for w in workers:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            cold = parse_captions(caps, backend=backend, workers=w, cache=tmp)
            t1 = time.perf_counter()
            extract_all(cold.trees)
            t2 = time.perf_counter()
            warm = parse_captions(caps, backend=backend, workers=w, cache=tmp)
            extract_all(warm.trees)
            t3 = time.perf_counter()
        cold_rate = len(caps) / (t2 - t0)  # parse + extraction
        warm_rate = len(caps) / (t3 - t2)
        print(f"{backend:<13}{w:>8}{load:>8.1f}{cold_rate:>12.1f}{warm_rate:>12.1f}{warm_rate / cold_rate:>9.1f}x"
              f"{len(caps) / (t2 - t1):>15.1f}{cold.failed:>10}")
        rows.append({"part": "subset", "backend": backend, "workers": w, "captions": len(caps), "load_s": load,
                     "cold_captions_per_s": cold_rate, "warm_captions_per_s": warm_rate, "warm_over_cold": warm_rate / cold_rate,
                     "extract_captions_per_s": len(caps) / (t2 - t1), "unparsed": cold.failed, "status": "ok"})
    return rows


def time_full_graph(cs, workers: int) -> dict:
    """The whole caption file through spaCy (its parse cache when there), extraction, graph build, save and load."""
    t0 = time.perf_counter()
    full = parse_captions(cs.captions, backend="spacy", workers=workers)
    t1 = time.perf_counter()
    crgs, _ = extract_all(full.trees)
    t2 = time.perf_counter()
    graph = ConceptGraph.build(crgs, cs.caption_image, cs.image_names)
    t3 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        graph.save(Path(tmp) / "crg.npz")
        t4 = time.perf_counter()
        ConceptGraph.load(Path(tmp) / "crg.npz").stats()
        t5 = time.perf_counter()
        size = (Path(tmp) / "crg.npz").stat().st_size
    print(f"\nfull file ({len(cs):,} captions, spacy): parse {t1 - t0:.1f}s "
          f"({'from cache' if full.from_cache else 'cold'}), extract {t2 - t1:.1f}s, "
          f"graph build {t3 - t2:.2f}s, save {t4 - t3:.2f}s, load+stats {t5 - t4:.2f}s, file {size / 2**20:.1f} MiB")
    return {"part": "full file", "backend": "spacy", "workers": workers, "captions": len(cs), "parse_s": t1 - t0,
            "parse_from_cache": bool(full.from_cache), "extract_s": t2 - t1, "graph_build_s": t3 - t2, "save_s": t4 - t3,
            "load_stats_s": t5 - t4, "file_mib": size / 2**20, "unparsed": full.failed,
            "status": "ok"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--captions", default=str(shared_data_dir() / "flickr8k" / "Flickr8k.token.txt"))
    ap.add_argument("--subset", type=int, default=2000, help="captions to time (0 = all)")
    ap.add_argument("--backends", nargs="+", default=["spacy", "link-grammar"])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--skip-full-graph", action="store_true", help="do not time the full-file graph build")
    add_record_option(ap)
    args = ap.parse_args(argv)

    path = Path(args.captions)
    if not path.is_file():
        print(f"caption file {path} not found (set GROUNDING_SHARED_DATA or pass --captions)")
        return 2
    cs = read_captions(path)
    caps = cs.captions if args.subset <= 0 else cs.captions[: args.subset]
    print(f"{path.name}: {len(cs):,} captions; timing {len(caps):,}")
    print(f"{'backend':<13}{'workers':>8}{'load s':>8}{'cold cap/s':>12}{'warm cap/s':>12}{'warm/cold':>10}"
          f"{'extract cap/s':>15}{'unparsed':>10}")
    rows = [row for backend in args.backends for row in time_backend(backend, caps, args.workers)]
    if not args.skip_full_graph:
        rows.append(time_full_graph(cs, max(args.workers)))
    write_table_record(args.record, f"COMPOSER data side: parsing + CRG extraction on {len(caps):,} captions (cold vs warm "
                       "parse cache), and the full file's ConceptGraph build", TABLE, rows, captions_file=str(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())

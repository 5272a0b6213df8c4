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

from grounding.composer import ConceptGraph, backend_available, extract_all, parse_captions, read_captions  # noqa: E402
from grounding.paths import shared_data_dir  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--captions", default=str(shared_data_dir() / "flickr8k" / "Flickr8k.token.txt"))
    ap.add_argument("--subset", type=int, default=2000, help="captions to time (0 = all)")
    ap.add_argument("--backends", nargs="+", default=["spacy", "link-grammar"])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--skip-full-graph", action="store_true", help="do not time the full-file graph build")
    args = ap.parse_args()

    path = Path(args.captions)
    if not path.is_file():
        print(f"caption file {path} not found (set GROUNDING_SHARED_DATA or pass --captions)")
        return 2
    cs = read_captions(path)
    caps = cs.captions if args.subset <= 0 else cs.captions[: args.subset]
    print(f"{path.name}: {len(cs):,} captions; timing {len(caps):,}")
    print(f"{'backend':<13}{'workers':>8}{'load s':>8}{'cold cap/s':>12}{'warm cap/s':>12}{'warm/cold':>10}"
          f"{'extract cap/s':>15}{'unparsed':>10}")
    for backend in args.backends:
        t = time.perf_counter()
        ok, why = backend_available(backend)  # loads the model once; reused by every call below
        load = time.perf_counter() - t
        if not ok:
            print(f"{backend:<13} skipped: {why.split(';')[0]}")
            continue
        for w in args.workers:
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                cold = parse_captions(caps, backend=backend, workers=w, cache=tmp)
                t1 = time.perf_counter()
                crgs, _ = extract_all(cold.trees)
                t2 = time.perf_counter()
                warm = parse_captions(caps, backend=backend, workers=w, cache=tmp)
                extract_all(warm.trees)
                t3 = time.perf_counter()
            cold_rate = len(caps) / (t2 - t0)  # parse + extraction
            warm_rate = len(caps) / (t3 - t2)
            print(f"{backend:<13}{w:>8}{load:>8.1f}{cold_rate:>12.1f}{warm_rate:>12.1f}{warm_rate / cold_rate:>9.1f}x"
                  f"{len(caps) / (t2 - t1):>15.1f}{cold.failed:>10}")

    if not args.skip_full_graph:
        t0 = time.perf_counter()
        full = parse_captions(cs.captions, backend="spacy", workers=max(args.workers))
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
    return 0


if __name__ == "__main__":
    sys.exit(main())

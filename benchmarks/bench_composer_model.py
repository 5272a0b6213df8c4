"""COMPOSER's model: level-batched recursion vs the node-by-node recursion, and evaluation throughput.

    python benchmarks/bench_composer_model.py [--captions 32] [--images 8] [--repeats 3] [--record NAME]

1. The same (image, caption) pairs composed by ``Composer.compose`` (one call per tree height) and by
   ``compose_node_by_node`` (the paper's recursion, one node at a time), forward only, interleaved
   repeats in one process; the tables are checked equal before timing.
2. Exhaustive evaluation throughput of ``score_captions`` (compositions per second) at the world config's
   size, and the time the paper's 1K-image x 5K-caption test would take at that rate — an extrapolation,
   labelled so (the paper's width is 768, not the 128 measured here).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from table_record import add_record_option, write_table_record

from data_modules.synthetic import generate_world
from grounding.composer.batch import TokenTables, composition_batch
from grounding.composer.captions import read_captions
from grounding.composer.evaluation import score_captions
from grounding.composer.graph_build import build_concept_graph
from grounding.composer.model import Composer, ComposerSizes, compose_node_by_node
from grounding.encoders import load_tokenizer
from grounding.paths import resolve_path

TABLE = [("part", "part"), ("method", "method"), ("seconds", "seconds"), ("rate", "per second"), ("unit", "unit"),
         ("speedup", "speed-up"), ("paper_test_hours", "5K captions x 1K images (h, extrapolated)")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", default="data/world", help="embedded world (generated if missing)")
    ap.add_argument("--captions", type=int, default=32)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    add_record_option(ap)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    world = resolve_path(args.world)
    if not (world / "world.json").is_file():
        generate_world(world, n_images=400, seed=0, image_size=128)
    captions = read_captions(world / "flickr" / "Flickr8k.token.txt")
    graph, _ = build_concept_graph(captions, backend="spacy")
    tables = TokenTables(graph, load_tokenizer("minilm"), captions.captions)
    net = Composer(text_encoder="minilm", backbone="efficientnet_lite0", backbone_weights=None, image_size=128,
                   sizes=ComposerSizes(ct_layers=3, dim=128, heads=4, co_dim=128, co_heads=4)).eval()
    batch = composition_batch(graph, tables, np.arange(args.captions))
    regions, mask = net.embed_regions(torch.randn(args.images, 1280, 4, 4))
    pair_image = torch.arange(args.images).repeat(args.captions)
    pair_caption = torch.arange(args.captions).repeat_interleave(args.images)
    with torch.no_grad():
        table, _ = net.compose(batch, regions, mask, pair_image, pair_caption)
        reference = compose_node_by_node(net, batch, regions, mask, pair_image, pair_caption)
        err = (table - reference).abs().max().item()
        times = {"level-batched": [], "node-by-node": []}
        for _ in range(args.repeats):  # interleaved
            t = time.perf_counter()
            net.compose(batch, regions, mask, pair_image, pair_caption)
            times["level-batched"].append(time.perf_counter() - t)
            t = time.perf_counter()
            compose_node_by_node(net, batch, regions, mask, pair_image, pair_caption)
            times["node-by-node"].append(time.perf_counter() - t)
    nodes = int(len(table))
    print(f"recursion over {len(pair_image)} pairs ({nodes} concept vectors), forward, median of {args.repeats}; "
          f"max |difference| {err:.2e}")
    med = {k: statistics.median(v) for k, v in times.items()}
    speedup = med["node-by-node"] / med["level-batched"]
    rows = []
    for name, sec in med.items():
        print(f"  {name:14s} {sec:8.3f} s   {len(pair_image) / sec:10.1f} pairs/s")
        rows.append({"part": "recursion (forward)", "method": name, "seconds": sec, "rate": len(pair_image) / sec,
                     "unit": "pairs/s", "speedup": speedup if name == "level-batched" else None, "paper_test_hours": None,
                     "pairs": len(pair_image), "concept_vectors": nodes, "max_abs_difference": err, "repeats": args.repeats})
    print(f"  speed-up of the level-batched recursion: {speedup:.1f}x")

    eval_batch = composition_batch(graph, tables, np.arange(50), phrase_seed=0)
    eval_regions, eval_mask = net.embed_regions(torch.randn(40, 1280, 4, 4))
    t = time.perf_counter()
    score_captions(net, eval_batch, eval_regions, eval_mask, image_chunk=40)
    sec = time.perf_counter() - t
    rate = 50 * 40 / sec
    print(f"exhaustive evaluation (50 captions x 40 images, width 128, 3 CT layers): {rate:.0f} compositions/s; "
          f"the paper's 5K captions x 1K images would take ~{5_000_000 / rate / 3600:.1f} h here "
          "(extrapolated, at this width; the paper's 768-wide 5-layer model costs more)")
    rows.append({"part": "exhaustive evaluation", "method": "score_captions, 50 captions x 40 images, width 128, 3 CT layers",
                 "seconds": sec, "rate": rate, "unit": "compositions/s", "speedup": None,
                 "paper_test_hours": 5_000_000 / rate / 3600})
    write_table_record(args.record, "COMPOSER's model: level-batched vs node-by-node recursion; evaluation throughput",
                       TABLE, rows, seeds=[0], world=str(args.world),
                       note="the 5K x 1K hours extrapolate this width-128 rate; the paper's 768-wide 5-layer model costs more")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

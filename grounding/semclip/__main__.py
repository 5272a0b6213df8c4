"""SemCLIP command line.

  python -m grounding.semclip build-lists --out data/semclip/similarity_lists_wordnet.npz [--wup-threshold 0.8 ...]
  python -m grounding.semclip export --ckpt outputs/semclip/ste_wordnet/checkpoints/last.ckpt --out DIR
  python -m grounding.semclip report --ste outputs/semclip/ste_wordnet/embedding --out reports/semclip [--encoders minilm]

Training itself goes through the suite's LightningCLI:
  python -m grounding fit --config experiments/semclip/ste_wordnet.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _build_lists(args):
    from grounding.semclip.similarity_lists import SimilarityListConfig, build_similarity_lists, read_curated_lists

    if args.curated:
        lists = read_curated_lists(args.curated)
    else:
        config = SimilarityListConfig(max_depth_diff=args.max_depth_diff, wup_threshold=args.wup_threshold,
                                      include_siblings=args.include_siblings,
                                      max_list_size=None if args.max_list_size <= 0 else args.max_list_size)
        t0 = time.perf_counter()
        lists = build_similarity_lists(config, progress=True)
        print(f"built in {time.perf_counter() - t0:.1f}s")
    lists.save(args.out)
    print(json.dumps(lists.statistics(), indent=2))
    print(f"wrote {args.out}")


def _export(args):
    from grounding.semclip.ste import SemanticTextEmbedding

    module = SemanticTextEmbedding.load_from_checkpoint(args.ckpt, map_location="cpu")
    print(f"wrote {module.embedding().save(args.out)}")


def _report(args):
    from grounding.semclip.evaluation import write_report

    out = write_report(ste=args.ste, out=args.out, encoders=args.encoders, word_similarity=args.word_similarity,
                       max_queries=args.max_queries, batch_size=args.batch_size)
    print((Path(out) / "README.md").read_text())


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m grounding.semclip", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build-lists", help="build the WordNet noun similarity lists (§3) into one .npz")
    b.add_argument("--out", required=True)
    b.add_argument("--max-depth-diff", type=int, default=2)
    b.add_argument("--wup-threshold", type=float, default=0.8)
    b.add_argument("--include-siblings", action="store_true")
    b.add_argument("--max-list-size", type=int, default=64, help="<= 0: no cap")
    b.add_argument("--curated", help="convert externally curated lists (.json/.jsonl/.tsv) instead")
    b.set_defaults(fn=_build_lists)
    e = sub.add_parser("export", help="export a trained STE checkpoint as vocab + vectors + word2vec text")
    e.add_argument("--ckpt", required=True)
    e.add_argument("--out", required=True)
    e.set_defaults(fn=_export)
    r = sub.add_parser("report", help="synonym coverage (Table 1) and word similarity (Table 2) report")
    r.add_argument("--ste", required=True, help="exported STE folder or word2vec text file")
    r.add_argument("--out", required=True)
    r.add_argument("--encoders", nargs="*", default=["minilm"], help="text encoders to compare (grounding.encoders names)")
    r.add_argument("--word-similarity", default=None, help="folder of w1<TAB>w2<TAB>score files (default: shared data)")
    r.add_argument("--max-queries", type=int, default=None, help="subsample the synonym-coverage queries")
    r.add_argument("--batch-size", type=int, default=512)
    r.set_defaults(fn=_report)
    args = p.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main(sys.argv[1:])

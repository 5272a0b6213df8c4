"""``python -m grounding.semantic_space``: the VG-BERT semantic-space report for any number of models.

    python -m grounding.semantic_space --models minilm runs/vgbert/best.ckpt --names Bert Grounded \
        --data-root ../shared/data --out reports/semantic_space
    python -m grounding.semantic_space --config experiments/semantic_space/minilm.yaml [--out ...]

Command-line options override the YAML config.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from grounding.semantic_space.report import run_report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m grounding.semantic_space", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML report config (see experiments/semantic_space/)")
    p.add_argument("--models", nargs="+", help="text encoder names ('minilm', 'bert-base-uncased', a directory) "
                                                "or Lightning .ckpt paths; the first is the reference")
    p.add_argument("--names", nargs="+", help="display name of each model, in order")
    p.add_argument("--prefix", nargs="+", help="state_dict prefix of the BERT in each checkpoint ('auto' = detect)")
    p.add_argument("--text-encoder", nargs="+", dest="text_encoder",
                   help="architecture of each checkpoint's BERT (default: the checkpoint hparams' text_encoder)")
    p.add_argument("--data-root", dest="data_root", help="folder with semcat/, concreteness/, cslb/ (default ../shared/data)")
    p.add_argument("--semcat"), p.add_argument("--concreteness"), p.add_argument("--cslb")
    p.add_argument("--vocabulary", help="word list for composition and neighbours (default: unique SemCat words)")
    p.add_argument("--out", help="report folder (default reports/semantic_space)")
    p.add_argument("--parts", nargs="+", help="subset of: concreteness property_norms clustering composition")
    p.add_argument("--n-jobs", type=int, dest="n_jobs", help="processes for the property-norm fits")
    p.add_argument("--loo", choices=["approx", "exact"], help="leave-one-out for the lambda choice")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the embedding cache")
    p.add_argument("--vocabulary-sample", type=int, dest="vocabulary_sample",
                   help="standardise with the statistics of a seeded sample of this many token ids (default: all, App. B)")
    p.add_argument("--n-components", type=int, dest="n_components",
                   help="PCA dimensions the property-norm classifiers see (default: all)")
    return p


def config_from_args(args: argparse.Namespace) -> dict:
    cfg: dict = {}
    if args.config:
        import yaml

        with open(args.config) as f:
            loaded = yaml.safe_load(f) or {}
        cfg = loaded.get("semantic_space", loaded)  # a config may nest everything under `semantic_space:`
    if args.models:
        per = {k: getattr(args, k) for k in ("names", "prefix", "text_encoder")}
        for key, values in per.items():
            if values and len(values) != len(args.models):
                raise SystemExit(f"--{key.replace('_', '-')} needs one value per model ({len(args.models)}), got {values}")
        cfg["models"] = [{"source": src, "name": per["names"][i] if per["names"] else None,
                          "prefix": per["prefix"][i] if per["prefix"] else "auto",
                          "text_encoder": per["text_encoder"][i] if per["text_encoder"] else None}
                         for i, src in enumerate(args.models)]
    elif args.names:
        models = cfg.get("models", [])
        if len(args.names) != len(models):
            raise SystemExit(f"--names needs one value per model ({len(models)} in the config)")
        cfg["models"] = [{**({"source": m} if isinstance(m, str) else m), "name": n} for m, n in zip(models, args.names)]
    for key in ("data_root", "semcat", "concreteness", "cslb", "vocabulary", "out", "parts"):
        if getattr(args, key):
            cfg[key] = getattr(args, key)
    pn = dict(cfg.get("property_norms_part") or {})
    if args.n_jobs is not None:
        pn["n_jobs"] = args.n_jobs
    if args.loo:
        pn["loo"] = args.loo
    if args.n_components is not None:
        pn["n_components"] = args.n_components
    if pn:
        cfg["property_norms_part"] = pn
    emb = dict(cfg.get("embedding") or {})
    if args.no_cache:
        emb["cache"] = False
    if args.vocabulary_sample is not None:
        emb["vocabulary_sample"] = args.vocabulary_sample
    if emb:
        cfg["embedding"] = emb
    return cfg


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    if not args.config and not args.models:
        raise SystemExit("give --models (and optionally --names) or --config; see --help")

    t0 = time.perf_counter()
    run_report(config_from_args(args))
    print(f"[semantic_space] total: {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

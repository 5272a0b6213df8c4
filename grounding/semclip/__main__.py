"""SemCLIP command line.

  python -m grounding.semclip build-lists --out data/semclip/similarity_lists_wordnet.npz [--wup-threshold 0.8 ...]
  python -m grounding.semclip export --ckpt outputs/semclip/ste_wordnet/checkpoints/last.ckpt --out DIR
  python -m grounding.semclip report --ste outputs/semclip/ste_wordnet/embedding --out reports/semclip [--encoders minilm]
  python -m grounding.semclip evaluate --config experiments/semclip/align_world.yaml --out reports/semclip/world
  python -m grounding.semclip evaluate --config experiments/semclip/align_flickr8k.yaml --photos ../shared/data/flickr8k \
      --split test --out reports/semclip/flickr8k
  python -m grounding.semclip hard-negative-embeddings --vlm suite:CKPT --images data/flickr30k/flickr30k-images --out emb.npz

report and evaluate take --record NAME: the report's main table (report: Tables 1-2; evaluate: Tables 3-4) also as
docs/records/NAME.json (or a path ending in .json), the record the docs render it from (grounding.docs_tables).

Training itself goes through the suite's LightningCLI:
  python -m grounding fit --config experiments/semclip/ste_wordnet.yaml
  python -m grounding fit --config experiments/semclip/align_world.yaml
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
from jsonargparse import ArgumentError, ArgumentParser, DefaultHelpFormatter

from data_modules.wordnet_lists import SimilarityListConfig, build_similarity_lists, read_curated_lists
from grounding.checkpoints import load_checkpoint_file, require_checkpoint_of
from grounding.docs_tables import DocsTableError, record_path
from grounding.docs_tables import provenance as record_provenance
from grounding.errors import UserInputError, user_errors_exit
from grounding.paths import resolve_path
from grounding.semclip.alignment import check_fitted_vlm, load_transform, minilm_lexical_variants
from grounding.semclip.alignment_data import AlignmentPairsDataModule, read_captions
from grounding.semclip.evaluation import write_report
from grounding.semclip.photo_evaluation import (
    BANK_PROTOCOLS,
    evaluate_photos,
    lazy,
    read_photo_split,
    write_photo_record,
    write_photo_report,
    write_photo_summary,
)
from grounding.semclip.stability import evaluate_world, write_world_record, write_world_report
from grounding.semclip.ste import SemanticTextEmbedding, STEEmbedding
from grounding.semclip.vlm import list_images, load_vlm
from grounding.stage_config import expand_config_bases, stage_config_parser
from grounding.utils.io import atomic_path


def _build_lists(args):
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
    require_checkpoint_of(args.ckpt, SemanticTextEmbedding, "export --ckpt",
                          "give a checkpoint of the STE stage (`make ste` writes outputs/semclip/ste_wordnet/checkpoints)")
    load_checkpoint_file(args.ckpt, "export --ckpt", mmap=True)  # plain data, or one line
    module = SemanticTextEmbedding.load_from_checkpoint(args.ckpt, map_location="cpu")
    print(f"wrote {module.embedding().save(args.out)}")


def _record(args, command: str) -> Path | None:
    """``--record NAME`` as the record's path (docs/records/NAME.json, or a path ending in .json), None without it;
    a bad name is a UsageError (one line, exit 2), named before any work."""
    if args.record is None:
        return None
    try:
        return record_path(args.record)
    except DocsTableError as e:
        raise UsageError(f"{command}: --record: {e}") from None


def _report(args):
    record = _record(args, "report")
    if not resolve_path(args.ste).exists():  # before WordNet and the encoders load (minutes)
        raise UsageError(f"--ste {args.ste} does not exist: give an exported STE folder (`make ste` writes "
                         "outputs/semclip/ste_wordnet/embedding) or a word2vec text file.")
    out = write_report(ste=args.ste, out=args.out, encoders=args.encoders, word_similarity=args.word_similarity,
                       sample=args.sample if args.sample is not None else args.max_queries, batch_size=args.batch_size,
                       cap_statistics=args.cap_statistics, record=record)
    print((Path(out) / "README.md").read_text())
    if record is not None:
        print(f"wrote the record {record}")


def alignment_config(path: str) -> dict:
    """The pairs' DataModule arguments and the model's ``export_path`` of an alignment stage config (the file
    ``python -m grounding fit`` trains with, its ``base:`` chain included), type-checked by jsonargparse
    against AlignmentPairsDataModule's signature."""
    p = stage_config_parser(AlignmentPairsDataModule, "data")
    cfg = p.parse_args(expand_config_bases(["--config", path]))
    model_args = (cfg.model or {}).get("init_args") or {}
    return {"data": cfg.data.init_args.as_dict(), "export_path": model_args.get("export_path")}


def _check_evaluate_arguments(args) -> None:
    """The numbers first: a wrong one is named before any file is looked for (one line each, exit 2)."""
    if args.image_neighbours < 1:
        raise UsageError(f"evaluate: --image-neighbours {args.image_neighbours}: give 1 (Eq. 7, the paper's) or more "
                         "(the mean of Γ_t of an image's k nearest bank texts).")
    if args.bootstrap < 1:
        raise UsageError(f"evaluate: --bootstrap {args.bootstrap}: give the number of bootstrap resamples, 1 or more "
                         "(1000 by default).")
    if not 0 < args.confidence < 1:
        raise UsageError(f"evaluate: --confidence {args.confidence}: give the intervals' level between 0 and 1, e.g. 0.95.")
    if args.tagging_captions < 1:
        raise UsageError(f"evaluate: --tagging-captions {args.tagging_captions}: give 1 or more captions per photo.")
    bad_ks = [k for k in args.ks or [] if k < 1]
    if bad_ks:
        raise UsageError(f"evaluate: --ks {' '.join(map(str, args.ks))}: every cut-off must be 1 or more.")


def _evaluate(args):
    _check_evaluate_arguments(args)
    record = _record(args, "evaluate")
    cfg = alignment_config(args.config) if args.config else {"data": {}, "export_path": None}
    transform_path = args.transform or cfg["export_path"]
    if not transform_path:
        raise UsageError("evaluate needs --transform (a file written by SemCLIPAlignment's export_path) or --config.")
    transform, provenance = load_transform(transform_path)
    # the pairs' settings recorded at training time win over the config (CLI overrides of `fit` included)
    accepted = set(inspect.signature(AlignmentPairsDataModule.__init__).parameters) - {"self"}
    dm_args = {k: v for k, v in {**cfg["data"], **provenance}.items() if k in accepted}
    if args.vlm:
        check_fitted_vlm(provenance, args.vlm, transform_path)
    for key in ("vlm", "ste", "captions"):
        if getattr(args, key):
            dm_args[key] = getattr(args, key)
    missing = [k for k in ("vlm", "ste", "captions") if not dm_args.get(k)]
    if missing:
        raise UsageError(f"evaluate: no {', '.join(missing)} (give --{' --'.join(missing)} or a --config with data.init_args).")
    dm = AlignmentPairsDataModule(**dm_args)
    pairs = dm.load_pairs()
    train_idx, val_idx = dm.split_indices()
    vlm = load_vlm(dm_args["vlm"])
    ste = STEEmbedding.load(dm_args["ste"])
    if (vlm.dim, ste.dim) != (transform.net[0].in_features, transform.net[-1].out_features):
        raise UsageError(f"The transform maps {transform.net[0].in_features} -> {transform.net[-1].out_features} but the "
                         f"VLM gives {vlm.dim} and the STE {ste.dim} dimensions: evaluate with the VLM/STE it was trained on.")
    provenance = {"vlm": dm_args["vlm"], "ste": dm_args["ste"], "captions": dm_args["captions"],
                  "caption_images": dm_args.get("caption_images"), "transform": transform_path}
    if args.photos:
        _evaluate_photos(args, vlm, transform, ste, pairs, train_idx, val_idx, dm_args, provenance)
        return
    bank = None
    if args.bank_files:
        known = set(pairs["captions"])
        bank = [c for c in read_captions(args.bank_files) if c not in known]
    results = evaluate_world(vlm, transform, ste, args.world, pairs=pairs, train_idx=train_idx, val_idx=val_idx,
                             bank_captions=bank, splits=args.splits, ks=args.ks or [1, 5, 10, 50],
                             query_modes=args.query_modes, image_neighbours=args.image_neighbours)
    inputs = {**provenance, "world": args.world, "bank_files": args.bank_files, "image_neighbours": args.image_neighbours}
    out = write_world_report(results, args.out, provenance={k: v for k, v in inputs.items() if k != "world"})
    print((Path(out) / "README.md").read_text())
    if record is not None:
        write_world_record(record, results, record_provenance(config=_evaluated_files(args, transform_path)), inputs=inputs,
                           report=Path(out) / "README.md")
        print(f"wrote the record {record}")


def _evaluated_files(args, transform_path: str) -> list[str]:
    """The record's ``config``: the alignment config (when given) and the Γ_t file evaluated."""
    return [str(p) for p in (args.config, transform_path) if p]


def _evaluate_photos(args, vlm, transform, ste, pairs, train_idx, val_idx, dm_args, provenance):
    """Tables 3–4 on a photo split (grounding.semclip.photo_evaluation), with bootstrap intervals."""
    root = Path(args.photos)
    at_root = lambda name: root / name if (root / name).exists() else Path(name)  # noqa: E731 - --photos first
    image_list = at_root(args.image_list or f"Flickr_8k.{args.split}Images.txt")
    split = read_photo_split(at_root(args.photo_captions), image_list, root / args.image_dir, name=args.split)
    distractors = None
    if args.distractors:
        if args.bank_captions != "tagging":
            raise UsageError("evaluate --photos: --distractors needs --bank-captions tagging (under other-images the "
                             "bank is Γ_t's captions, the distractors' own among them).")
        listed = at_root(args.distractors if args.distractors.endswith(".txt")
                         else f"Flickr_8k.{args.distractors}Images.txt")
        distractors = read_photo_split(at_root(args.photo_captions), listed, root / args.image_dir,
                                       name=str(args.distractors))
        clash = {p.name for p in split.paths} & {p.name for p in distractors.paths}
        if clash:
            raise UsageError(f"evaluate --photos: {len(clash)} photos (e.g. {sorted(clash)[0]}) are both evaluated and "
                             f"distractors ({listed}); give another --distractors split.")
    if args.bank_captions == "tagging":
        n = args.tagging_captions
        short = [(p, len(c)) for s in (split, distractors) if s for p, c in zip(s.paths, s.captions) if len(c) <= n]
        if n < 1 or short:
            raise UsageError(f"evaluate --photos: --tagging-captions {n}: " + (
                "give 1 or more." if n < 1 else
                f"{short[0][0].name} has only {short[0][1]} caption(s) in {at_root(args.photo_captions)}, leaving it no "
                "relevance caption; give fewer tagging captions or --bank-captions other-images."))
    # Γ_t's pairs and the store's caption bank come from data.init_args.captions: the evaluated photos' captions
    # must not be among them (Eq. 7 would find a photo's own caption).
    listed = dm_args.get("caption_images")
    if not listed:
        raise UsageError("evaluate --photos: the config's data.init_args.caption_images is empty, so Γ_t and the caption "
                         "bank use every caption, the evaluated photos' too; set it to the training images' list "
                         "(e.g. Flickr_8k.trainImages.txt).")
    training = {line.strip() for line in Path(listed).read_text().splitlines() if line.strip()}
    leaked = sorted(p.name for p in split.paths if p.name in training)
    if leaked:
        raise UsageError(f"evaluate --photos: {len(leaked)} evaluated photos (e.g. {leaked[0]}) are in {listed}, whose "
                         f"captions trained Γ_t and fill the bank; evaluate another split or change caption_images.")
    lexical = None
    if dm_args.get("lexical_variants", True):  # as Γ_t's targets were built
        lexical = lazy(lambda: minilm_lexical_variants(ste, min_similarity=dm_args.get("lexical_min_similarity", -1.0)))
    results = evaluate_photos(vlm, transform, ste, split, pairs=pairs, train_idx=train_idx, val_idx=val_idx,
                              ks=args.ks or [1, 5, 10], query_modes=args.query_modes, lexical=lexical,
                              n_resamples=args.bootstrap, confidence=args.confidence, seed=args.seed,
                              image_neighbours=args.image_neighbours, bank=args.bank_captions,
                              tagging_captions=args.tagging_captions, tagging_seed=args.tagging_seed,
                              distractors=distractors)
    title = args.title or f"SemCLIP on {root.name} ({args.split} photos)"
    inputs = {**provenance, "photos": str(root), "photo_captions": str(at_root(args.photo_captions)),
              "image_list": str(image_list), "image_dir": args.image_dir, "bank_captions": args.bank_captions,
              "distractors": args.distractors, "image_neighbours": args.image_neighbours}
    out = write_photo_report(results, args.out, title=title, provenance=inputs)
    print((Path(out) / "report.md").read_text())
    record = _record(args, "evaluate")
    if record is not None:
        write_photo_record(record, results, record_provenance(config=_evaluated_files(args, provenance["transform"]),
                                                              seeds=[args.seed]),
                           inputs=inputs, report=Path(out) / "report.md", title=title)
        print(f"wrote the record {record}")


def _summarize(args):
    out = write_photo_summary(args.reports, args.out, title=args.title)
    print((out / "summary.md").read_text())


def _hard_negative_embeddings(args):
    """Any VLM's image embeddings as COMPOSER's hard-negative pool source (data.init_args.hard_negative_pool.embeddings
    of grounding.composer.data.ComposerDataModule): an .npz of ``names`` (file names) and ``embeddings`` (N×d)."""
    images = [p for folder in args.images for p in list_images(folder)]
    embeddings = load_vlm(args.vlm, device=args.device).encode_image(images).float().numpy()
    with atomic_path(args.out, suffix=".npz") as tmp, open(tmp, "wb") as f:
        np.savez(f, names=np.array([p.name for p in images]), embeddings=embeddings)
    print(f"wrote {len(images)} image embeddings ({embeddings.shape[1]}-d) to {args.out}")


class _HelpFormatter(DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """jsonargparse's help, the description printed as written."""


class UsageError(UserInputError):
    """A command line or config the commands cannot run with (exit status 2)."""


def _subcommand(subcommands, name: str, help: str) -> ArgumentParser:
    p = ArgumentParser(exit_on_error=False)
    subcommands.add_subcommand(name, p, help=help)
    return p


def build_parser() -> ArgumentParser:
    p = ArgumentParser(allow_abbrev=False, prog="python -m grounding.semclip", description=__doc__, exit_on_error=False,
                       formatter_class=_HelpFormatter)
    sub = p.add_subcommands(dest="command")
    b = _subcommand(sub, "build-lists", "build the WordNet noun similarity lists (§3) into one .npz")
    b.add_argument("--out", type=str, required=True)
    b.add_argument("--max-depth-diff", type=int, default=2)
    b.add_argument("--wup-threshold", type=float, default=0.8)
    b.add_argument("--include-siblings", action="store_true")
    b.add_argument("--max-list-size", type=int, default=64, help="<= 0: no cap")
    b.add_argument("--curated", type=Optional[str], default=None, help="convert externally curated lists (.json/.jsonl/.tsv) instead")
    e = _subcommand(sub, "export", "export a trained STE checkpoint as vocab + vectors + word2vec text")
    e.add_argument("--ckpt", type=str, required=True)
    e.add_argument("--out", type=str, required=True)
    r = _subcommand(sub, "report", "synonym coverage (Table 1) and word similarity (Table 2) report")
    r.add_argument("--ste", type=str, required=True, help="exported STE folder or word2vec text file")
    r.add_argument("--out", type=str, required=True)
    r.add_argument("--encoders", type=str, nargs="*", default=["minilm"], help="text encoders to compare (grounding.encoders names)")
    r.add_argument("--word-similarity", type=Optional[str], default=None,
                   help="folder of w1<TAB>w2<TAB>score files (default: shared data)")
    r.add_argument("--sample", type=Optional[int], default=None,
                   help="Table 1 on a seeded sample of this many queries (quick runs); default: all of them, the full protocol")
    r.add_argument("--max-queries", type=Optional[int], default=None, help="the older name of --sample")
    r.add_argument("--cap-statistics", type=bool, default=True,
                   help="report what the 64-member list cap truncates in the whole-WordNet lists (built uncapped once, cached)")
    r.add_argument("--batch-size", type=int, default=512)
    r.add_argument("--record", type=Optional[str], default=None,
                   help="also write Tables 1 and 2 with their provenance to docs/records/NAME.json (or this path "
                        "ending in .json), the record the docs render them from")
    v = _subcommand(sub, "evaluate", "retrieval stability (Table 3), synonym-augmented retrieval (Table 4) and the "
                                     "alignment recovery error on the embedded world, or with --photos on a photo split "
                                     "(bootstrap intervals, diagnosis), SemCLIP vs the base VLM")
    v.add_argument("--config", type=Optional[str], default=None,
                   help="an alignment config (experiments/semclip/align_world.yaml): VLM, STE, captions, transform")
    v.add_argument("--transform", type=Optional[str], default=None,
                   help="the trained Γ_t (default: the config's model.init_args.export_path)")
    v.add_argument("--vlm", type=Optional[str], default=None, help="override the VLM spec (suite:<ckpt> | hf-clip:<dir>)")
    v.add_argument("--ste", type=Optional[str], default=None, help="override the STE export")
    v.add_argument("--captions", type=Optional[str], default=None, help="override the caption file(s) of the text bank / alignment pairs")
    v.add_argument("--bank-files", type=str, nargs="+", default=None,
                   help="world mode: more caption files for the store's text bank (§4: the captions tagging the stored "
                        "images), beside the alignment captions")
    v.add_argument("--bank-captions", type=str, default="tagging", choices=list(BANK_PROTOCOLS),
                   help="with --photos: the store's bank. tagging (§4, the paper's): --tagging-captions of each photo's "
                        "captions tag it in the bank, its other captions alone are relevance labels and query nouns; "
                        "other-images: every caption of a photo is a label, the bank is Γ_t's captions (other images')")
    v.add_argument("--tagging-captions", type=int, default=1, help="with --bank-captions tagging: captions per photo in the bank")
    v.add_argument("--tagging-seed", type=int, default=0, help="with --bank-captions tagging: which captions tag a photo")
    v.add_argument("--distractors", type=Optional[str], default=None,
                   help="with --photos: a split name (train: Flickr_8k.trainImages.txt) or an image list whose photos "
                        "join the store with their tagging captions (a store that grows); queries stay the split's")
    v.add_argument("--image-dir", type=str, default="images",
                   help="with --photos: the photos' folder inside --photos (images-224 for all of Flickr8k)")
    v.add_argument("--world", type=str, default="data/world", help="the embedded world (world.json + images)")
    v.add_argument("--splits", type=str, nargs="+", default=["val", "test"], help="world splits whose images are searched")
    v.add_argument("--photos", type=Optional[str], default=None,
                   help="a Flickr8k-style folder (images/ + caption file + split lists): evaluate on its photos, not the world")
    v.add_argument("--split", type=str, default="test", help="with --photos: the split (Flickr_8k.<split>Images.txt)")
    v.add_argument("--image-list", type=Optional[str], default=None,
                   help="with --photos: the split's image list (default Flickr_8k.<split>Images.txt in --photos)")
    v.add_argument("--photo-captions", type=str, default="Flickr8k.token.1000img.txt",
                   help="with --photos: the photos' captions (nouns, queries and relevance; in --photos unless a path)")
    v.add_argument("--bootstrap", type=int, default=1000, help="with --photos: bootstrap resamples of the queries")
    v.add_argument("--confidence", type=float, default=0.95, help="with --photos: the intervals' level")
    v.add_argument("--seed", type=int, default=0, help="with --photos: the bootstrap's seed")
    v.add_argument("--title", type=Optional[str], default=None, help="with --photos: the report's title")
    v.add_argument("--ks", type=int, nargs="+", default=None,
                   help="overlap@k cut-offs (default: 1 5 10 50 on the world, 1 5 10 on photos)")
    v.add_argument("--query-modes", type=str, nargs="+", default=["ste", "transform"], choices=["ste", "transform"])
    v.add_argument("--image-neighbours", type=int, default=1,
                   help="Eq. 7: each image is Γ_t of its nearest bank text (1, the paper's); k > 1, an ablation: the mean "
                        "of Γ_t of its k nearest")
    v.add_argument("--out", type=str, required=True)
    v.add_argument("--record", type=Optional[str], default=None,
                   help="also write Tables 3-4 (a row per system; with --photos each interval and the Δ rows) with "
                        "their provenance to docs/records/NAME.json (or this path ending in .json)")
    m = _subcommand(sub, "summarize", "one table of several photo reports (base VLMs x bank protocols x stores)")
    m.add_argument("--reports", type=str, nargs="+", required=True, help="report folders written by evaluate --photos")
    m.add_argument("--out", type=str, required=True, help="the folder of summary.md / summary.csv")
    m.add_argument("--title", type=str, default="")
    h = _subcommand(sub, "hard-negative-embeddings", "embed image folders with a VLM for COMPOSER's hard-negative pool "
                                                     "(data.init_args.hard_negative_pool.embeddings)")
    h.add_argument("--vlm", type=str, required=True, help="suite:<ckpt> | hf-clip:<dir> | open-clip:<arch>:<weights>")
    h.add_argument("--images", type=str, nargs="+", required=True, help="folders holding every training image")
    h.add_argument("--out", type=str, required=True, help="the .npz to write (names, embeddings)")
    h.add_argument("--device", type=str, default="cpu")
    return p


COMMANDS = {"build-lists": _build_lists, "export": _export, "report": _report, "evaluate": _evaluate,
            "summarize": _summarize,
            "hard-negative-embeddings": _hard_negative_embeddings}


def main(argv=None):
    parser = build_parser()
    try:
        cfg = parser.parse_args(argv)
        args = cfg[cfg.command]
        COMMANDS[cfg.command](args)
    except (ArgumentError, UsageError, FileNotFoundError) as err:
        print(f"python -m grounding.semclip: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    with user_errors_exit("python -m grounding.semclip"):
        main(sys.argv[1:])

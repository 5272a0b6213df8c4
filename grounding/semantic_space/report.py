"""One report comparing any number of language streams on the VG-BERT semantic-space analyses.

``run_report(config)`` loads the lexical data, embeds everything each model needs (cached),
runs the selected parts (concreteness, property_norms, clustering, composition) and writes a
folder: ``report.md`` (Markdown tables), one CSV per table and per-item result, PNG figures,
``timings.json`` and the resolved ``config.yaml``. The folder is written atomically. The first
model is the reference ("before grounding") that significance tests, slope charts and the paired
bootstrap intervals (``intervals_part``, :mod:`grounding.semantic_space.intervals`: every measure
with a 95 % interval, each later model's difference to the first with a paired one) compare the
others with.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from data_modules import lexical
from grounding.checkpoints import checkpoint_class, require_checkpoint_of
from grounding.docs_tables import provenance, write_record
from grounding.errors import UserInputError
from grounding.nets import class_of
from grounding.semantic_space import clustering, composition, concreteness, intervals, property_norms
from grounding.semantic_space.embeddings import LanguageStreamError, WordEmbedder, load_language_stream
from grounding.utils.io import atomic_path

PARTS = ("concreteness", "property_norms", "clustering", "composition", "word_similarity")
INTERVAL_PARTS = ("concreteness", "property_norms", "clustering", "word_similarity")  # the parts that add intervals

# Table 2 of the paper: query phrase, target, and the paper's (cosine, rank) for Bert / Grounded / Relational.
PAPER_TABLE2 = [
    dict(query="striped horse", target="zebra", paper=[[0.12, 2914], [0.60, 12], [0.63, 8]]),
    dict(query="black and white bear", target="panda", paper=[[0.13, 2478], [0.69, 2], [0.81, 2]]),
    dict(query="flying car", target="plane", paper=[[0.36, 167], [0.66, 4], [0.61, 11]]),
    dict(query="round container", target="bowl", paper=[[0.25, 489], [0.56, 8], [0.67, 2]]),
    dict(query="red fruit", target="strawberry", paper=[[0.39, 239], [0.75, 3], [0.85, 3]]),
    dict(query="young dog", target="puppy", paper=[[0.40, 94], [0.92, 2], [0.93, 2]]),
    dict(query="iced mountain", target="glacier", paper=[[0.44, 20], [0.86, 1], [0.73, 5]]),
    dict(query="clear sky", target="sunny", paper=[[0.27, 631], [0.31, 184], [0.34, 61]]),
    dict(query="hot weather", target="summer", paper=[[0.27, 903], [0.52, 14], [0.53, 6]]),
]
PAPER_TABLE1 = {"Bert": (0.1040, 0.3538), "Grounded": (0.6615, 0.8749), "Relational Grounded": (0.6948, 0.8001)}

DEFAULTS: dict = {
    "models": [],                 # [{source, name, prefix, text_encoder, tokenizer, model_class}] or source strings
    "data_root": None,            # default grounding.paths.shared_data_dir()
    "semcat": None, "concreteness": None, "cslb": None,
    "word_similarity": None,      # folder of w1<TAB>w2<TAB>score sets (default: the shared word-similarity/)
    "vocabulary": None,           # word-list file for composition/neighbours (default: unique SemCat words)
    "out": "reports/semantic_space",
    "parts": list(PARTS),
    "embedding": {"batch_size": 256, "pool_special_tokens": True, "max_length": 32, "cache": True,
                  "vocabulary_sample": None},  # None: statistics over the whole token vocabulary (App. B)
    "semcat_subset": {"categories": None, "max_words_per_category": None},
    "concreteness_part": {"pca_fit_on": "entries", "n_pcs": 6, "k_extremes": 10,
                          "label_categories": ["emotions", "big", "country", "sciences", "math", "people",
                                               "mythical_beasts", "weather", "art", "plants", "car", "animal",
                                               "house", "cooking_tools"]},
    "property_norms_part": {"min_pf": 5, "min_concepts": 5, "keep_sense": False, "n_components": None,
                            "loo": "approx", "n_lambdas": 16, "lambda_min_ratio": 1.0e-3, "patience": 3,
                            "n_jobs": 2, "max_features": None},
    "clustering_part": {"top_k": 15},
    # paired bootstrap over the evaluation items (entries, categories, features, pairs); 0 resamples: no intervals
    "intervals_part": {"n_resamples": 1000, "confidence": 0.95, "seed": 0},
    "composition_part": {"queries": PAPER_TABLE2,
                         "neighbour_queries": ["boat", "car", "airplane", "dog", "goose", "horse", "drink", "fruit",
                                               "vegetable", "bathroom", "bedroom", "kitchen"],
                         "slope_queries": ["striped horse", "red fruit"], "k": 15, "slope_top_n": 12},
}


MODEL_KEYS = {"source", "name", "prefix", "text_encoder", "tokenizer", "model_class"}


def merge_config(overrides: dict | None) -> dict:
    cfg = copy.deepcopy(DEFAULTS)
    for key, value in (overrides or {}).items():
        if key not in cfg:
            raise KeyError(f"unknown report option {key!r}; known options: {sorted(cfg)}")
        if isinstance(cfg[key], dict) and isinstance(value, dict):
            unknown = set(value) - set(cfg[key])
            if unknown:
                raise KeyError(f"unknown option(s) {sorted(unknown)} under {key!r}; known: {sorted(cfg[key])}")
            cfg[key].update(value)
        else:
            cfg[key] = value
    bad = set(cfg["parts"]) - set(PARTS)
    if bad:
        raise ValueError(f"unknown parts {sorted(bad)}; choose from {list(PARTS)}")
    models = []
    for m in cfg["models"]:
        m = {"source": m} if isinstance(m, str) else dict(m)
        if "source" not in m:
            raise ValueError(f"model entry {m} needs a 'source' (a text encoder name or a .ckpt path)")
        unknown = set(m) - MODEL_KEYS
        if unknown:  # e.g. an unquoted "name: A, B" in a YAML flow mapping splits into a name and a key "B"
            raise ValueError(f"model entry {m}: unknown key(s) {sorted(unknown)}; known: {sorted(MODEL_KEYS)} (quote "
                             "a name holding a comma)")
        models.append({"name": None, "prefix": "auto", "text_encoder": None, "tokenizer": None, "model_class": None, **m})
    if not models:
        raise ValueError("no models given: pass --models minilm [path/to.ckpt ...] or `models:` in the YAML config")
    names = [m["name"] or (Path(m["source"]).stem if Path(m["source"]).expanduser().is_file() else m["source"])
             for m in models]
    if len(set(names)) != len(names):
        raise ValueError(f"model display names must be unique, got {names}; set them with --names")
    for m, n in zip(models, names):
        m["name"] = n
    cfg["models"] = models
    return cfg


def check_model_classes(models: list[dict]) -> None:
    """Before any work: a model whose ``model_class`` is set (a LightningModule class path, e.g.
    ``grounding.vgbert.pretrain.GroundingPretrain``) must be a checkpoint of that class or a subclass; another
    model's checkpoint is a one-line error naming both (grounding.checkpoints.require_checkpoint_of)."""

    for m in models:
        if not m.get("model_class"):
            continue
        cls, name = class_of(m["model_class"]), str(m["model_class"]).rpartition(".")[2]
        if cls is None:
            raise LanguageStreamError(f"model {m['name']!r}: model_class {m['model_class']!r} is not an importable "
                                      "class path (e.g. grounding.vgbert.pretrain.GroundingPretrain)")
        require_checkpoint_of(m["source"], cls, f"model {m['name']!r}: source",
                              f"give a {name} checkpoint or change model_class")


# --------------------------------------------------------------------------------------------
# Markdown helpers
# --------------------------------------------------------------------------------------------
def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)):
        return "n/a" if not np.isfinite(v) else (f"{v:.2e}" if 0 < abs(v) < 1e-3 else f"{v:.4f}")
    return str(v)


def markdown_table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


class _Timer:
    def __init__(self):
        self.times: dict[str, float] = {}

    def __call__(self, label: str):
        timer = self

        class _Ctx:
            def __enter__(self):
                self.t0 = time.perf_counter()
                print(f"[semantic_space] {label} ...", flush=True)

            def __exit__(self, *exc):
                dt = time.perf_counter() - self.t0
                timer.times[label] = timer.times.get(label, 0.0) + dt
                print(f"[semantic_space] {label}: {dt:.1f} s", flush=True)

        return _Ctx()


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------
@dataclass
class LexicalData:
    """The word lists and human judgements the analyses read: SemCat (all parts), the vocabulary composition ranks
    against, and per selected part its ratings (§4.1), CSLB norms (§4.2) or word-similarity sets (empty otherwise)."""

    semcat: lexical.SemCat
    vocabulary: list[str]
    ratings: dict[str, float]
    norms: lexical.PropertyNorms | None
    similarity_sets: list[tuple[str, list[tuple[str, str, float]]]]


def _load_lexical_data(cfg: dict, parts: list[str]) -> LexicalData:
    """Read only what the selected parts need (the CSLB norms and the similarity sets are slow to parse)."""
    root = cfg["data_root"]
    semcat = lexical.load_semcat(cfg["semcat"] or lexical.default_path("semcat", root))
    sub = cfg["semcat_subset"]
    if sub["categories"] or sub["max_words_per_category"]:
        semcat = semcat.subset(sub["categories"], sub["max_words_per_category"])
    vocabulary = lexical.load_word_list(cfg["vocabulary"]) if cfg["vocabulary"] else semcat.vocabulary
    ratings = (lexical.load_concreteness(cfg["concreteness"] or lexical.default_path("concreteness", root))
               if "concreteness" in parts else {})
    pn = cfg["property_norms_part"]
    norms = None
    if "property_norms" in parts:
        norms = lexical.load_cslb_norms(cfg["cslb"] or lexical.default_path("cslb", root), pn["min_pf"],
                                        pn["min_concepts"])
        if pn["max_features"]:
            keep = np.arange(min(pn["max_features"], len(norms.features)))
            norms = lexical.PropertyNorms(norms.concepts, [norms.features[i] for i in keep],
                                          [norms.feature_types[i] for i in keep], norms.labels[:, keep], norms.path)
    similarity_sets = (lexical.load_word_similarity_sets(cfg["word_similarity"]
                                                         or lexical.default_path("word_similarity", root))
                       if "word_similarity" in parts else [])
    return LexicalData(semcat, vocabulary, ratings, norms, similarity_sets)


def _composition_queries(cfg: dict) -> tuple[list[str], list[str]]:
    """Table 2's query phrases and their target words."""
    comp = cfg["composition_part"]
    return [q["query"] for q in comp["queries"]], [q["target"] for q in comp["queries"]]


def _texts_to_embed(cfg: dict, lex: LexicalData) -> list[str]:
    """Every word and phrase any part looks up, once each (in first-seen order, so the embedding cache key is stable)."""
    comp, pn = cfg["composition_part"], cfg["property_norms_part"]
    queries, targets = _composition_queries(cfg)
    similarity_words = list(dict.fromkeys(w for _, pairs in lex.similarity_sets for a, b, _ in pairs for w in (a, b)))
    return list(dict.fromkeys(lex.semcat.words + lex.vocabulary + queries + targets + comp["neighbour_queries"]
                              + comp["slope_queries"] + similarity_words
                              + (lex.norms.concept_texts(pn["keep_sense"]) if lex.norms is not None else [])))


def _embed_models(cfg: dict, lex: LexicalData, timer: _Timer) -> dict[str, dict]:
    """Per model: its embedding of every text (``table``), its stream's identity and cache folder, and for a
    checkpoint the LightningModule class it holds. One model is loaded at a time (a grounded stream is large)."""
    emb: dict[str, dict] = {}
    for spec in cfg["models"]:
        name = spec["name"]
        with timer(f"embed: {name}"):
            stream = load_language_stream(spec["source"], name, spec["prefix"], spec["text_encoder"], spec["tokenizer"])
            e = cfg["embedding"]
            embedder = WordEmbedder(stream, e["batch_size"], e["pool_special_tokens"], e["max_length"], e["cache"],
                                    vocabulary_sample=e["vocabulary_sample"])
            texts = _texts_to_embed(cfg, lex)
            table = dict(zip(texts, embedder.embed(texts)))
            emb[name] = {"table": table, "identity": stream.identity, "cache": str(embedder.cache_folder)}
            if Path(spec["source"]).expanduser().is_file():  # the report says which model each checkpoint holds
                emb[name]["checkpoint_class"] = checkpoint_class(Path(spec["source"]).expanduser())
            del stream, embedder
    return emb


class _ReportRun:
    """What every part of one report shares: the configuration, the lexical data, the models' embeddings and names
    (the first is the reference), the timer, the folder being written, and the paired bootstrap intervals so far."""

    def __init__(self, cfg: dict, lex: LexicalData, emb: dict[str, dict], timer: _Timer, folder: Path):
        self.cfg, self.lex, self.emb, self.timer, self.folder = cfg, lex, emb, timer, folder
        self.names = [m["name"] for m in cfg["models"]]
        self.found: list[intervals.Interval] = []
        self.pcas: dict = {}  # per model: the SemCat PCA of §4.1, which §4.2 projects the concepts on

    def embeddings(self, name: str, words: list[str]) -> np.ndarray:
        """Model ``name``'s vectors of ``words``, one row each."""
        return np.stack([self.emb[name]["table"][w] for w in words])

    def interval(self, statistic, n_units: int, measure: str, units: str) -> None:
        """A paired bootstrap row for the intervals table (none when intervals_part.n_resamples is 0)."""
        ip = self.cfg["intervals_part"]
        if ip["n_resamples"] > 0 and len(self.names) > 0:
            self.found.append(intervals.paired_bootstrap(statistic, n_units, self.names, measure, units,
                                                         ip["n_resamples"], ip["confidence"], ip["seed"]))


def _report_header(run: _ReportRun) -> list[str]:
    """The models (with the class of each checkpoint), the SemCat size and how the embeddings are standardised."""
    cfg, emb, semcat = run.cfg, run.emb, run.lex.semcat
    return ["# Semantic-space evaluation (VG-BERT §4.1-4.4)\n",
            "Models (first = reference): " + ", ".join(
                f"**{n}** (`{m['source']}`" + (f", a `{emb[n]['checkpoint_class'].rpartition('.')[2]}` checkpoint"
                                               if emb[n].get("checkpoint_class") else "") + ")"
                for n, m in zip(run.names, cfg["models"]))
            + ".\n",
            f"SemCat: {len(semcat.categories)} categories, {len(semcat.words)} entries, {len(run.lex.vocabulary)} "
            f"vocabulary words. Embeddings: `[CLS] w [SEP]`, last layer averaged "
            f"({'with' if cfg['embedding']['pool_special_tokens'] else 'without'} [CLS]/[SEP]), "
            "standardised by the statistics of "
            + (f"a seeded sample of {cfg['embedding']['vocabulary_sample']} token-vocabulary ids.\n"
               if cfg["embedding"]["vocabulary_sample"] else "the whole token vocabulary.\n")]


def _concreteness_section(run: _ReportRun) -> list[str]:
    """§4.1: PC1 of each model's SemCat space against human concreteness (Table 1, Fig. 3), the words at the ends of
    the first principal components, and the word- and category-level r's intervals."""
    semcat, names, tmp, E = run.lex.semcat, run.names, run.folder, run.embeddings
    cp = run.cfg["concreteness_part"]
    with run.timer("concreteness (§4.1)"):
        res = {n: concreteness.concreteness_analysis(E(n, semcat.words), semcat.words, semcat.category_index,
                                                     semcat.categories, run.lex.ratings, cp["pca_fit_on"], cp["n_pcs"],
                                                     cp["k_extremes"]) for n in names}
        run.pcas = {n: r.pca for n, r in res.items()}
        t1 = pd.DataFrame({"group": ["word-level", "category-level"],
                           **{n: [r.word_r, r.category_r] for n, r in res.items()},
                           **{f"paper {k}": list(v) for k, v in PAPER_TABLE1.items()}})
        t1.to_csv(tmp / "table1_concreteness.csv", index=False)
        pd.DataFrame([dict(model=n, word_r=r.word_r, word_p=r.word_p, category_r=r.category_r,
                           category_p=r.category_p, n_rated_entries=r.n_rated_entries, pc1_flipped=r.pc1_flipped,
                           **{f"evr_pc{i + 1}": v for i, v in enumerate(r.explained_variance_ratio)})
                      for n, r in res.items()]).to_csv(tmp / "concreteness_stats.csv", index=False)
        pd.concat([r.categories.assign(model=n) for n, r in res.items()]).to_csv(
            tmp / "concreteness_categories.csv", index=False)
        ext = pd.concat([r.extremes.assign(model=n) for n, r in res.items()])
        ext.to_csv(tmp / "principal_component_extremes.csv", index=False)
        concreteness.plot_categories(res, tmp / "fig3_concreteness.png", cp["label_categories"])
    n_rated = next(iter(res.values())).n_rated_entries
    conc = np.asarray([run.lex.ratings.get(w, np.nan) for w in semcat.words], dtype=np.float64)
    rated = ~np.isnan(conc)  # the entries the word-level r is over (concreteness_analysis's)
    run.interval(intervals.pearson_statistic(np.stack([res[n].entry_scores[rated, 0] for n in names]), conc[rated]),
                 int(rated.sum()), "concreteness r (entries)", "rated SemCat entries")
    cats = [res[n].categories for n in names]
    ok = (cats[0].n_rated > 0).to_numpy()
    run.interval(intervals.pearson_statistic(np.stack([c.mean_pc1.to_numpy()[ok] for c in cats]),
                                             cats[0].mean_concreteness.to_numpy()[ok]),
                 int(ok.sum()), "concreteness r (categories)", "SemCat categories")
    md = ["## Table 1: PC1 vs human concreteness (Pearson r)\n",
          f"{n_rated} rated SemCat entries; PC1 oriented so that concrete is positive.\n",
          markdown_table(t1), "", "![Fig. 3](fig3_concreteness.png)\n",
          f"### Top / bottom {cp['k_extremes']} words on the first {cp['n_pcs']} principal components\n"]
    for n in names:
        e_ = ext[ext.model == n]
        rows = [dict(pc=pc, top=", ".join(g[g.end == "top"].word), bottom=", ".join(g[g.end == "bottom"].word))
                for pc, g in e_.groupby("pc")]
        md += [f"**{n}**\n", markdown_table(pd.DataFrame(rows)), ""]
    return md


def _property_norms_section(run: _ReportRun) -> list[str]:
    """§4.2: per CSLB feature, an L1 logistic regression from the concepts' principal-axis projections (Eq. 11); the
    F1 per feature type, with the reference-vs-model Wilcoxon test (Fig. 4)."""
    semcat, norms, names, tmp, E = run.lex.semcat, run.lex.norms, run.names, run.folder, run.embeddings
    pn = run.cfg["property_norms_part"]
    frames = {}
    concept_texts = norms.concept_texts(pn["keep_sense"])
    for n in names:
        with run.timer(f"property norms (§4.2): {n}"):
            if n not in run.pcas:  # §4.1 was not run: the same PCA of the SemCat entries
                run.pcas[n] = concreteness.fit_pca(E(n, semcat.words))
            X = run.pcas[n].transform(E(n, concept_texts))
            if pn["n_components"]:
                X = X[:, : pn["n_components"]]
            t0 = time.perf_counter()
            fits = property_norms.fit_all_features(
                X, norms.labels, n_jobs=pn["n_jobs"], loo=pn["loo"], n_lambdas=pn["n_lambdas"],
                min_ratio=pn["lambda_min_ratio"], patience=pn["patience"])
            frames[n] = property_norms.results_frame(norms.features, norms.feature_types, fits, norms.labels.sum(0))
            print(f"[semantic_space]   {len(fits)} features, {X.shape[1]} dims, "
                  f"{time.perf_counter() - t0:.1f} s of fitting", flush=True)
    pd.concat([f.assign(model=n) for n, f in frames.items()]).to_csv(tmp / "property_norms_features.csv", index=False)
    run.interval(intervals.mean_statistic(np.stack([frames[n]["f1"].to_numpy() for n in names])),
                 len(norms.features), "property-norm F1 (features)", "CSLB features")
    summary = property_norms.summarise(frames, "f1")
    summary_loo = property_norms.summarise(frames, "loo_f1")
    summary.to_csv(tmp / "property_norms_summary.csv", index=False)
    summary_loo.to_csv(tmp / "property_norms_summary_loo_f1.csv", index=False)
    property_norms.plot_f1_boxes(frames, summary, tmp / "fig4_property_norms_f1.png")
    times = {n: run.timer.times[f"property norms (§4.2): {n}"] for n in names}
    return ["## Property norms (§4.2): F1 per feature type\n",
            f"{len(norms.features)} CSLB features (pf >= {pn['min_pf']}, >= {pn['min_concepts']} concepts), "
            f"{len(norms.concepts)} concepts; L1 logistic regression on "
            + (f"the first {pn['n_components']} principal-axis projections" if pn["n_components"] else
               "all principal-axis projections") + ", lambda by "
            f"{pn['loo']} leave-one-out over {pn['n_lambdas']} values; F1 of the all-concept refit (Eq. 11). "
            "not_predictable = features with F1 = 0; p = one-sided Wilcoxon signed-rank test that the model "
            f"beats {names[0]}. Time: " + ", ".join(f"{n} {t:.0f} s" for n, t in times.items()) + ".\n",
            markdown_table(summary), "", "Out-of-sample view (F1 of the leave-one-out predictions):\n",
            markdown_table(summary_loo), "", "![Fig. 4](fig4_property_norms_f1.png)\n"]


def _clustering_section(run: _ReportRun) -> list[str]:
    """§4.3: each SemCat category's modified silhouette (Eqs. 12-14), the categories gained most over the reference
    (Fig. 5), and the silhouette's and nearest-category accuracy's intervals."""
    semcat, names, tmp, E = run.lex.semcat, run.names, run.folder, run.embeddings
    with run.timer("clustering (§4.3)"):
        sil = {n: clustering.category_silhouettes(E(n, semcat.words), semcat.category_index, semcat.categories)
               for n in names}
        summary_c, gains = clustering.compare(sil, run.cfg["clustering_part"]["top_k"])
        K = len(semcat.categories)
        run.interval(intervals.mean_statistic(np.stack([sil[n].to_numpy() for n in names])), K,
                     "silhouette (categories)", "SemCat categories")
        nearest = {n: clustering.per_category_mean(
            clustering.nearest_category_correct(E(n, semcat.words), semcat.category_index, K),
            semcat.category_index, K) for n in names}
        run.interval(intervals.mean_statistic(np.stack([nearest[n] for n in names])), K,
                     "nearest-category accuracy (categories)", "SemCat categories")
        pd.DataFrame(sil).rename_axis("category").to_csv(tmp / "silhouettes.csv")
        summary_c.to_csv(tmp / "silhouette_summary.csv", index=False)
        gains.to_csv(tmp / "silhouette_top_gains.csv", index=False)
        clustering.plot(sil, gains, tmp / "fig5_silhouettes.png")
    md = ["## Category clustering (§4.3): modified silhouette (Eqs. 12-14)\n", markdown_table(summary_c), ""]
    if len(gains):
        md += [f"Top categories gained relative to {names[0]}:\n", markdown_table(gains), ""]
    return md + ["![Fig. 5](fig5_silhouettes.png)\n"]


def _table2(run: _ReportRun, queries: list[str], targets: list[str]) -> pd.DataFrame:
    """Table 2: each compositional query's target word, its cosine and rank in the vocabulary per model, and the
    paper's numbers when every query gives them."""
    E, vocabulary = run.embeddings, run.lex.vocabulary
    tables = {n: composition.query_ranks(E(n, queries), E(n, targets), E(n, vocabulary), queries, targets, vocabulary)
              for n in run.names}
    t2 = pd.DataFrame({"query": queries, "target": targets})
    for n, t in tables.items():
        t2[f"{n} cosine"] = t.cosine.round(2)
        t2[f"{n} rank"] = t["rank"]
    paper = [q.get("paper") for q in run.cfg["composition_part"]["queries"]]
    if all(p is not None for p in paper):
        t2["paper Bert (cos, rank)"] = [f"{p[0][0]:.2f}, {p[0][1]}" for p in paper]
        t2["paper Grounded"] = [f"{p[1][0]:.2f}, {p[1][1]}" for p in paper]
        t2["paper Relational"] = [f"{p[2][0]:.2f}, {p[2][1]}" for p in paper]
    return t2


def _slope_charts(run: _ReportRun, target_of: dict[str, str]) -> list[str]:
    """Per slope query and later model: how the query's nearest words move from the reference's ranks to the model's
    (CSV and chart); returns the files' stems."""
    comp, names, E, vocabulary, tmp = run.cfg["composition_part"], run.names, run.embeddings, run.lex.vocabulary, run.folder
    slope_files = []
    for q in comp["slope_queries"]:
        for n in names[1:]:
            rt = composition.rank_table(E(names[0], [q])[0], E(n, [q])[0], E(names[0], vocabulary),
                                        E(n, vocabulary), vocabulary, target_of.get(q), comp["slope_top_n"])
            stem = f"slope_{q.replace(' ', '_')}_{_safe(n)}"
            rt.to_csv(tmp / f"{stem}.csv", index=False)
            composition.plot_slope(rt, q, (names[0], n), tmp / f"{stem}.png", target_of.get(q))
            slope_files.append(stem)
    return slope_files


def _composition_section(run: _ReportRun) -> list[str]:
    """§4.4: compositional queries ranked among the vocabulary (Table 2), the top-k neighbours of single words
    (Tables 8-11) and slope charts against the reference."""
    comp, names, E, vocabulary, tmp = run.cfg["composition_part"], run.names, run.embeddings, run.lex.vocabulary, run.folder
    queries, targets = _composition_queries(run.cfg)
    with run.timer("composition (§4.4)"):
        t2 = _table2(run, queries, targets)
        t2.to_csv(tmp / "table2_composition.csv", index=False)
        nb = pd.concat([composition.neighbours(E(n, comp["neighbour_queries"]), comp["neighbour_queries"],
                                               E(n, vocabulary), vocabulary, comp["k"]).assign(model=n)
                        for n in names])
        nb.to_csv(tmp / "neighbours.csv", index=False)
        slope_files = _slope_charts(run, dict(zip(queries, targets)))
    md = [f"## Table 2: compositional queries (cosine, rank among {len(vocabulary)} words)\n",
          markdown_table(t2), "", f"### Top-{comp['k']} neighbours (Tables 8-11)\n"]
    wide = nb.groupby(["query", "model"], sort=False).word.agg(", ".join).unstack("model")[names]
    md += [markdown_table(wide.reset_index()), ""]
    return md + [f"![slope chart]({s}.png)\n" for s in slope_files]


def _word_similarity_section(run: _ReportRun) -> list[str]:
    """Not in the paper: Spearman rho of the word pairs' cosines with the human scores, on the 9 shared sets."""
    names, E = run.names, run.embeddings
    with run.timer("word similarity"):
        rows = []
        for set_name, pairs in run.lex.similarity_sets:
            gold = np.asarray([g for _, _, g in pairs], dtype=np.float64)
            cos = np.stack([composition.cosine_rows(E(n, [a for a, _, _ in pairs]), E(n, [b for _, b, _ in pairs]))
                            for n in names])
            stat = intervals.spearman_statistic(cos, gold)
            rho = stat(np.arange(len(pairs))[None])[:, 0]
            rows.append({"set": set_name, "pairs": len(pairs), **dict(zip(names, rho))})
            run.interval(stat, len(pairs), f"word similarity: {set_name}", "pairs")
        ws = pd.DataFrame(rows)
        ws.to_csv(run.folder / "word_similarity.csv", index=False)
    return ["## Word similarity (Spearman rho, cosine of the word embeddings)\n",
            "Not one of VG-BERT's analyses: the 9 shared sets, for a reader comparing with SemCLIP's STE report.\n",
            markdown_table(ws), ""]


SECTIONS = {"concreteness": _concreteness_section, "property_norms": _property_norms_section,
            "clustering": _clustering_section, "composition": _composition_section,
            "word_similarity": _word_similarity_section}


def _intervals_section(run: _ReportRun) -> list[str]:
    """The paired bootstrap intervals every part added (none when intervals are off)."""
    if not run.found:
        return []
    ip = run.cfg["intervals_part"]
    frame = pd.DataFrame([r for iv in run.found for r in iv.rows()])
    frame.to_csv(run.folder / "intervals.csv", index=False)
    return ["## Paired bootstrap intervals\n",
            f"Each cell: the value on all units [{100 * ip['confidence']:.0f} % percentile interval, "
            f"{ip['n_resamples']} resamples of the units, seed {ip['seed']}]. Δ: the model minus {run.names[0]}, "
            "paired (the same resamples); * = the interval excludes 0. The fitted parts (PCA axes, classifiers) "
            "stay fixed; the units are resampled. `paper`: the direction VG-BERT reports after grounding.\n",
            intervals.markdown(run.found), ""]


def _write_report_files(run: _ReportRun, md: list[str]) -> None:
    """report.md (with the timings table last), timings.json and the resolved config.yaml with each stream's identity."""
    timings = {k: round(v, 2) for k, v in run.timer.times.items()}
    md = md + ["## Timings (seconds)\n",
               markdown_table(pd.DataFrame({"part": list(timings), "seconds": list(timings.values())})), ""]
    (run.folder / "report.md").write_text("\n".join(md) + "\n")
    (run.folder / "timings.json").write_text(json.dumps(timings, indent=1))
    import yaml

    (run.folder / "config.yaml").write_text(yaml.safe_dump(
        {**run.cfg, "identities": {n: run.emb[n]["identity"] for n in run.names}}, sort_keys=False))


RECORD_NOTE = ("Written by python -m grounding.semantic_space --record: one row a measure of the report's paired "
               "bootstrap intervals (its intervals.csv): each model's value on all units (m<i>, the labels name the models) "
               "with its percentile interval over resamples of the units, and each later model minus the first (d<i>) "
               "with its paired interval (the same resamples). seeds is the resample seed (intervals_part.seed) when the "
               "config file or the command line names it, else null (resample_seed is the one used); the models' "
               "training seeds are their checkpoints' (models), not known to this command.")


def write_intervals_record(path: str | Path, found: list[intervals.Interval], cfg: dict, provenance_keys: dict) -> Path:
    """The report's intervals as a record (:mod:`grounding.docs_tables`): rows from
    :func:`grounding.semantic_space.intervals.record_rows`, with ``provenance_keys`` and the models, resamples,
    confidence and resample seed behind them."""
    if not found:
        raise UserInputError(f"--record {path}: this report has no intervals (intervals_part.n_resamples "
                             f"{cfg['intervals_part']['n_resamples']}, parts {cfg['parts']}); give --bootstrap N > 0 and "
                             f"one of the parts {list(INTERVAL_PARTS)}")
    ip = cfg["intervals_part"]
    columns, labels, rows = intervals.record_rows(found, ip["confidence"])
    return write_record(path, columns, rows, provenance_keys, title="Semantic space: paired bootstrap intervals",
                        provenance_note=RECORD_NOTE, labels=labels,
                        models=[{"name": m["name"], "source": str(m["source"])} for m in cfg["models"]],
                        resamples=ip["n_resamples"], confidence=ip["confidence"], resample_seed=ip["seed"],
                        report=str(Path(cfg["out"]) / "report.md"))


def run_report(config: dict, record: str | Path | None = None, record_provenance: dict | None = None) -> Path:
    """Run the analyses in ``config`` (see ``DEFAULTS``) and write the report folder; returns it. With ``record``
    (a path), also the intervals table as a record there, with ``record_provenance`` (default: :func:`provenance`
    of this process)."""

    cfg = merge_config(config)
    check_model_classes(cfg["models"])
    parts = [p for p in PARTS if p in cfg["parts"]]
    timer = _Timer()
    with timer("load lexical data"):
        lex = _load_lexical_data(cfg, parts)
    emb = _embed_models(cfg, lex, timer)
    out = Path(cfg["out"])
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        run = _ReportRun(cfg, lex, emb, timer, tmp)
        md = _report_header(run)
        for part in parts:  # PARTS order: §4.1 first, whose PCA §4.2 reuses
            md += SECTIONS[part](run)
        md += _intervals_section(run)
        _write_report_files(run, md)
    print(f"[semantic_space] report written to {out}", flush=True)
    if record is not None:
        written = write_intervals_record(record, run.found, cfg, record_provenance or provenance())
        print(f"[semantic_space] record written to {written}", flush=True)
    return out

def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)

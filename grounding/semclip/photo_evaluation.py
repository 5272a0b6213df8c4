"""SemCLIP on real photos (§5, Tables 3–4), e.g. the 125 Flickr8k test photos, with bootstrap intervals.

* Queries (§5 "Evaluating stability in retrieval"): every content noun of the split's captions (spaCy POS with
  WordNet compounds, :func:`grounding.semclip.alignment.caption_nouns`) is a query "A photo of a <noun>"; its
  sense is the one the suite's word-sense step (:func:`grounding.semclip.alignment.disambiguate`, content-word
  Lesk abstaining to the default sense) gives most often over its captions, and its synonym variants are the
  other lemmas of that synset, up to 10 in WordNet's order ("A photo of an automobile").
* Synonym-augmented relevance (Table 4): a noun's group is the noun and its variants; an image is relevant to
  every query of a group when one of its captions has a content noun in the group (same extraction, lower case).
* Table 3: overlap@k of a noun's top-k images and each variant's (seeded random tie-breaking), averaged over the
  (noun, variant) pairs. Table 4: NDCG@10 / mAP / R@10, text→image over every query, image→text over every image
  (candidates: all queries).
* Every mean comes with a 95 % percentile bootstrap interval over queries, and SemCLIP − VLM with a paired one
  (:func:`grounding.semclip.stability.bootstrap_means`): nouns with all their variants are resampled (they are
  not independent), images for image→text.
* Diagnostics for a loss: STE coverage of the queries and caption nouns, Γ_t's recovery error on held-out
  captions, how far the STE and Γ_t queries lie apart and how tight each space keeps synonyms, and the image side
  (Eq. 7): distinct image vectors, whether an image's nearest bank text shares a noun with its captions, and three
  reference systems (images as their own captions' STE targets; the VLM with images replaced by their nearest
  bank text; Eq. 7 with exact targets, i.e. each image its nearest bank text's own STE target, a perfect Γ_t on the
  bank, whose paired difference to SemCLIP is what Γ_t's error costs).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from data_modules.file_checks import MissingDataError
from data_modules.wordnet_lists import LEMMA_KEY
from grounding.composer.captions import read_captions as read_caption_set
from grounding.docs_tables import write_record
from grounding.lexicon import wordnet
from grounding.paths import cache_dir
from grounding.semclip.alignment import (
    CaptionTargets,
    caption_nouns,
    content_words,
    disambiguate,
    nearest_texts,
    pos_tagger,
    recovery_error,
)
from grounding.semclip.stability import (
    PROMPT,
    NounQuery,
    article,
    bootstrap_means,
    cosine,
    jsonable,
    method_name,
    metric_header,
    pair_overlaps,
    record_column,
    relevance,
    retrieval_per_query,
    synonym_pairs,
    system_scores,
    write_csv,
)
from grounding.semclip.store import SemCLIPStore
from grounding.summary_tables import finite_float
from grounding.utils.io import atomic_path, atomic_write_json

MAX_VARIANTS = 10  # Table 3: "for each query, we use ten synonyms"
METRICS = ("ndcg@10", "map", "recall@10")
TABLE4_ROWS = tuple(f"{d} {m}" for d in ("t2i", "i2t") for m in METRICS)  # Table 4's metrics, in its order
TABLE4_HEADERS = {"ndcg@10": "NDCG@10", "map": "mAP", "recall@10": "R@10"}  # the report's Table 4 header
EXACT_TARGETS = "Eq. 7 with exact targets (nearest bank text's own STE target, no Γ_t), STE query"
SKIPPED = {"VG-BERT search heads": "their stage 2 trains on Visual Genome (relations), which is not available "
                                   "offline, so no search-heads checkpoint exists for these photos"}


# ------------------------------------------------------------------------------------------------
# Photos, nouns, queries, relevance
# ------------------------------------------------------------------------------------------------
@dataclass
class PhotoSplit:
    paths: list[Path]
    captions: list[list[str]]  # each photo's captions
    name: str = ""


def read_photo_split(captions_file: str | Path, image_list: str | Path, images_dir: str | Path,
                     name: str = "") -> PhotoSplit:
    """The photos of ``image_list`` (one file name a line) present in ``images_dir``, with their captions from
    ``captions_file`` (a Flickr token file or any caption file naming images), in the list's order."""
    images_dir = Path(images_dir)
    for p in (captions_file, image_list):
        if not Path(p).is_file():
            raise MissingDataError(f"{p} does not exist (photo evaluation: a caption file and a split's image list)")
    cs = read_caption_set(captions_file, images_list=image_list)
    rows = [i for i, n in enumerate(cs.image_names) if (images_dir / n).is_file()]
    if not rows:
        raise MissingDataError(f"None of the {cs.n_images} captioned photos of {image_list} is in {images_dir}.")
    cs = cs.subset(rows)
    return PhotoSplit([images_dir / n for n in cs.image_names], [cs.captions_of(i) for i in range(cs.n_images)], name)


def synset_of(key: str | None) -> str | None:
    """``car.n.01.automobile`` -> ``car.n.01`` (an STE lemma key's synset)."""
    m = LEMMA_KEY.match(key) if key else None
    return key[:m.end("sense")] if m else None


@dataclass
class NounGroup:
    noun: str                 # a caption noun, as caption_nouns gives it ("car")
    synset: str | None        # its most frequent sense over the captions (None: not in WordNet)
    variants: list[str]       # other lemmas of that synset, up to MAX_VARIANTS ("auto", "automobile", ...)

    @property
    def words(self) -> list[str]:
        return [self.noun, *self.variants]


SENSES_VERSION = 1  # bump when caption_nouns / disambiguate change what a caption gives


def _senses_cache_file() -> Path:
    import spacy

    nlp = pos_tagger()
    model = f"{nlp.meta.get('name', '')}-{nlp.meta.get('version', '')}"
    return cache_dir() / "semclip" / f"caption_noun_senses-v{SENSES_VERSION}-spacy{spacy.__version__}-{model}.json"


def caption_noun_senses(captions: Sequence[str], wn=None, cache: bool = True) -> list[list[tuple[str, str | None]]]:
    """Each caption's (noun, WordNet synset) list: nouns by POS (caption_nouns), senses by the suite's Lesk on the
    caption's content words, abstaining to the default sense (disambiguate). A caption's result depends on its text
    alone, so results are kept per caption in one cache file (``cache``; keyed by the spaCy model and
    SENSES_VERSION): a store of 7,000 photos tags ~28,000 captions once, not once per VLM and protocol."""
    wn = wn or wordnet()
    path = _senses_cache_file() if cache else None
    known: dict[str, list] = {}
    if path is not None and path.is_file():
        try:
            known = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            known = {}  # unreadable: recomputed and rewritten
    todo = [c for c in dict.fromkeys(captions) if c not in known]
    for caption, doc in zip(todo, pos_tagger().pipe(todo, batch_size=256)):
        context = content_words(doc)
        known[caption] = [[n, synset_of(disambiguate(n, context, wn))] for n in caption_nouns(doc, wn)]
    if path is not None and todo:
        atomic_write_json(path, known)
    return [[(n, s) for n, s in known[c]] for c in captions]


def noun_groups(noun_senses: Sequence[Sequence[tuple[str, str | None]]], wn=None,
                max_variants: int = MAX_VARIANTS) -> list[NounGroup]:
    """One group per distinct caption noun (sorted): its majority sense (first seen on a tie) and that synset's
    other lemmas as variants (underscores as spaces, duplicates and the noun itself left out)."""
    wn = wn or wordnet()
    senses: dict[str, Counter] = {}
    for caption in noun_senses:
        for noun, synset in caption:
            senses.setdefault(noun, Counter())[synset] += 1
    groups = []
    for noun in sorted(senses):
        counts = senses[noun]
        synset = max((s for s in counts if s is not None), key=lambda s: counts[s], default=None)
        variants: list[str] = []
        if synset is not None:
            for lemma in wn.synset(synset).lemma_names():
                word = lemma.replace("_", " ")
                if word.lower() != noun.lower() and word.lower() not in {v.lower() for v in variants}:
                    variants.append(word)
        groups.append(NounGroup(noun, synset, variants[:max_variants]))
    return groups


def group_queries(groups: Sequence[NounGroup], prompt: str = PROMPT) -> list[NounQuery]:
    """"A photo of a <word>" for each group's noun (canonical) and variants; ``kind`` is the group's noun."""
    return [NounQuery(f"{prompt} {article(w)} {w}", w, g.noun, i == 0) for g in groups for i, w in enumerate(g.words)]


def image_kinds(groups: Sequence[NounGroup], noun_senses: Sequence[Sequence[tuple[str, str | None]]],
                caption_image: Sequence[int], n_images: int) -> list[set[str]]:
    """Synonym-augmented labels: image n carries group g when a caption of n has a noun among g's words
    (lower case), so every query of g (noun or variant) is relevant to it (stability.relevance)."""
    nouns: list[set[str]] = [set() for _ in range(n_images)]
    for caption, image in zip(noun_senses, caption_image):
        nouns[image].update(n.lower() for n, _ in caption)
    words = [(g.noun, {w.lower() for w in g.words}) for g in groups]
    return [{kind for kind, ws in words if ws & have} for have in nouns]


BANK_PROTOCOLS = ("tagging", "other-images")


@dataclass
class TaggingSplit:
    """Each store photo's captions split in two (§4 "Using SemCLIP for content stores": the store holds the images
    with the text that tags them): ``tags`` enter the text bank, ``labels`` give the relevance and the query nouns.
    ``tag_index`` / ``label_index``: the same captions as (photo, caption) positions, for checks."""
    tags: list[list[str]]
    labels: list[list[str]]
    tag_index: list[tuple[int, int]]
    label_index: list[tuple[int, int]]


def tagging_split(captions: Sequence[Sequence[str]], n_tags: int = 1, seed: int = 0) -> TaggingSplit:
    """``n_tags`` of each photo's captions, chosen at random (seeded, one draw for the whole store), tag it; the
    others are its labels. Every photo needs more than ``n_tags`` captions (ValueError naming the first that has
    not), so each keeps at least one label."""
    if n_tags < 1:
        raise ValueError(f"tagging captions: give 1 or more per photo; got {n_tags}")
    sizes = np.array([len(cs) for cs in captions], dtype=np.int64)
    short = np.flatnonzero(sizes <= n_tags)
    if short.size:
        raise ValueError(f"photo {int(short[0])} has {int(sizes[short[0]])} caption(s): tagging {n_tags} per photo "
                         f"leaves it no relevance caption; give fewer tagging captions or drop such photos")
    photo = np.repeat(np.arange(len(sizes)), sizes)
    keys = np.random.default_rng(seed).random(len(photo))
    order = np.lexsort((keys, photo))  # each photo's captions in a random order, photos in store order
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rank = np.empty(len(photo), dtype=np.int64)
    rank[order] = np.arange(len(photo)) - starts[photo[order]]  # a caption's place in its photo's random order
    position = np.arange(len(photo)) - starts[photo]
    is_tag = rank < n_tags
    tag_index = [(int(i), int(j)) for i, j in zip(photo[is_tag], position[is_tag])]
    label_index = [(int(i), int(j)) for i, j in zip(photo[~is_tag], position[~is_tag])]
    tags: list[list[str]] = [[] for _ in captions]
    labels: list[list[str]] = [[] for _ in captions]
    for i, j in tag_index:
        tags[i].append(captions[i][j])
    for i, j in label_index:
        labels[i].append(captions[i][j])
    return TaggingSplit(tags, labels, tag_index, label_index)


# ------------------------------------------------------------------------------------------------
# Evaluation
# ------------------------------------------------------------------------------------------------
def lazy(make: Callable[[], Callable]) -> Callable:
    """A lexical-variant lookup built on its first call (MiniLM over every STE form: minutes on a CPU), so a run
    whose queries are all in the STE never builds it."""
    built: list[Callable] = []

    def lookup(words):
        if not built:
            built.append(make())
        return built[0](words)

    return lookup


def _metric_units(scores: torch.Tensor, queries: Sequence[NounQuery], relevant: torch.Tensor,
                  ks: Sequence[int], i2t_images: int | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every metric's per-unit values and the query (cluster) each unit belongs to; image→text over the first
    ``i2t_images`` photos only (the evaluated ones of a store grown with distractors; None: all)."""
    pairs = synonym_pairs(queries)
    noun_of_pair = np.array([queries[a].word for a, _ in pairs])
    out = {f"overlap@{k}": (pair_overlaps(scores, queries, k).numpy(), noun_of_pair) for k in ks}
    per = retrieval_per_query(scores, relevant)
    kinds = np.array([q.kind for q in queries])
    for d in ("t2i", "i2t"):
        rows = per[d]["rows"].numpy()
        keep = rows < i2t_images if d == "i2t" and i2t_images is not None else np.ones(len(rows), dtype=bool)
        for m in METRICS:
            out[f"{d} {m}"] = (per[d][m].numpy()[keep], kinds[rows[keep]] if d == "t2i" else rows[keep])
    return out


def _bootstrap_table(units: dict[str, dict], n_resamples: int, confidence: float, seed: int) -> dict:
    """{metric: {system: {mean, low, high, diff, diff_low, diff_high}}}, differences to the first system."""
    systems = list(units)
    table = {}
    for metric in units[systems[0]]:
        clusters = units[systems[0]][metric][1]
        b = bootstrap_means(np.stack([units[s][metric][0] for s in systems]), clusters, n_resamples, confidence, seed)
        table[metric] = {s: {k: float(b[k][i]) for k in ("mean", "low", "high", "diff", "diff_low", "diff_high")}
                         | {"units": int(len(clusters)), "queries": int(b["clusters"])} for i, s in enumerate(systems)}
    return table


def _tightness(vectors: torch.Tensor, queries: Sequence[NounQuery]) -> dict[str, float]:
    """Mean cosine of (noun, variant) query pairs vs of (noun, other noun) pairs in one query space."""
    v = F.normalize(vectors.float(), dim=-1)
    pairs = synonym_pairs(queries)
    syn = float((v[[a for a, _ in pairs]] * v[[b for _, b in pairs]]).sum(-1).mean()) if pairs else float("nan")
    canon = v[[i for i, q in enumerate(queries) if q.canonical]]
    sim = canon @ canon.T
    other = float(sim[~torch.eye(len(canon), dtype=torch.bool)].mean()) if len(canon) > 1 else float("nan")
    return {"synonym_cosine": syn, "other_noun_cosine": other, "margin": syn - other}


def _check_bank_protocol(bank: str, distractors: PhotoSplit | None) -> None:
    """A known bank protocol; distractor photos only under ``tagging`` (the other protocol's bank may hold their
    own captions)."""
    if bank not in BANK_PROTOCOLS:
        raise ValueError(f"bank {bank!r}: give one of {BANK_PROTOCOLS}")
    if distractors is not None and bank != "tagging":
        raise ValueError("distractor photos need bank 'tagging': under 'other-images' the bank is the alignment "
                         "captions, which may be the distractors' own")


def _store_bank(vlm, tagging: TaggingSplit | None, pairs: dict | None, words: list[str],
                dim: int) -> tuple[list[str], torch.Tensor]:
    """The captions of the store's text bank (§4: the photos' tagging captions, or the alignment captions) and the
    VLM embeddings of the whole bank, those captions then the query ``words`` (``dim``: the VLM's text width)."""
    if tagging:
        bank_captions = [c for cs in tagging.tags for c in cs]
        bank_caption_vlm = vlm.encode_text(bank_captions).float()
    else:
        bank_captions = list(pairs["captions"]) if pairs is not None else []
        bank_caption_vlm = pairs["vlm_text"].float() if pairs is not None else torch.empty(0, dim)
    return bank_captions, torch.cat([bank_caption_vlm, vlm.encode_text(words).float()])


def _bank_targets(targets: CaptionTargets, tagging: TaggingSplit | None, pairs: dict | None, bank_captions: list[str],
                  words: list[str], dim: int) -> torch.Tensor:
    """Each bank text's own STE target (zeros where it has none): what a perfect Γ_t would give on the bank, for the
    exact-target reference (the alignment captions' targets come cached with their pairs)."""
    word_targets, word_kept = targets(words)
    bank_targets = torch.zeros(len(bank_captions) + len(words), dim)
    if tagging:
        tag_targets, tag_kept = targets(bank_captions)
        bank_targets[torch.nonzero(tag_kept).squeeze(1)] = tag_targets
    else:
        bank_targets[:len(pairs["targets"])] = pairs["targets"].float()
    bank_targets[len(bank_captions) + torch.nonzero(word_kept).squeeze(1)] = word_targets
    return bank_targets


def _gamma_t_cost(units: dict[str, dict], query_modes: Sequence[str], n_resamples: int, confidence: float,
                  seed: int) -> dict | None:
    """SemCLIP (first query mode) − the same store with exact targets on t2i NDCG@10, paired: what Γ_t's error costs
    (None without the exact-target reference or a SemCLIP system)."""
    if not (EXACT_TARGETS in units and query_modes):
        return None
    m, semclip = "t2i ndcg@10", method_name(query_modes[0])
    b = bootstrap_means(np.stack([units[EXACT_TARGETS][m][0], units[semclip][m][0]]), units[semclip][m][1],
                        n_resamples, confidence, seed)
    return {"metric": m, "system": semclip, "diff": float(b["diff"][1]), "diff_low": float(b["diff_low"][1]),
            "diff_high": float(b["diff_high"][1])}


def _own_tagging_caption_rate(tagging: TaggingSplit, nearest: torch.Tensor, n_bank_captions: int,
                              n_eval: int) -> dict[str, float]:
    """How often a photo's nearest bank text (Eq. 7) is its own tagging caption, over the evaluated photos and over
    the whole store."""
    tag_photo = torch.tensor([i for i, _ in tagging.tag_index])
    own_tag = (nearest < n_bank_captions) & (tag_photo[nearest.clamp(max=n_bank_captions - 1)]
                                             == torch.arange(len(nearest)))
    return {"evaluated": float(own_tag[:n_eval].float().mean()), "store": float(own_tag.float().mean())}


@torch.no_grad()
def evaluate_photos(vlm, transform, ste, split: PhotoSplit, pairs: dict | None = None,
                    train_idx: torch.Tensor | None = None, val_idx: torch.Tensor | None = None,
                    ks: Sequence[int] = (1, 5, 10), query_modes: Sequence[str] = ("ste", "transform"),
                    lexical: Callable | None = None, prompt: str = PROMPT, max_variants: int = MAX_VARIANTS,
                    n_resamples: int = 1000, confidence: float = 0.95, seed: int = 0, wn=None,
                    image_neighbours: int = 1, bank: str = "tagging", tagging_captions: int = 1,
                    tagging_seed: int = 0, distractors: PhotoSplit | None = None) -> dict:
    """Tables 3–4 on a photo split for the base VLM and SemCLIP (each query mode), with bootstrap intervals and the
    diagnostics of the module docstring. ``pairs``: the alignment pairs cache, whose captions (with their cached VLM
    embeddings) and the queries' words form the store's text bank (§4 "Using SemCLIP for content stores": the
    captions tagging images plus a base noun vocabulary); ``train_idx`` / ``val_idx``: its split (recovery error);
    ``lexical``: the lexical-variant lookup of nouns outside the STE (§4); ``image_neighbours``: 1 is Eq. 7, k > 1 an
    ablation (each photo the mean of Γ_t of its k nearest bank texts; the exact-target reference does the same).

    ``bank``: which captions the store's bank holds. ``tagging`` (§4, the paper's store): ``tagging_captions`` of
    each store photo's captions (seeded by ``tagging_seed``) tag it and enter the bank with the query words; the
    photo's other captions alone give its relevance and the query nouns (:func:`tagging_split`), so no relevance
    caption is ever in the bank. ``other-images``: every caption of an evaluated photo is a relevance label and the
    bank is the alignment captions (other images' text) with the query words. ``distractors``: more photos in the
    store (tagging only), labelled the same way from their own non-tagging captions; the queries still come from
    ``split``'s nouns and image→text is scored over ``split``'s photos."""
    t0 = time.perf_counter()
    wn = wn or wordnet()
    _check_bank_protocol(bank, distractors)
    n_eval = len(split.paths)
    store = split if distractors is None else PhotoSplit(split.paths + distractors.paths,
                                                         split.captions + distractors.captions, split.name)
    tagging = tagging_split(store.captions, tagging_captions, tagging_seed) if bank == "tagging" else None
    labels = tagging.labels if tagging else store.captions
    captions = [c for cs in labels for c in cs]
    caption_image = [i for i, cs in enumerate(labels) for _ in cs]
    n_eval_captions = sum(len(cs) for cs in labels[:n_eval])
    senses = caption_noun_senses(captions, wn)
    groups = noun_groups(senses[:n_eval_captions], wn, max_variants)  # the queries: the evaluated photos' nouns
    queries = group_queries(groups, prompt)
    texts = [q.text for q in queries]
    kinds = image_kinds(groups, senses, caption_image, len(store.paths))
    relevant = relevance(queries, kinds)
    image_vlm, query_vlm = vlm.encode_image(store.paths), vlm.encode_text(texts)

    words = list(dict.fromkeys(q.word for q in queries))  # the base noun vocabulary of the store's bank
    targets = CaptionTargets(ste, wn, lexical=lexical)
    bank_captions, bank_vlm = _store_bank(vlm, tagging, pairs, words, query_vlm.shape[1])
    bank_texts = bank_captions + words
    systems = system_scores(vlm, transform, ste, image_vlm, texts, query_vlm, bank_texts, bank_vlm, query_modes,
                            targets=targets, ids=[p.name for p in store.paths], image_neighbours=image_neighbours)

    # reference systems for the diagnosis (not SemCLIP): the image side replaced
    ste_store = SemCLIPStore(vlm, transform, ste, query_mode="ste", targets=targets)
    ste_query = ste_store.embed_queries(texts)
    cap_targets, kept = targets(captions)
    own = torch.zeros(len(store.paths), cap_targets.shape[1]).index_add_(
        0, torch.tensor(caption_image)[kept], cap_targets)  # each photo: the sum of its labels' STE targets
    nearest = systems[method_name(query_modes[0])][1] if query_modes else None
    reference = {"Oracle images (own captions' STE targets), STE query": cosine(ste_query, own)}
    if nearest is not None:
        reference["VLM, images as their nearest bank text (Eq. 7 in VLM space)"] = cosine(query_vlm, bank_vlm[nearest])
        if pairs is not None or tagging:  # Eq. 7 with a perfect Γ_t on the bank: each photo its nearest text's target
            bank_targets = _bank_targets(targets, tagging, pairs, bank_captions, words, cap_targets.shape[1])
            near = nearest_texts(image_vlm.float(), bank_vlm, image_neighbours)  # as the store's Eq. 7
            reference[EXACT_TARGETS] = cosine(ste_query, bank_targets[near].mean(1))

    units = {name: _metric_units(s, queries, relevant, ks, n_eval) for name, (s, _) in systems.items()}
    units |= {name: _metric_units(s, queries, relevant, ks, n_eval) for name, s in reference.items()}
    table = _bootstrap_table(units, n_resamples, confidence, seed)
    gamma_cost = _gamma_t_cost(units, query_modes, n_resamples, confidence, seed)

    pairs_idx = synonym_pairs(queries)
    per_pair = {name: [[queries[a].word, queries[b].word, *(float(units[name][f"overlap@{k}"][0][i]) for k in ks)]
                       for i, (a, b) in enumerate(pairs_idx)] for name in systems}

    n_kept = int(kept[:n_eval_captions].sum())  # the evaluated photos' labels come first
    diagnostics = _diagnostics(vlm, transform, ste, targets, queries, texts, query_vlm, ste_query, systems, bank_texts,
                               len(words), senses[:n_eval_captions], caption_image[:n_eval_captions],
                               captions[:n_eval_captions], cap_targets[:n_kept], kept[:n_eval_captions], pairs,
                               train_idx, val_idx, wn, ks)
    diagnostics["gamma_t_cost"] = gamma_cost
    if tagging and nearest is not None and nearest.dim() == 1:  # Eq. 7 at its best picks the photo's own tagging caption
        diagnostics["nearest_is_own_tagging_caption"] = _own_tagging_caption_rate(tagging, nearest, len(bank_captions),
                                                                                  n_eval)
    return {"split": split.name, "n_images": n_eval, "n_store_images": len(store.paths),
            "n_distractors": len(store.paths) - n_eval, "bank": bank,
            "tagging_captions": tagging_captions if tagging else None,
            "tagging_seed": tagging_seed if tagging else None,
            "n_captions": n_eval_captions, "n_nouns": len(groups),
            "n_nouns_with_synonyms": sum(bool(g.variants) for g in groups), "n_queries": len(queries),
            "n_pairs": len(pairs_idx), "ks": list(ks), "bank_size": len(bank_texts), "image_neighbours": image_neighbours,
            "bank_captions": len(bank_texts) - len(words), "bank_words": len(words), "systems": list(systems),
            "reference_systems": list(reference), "skipped": SKIPPED, "table": table, "pairs": per_pair,
            "bootstrap": {"n_resamples": n_resamples, "confidence": confidence, "seed": seed, "method": "percentile"},
            "groups": [g.__dict__ for g in groups], "diagnostics": diagnostics,
            "seconds": round(time.perf_counter() - t0, 2)}


def _diagnostics(vlm, transform, ste, targets, queries, texts, query_vlm, ste_query, systems, bank_texts, n_words,
                 senses, caption_image, captions, cap_targets, kept, pairs, train_idx, val_idx, wn, ks) -> dict:
    """The measurements behind a loss (see the module docstring)."""
    out: dict = {}
    # STE coverage: the queries' and the captions' nouns with an STE item, through a lexical variant, or neither
    docs = list(pos_tagger().pipe(texts, batch_size=256))
    per_query = [targets.doc_keys(doc) for doc in docs]
    oov = sorted({n for keys, o in per_query if not keys for n in o})
    mapped = dict(zip(oov, targets.lexical(oov))) if oov and targets.lexical is not None else {}
    status = ["ste" if keys else "lexical" if any(mapped.get(n) in ste.index for n in o) else "none" if o else "no noun"
              for keys, o in per_query]
    canonical = [s for s, q in zip(status, queries) if q.canonical]
    out["query_coverage"] = {"queries": dict(Counter(status)), "nouns": dict(Counter(canonical)),
                             "nouns_not_in_ste": [q.word for s, q in zip(status, queries) if q.canonical and s != "ste"]}
    caption_docs = list(pos_tagger().pipe(list(captions), batch_size=256))
    tokens = [targets.doc_keys(doc) for doc in caption_docs]
    out["caption_noun_coverage"] = {"in_ste": sum(len(k) for k, _ in tokens), "outside_ste": sum(len(o) for _, o in tokens),
                                    "captions_without_ste_noun": int((~kept).sum()), "captions": len(captions)}
    # Γ_t (Eq. 8): recovery error on the alignment pairs (train / held-out) and on this split's captions
    rec = {}
    if pairs is not None:
        for name, idx in (("train pairs", train_idx), ("held-out pairs", val_idx)):
            if idx is not None and len(idx):
                pred = transform(pairs["vlm_text"][idx].float())
                rec[name] = _recovery(pred, pairs["targets"][idx].float())
    if bool(kept.any()):
        kept_captions = [c for c, k in zip(captions, kept.tolist()) if k]
        rec[f"{len(kept_captions)} evaluation captions"] = _recovery(transform(vlm.encode_text(kept_captions).float()),
                                                                    cap_targets)
    out["recovery"] = rec
    # queries: the STE query vs Γ_t of the VLM query, and how tight each space keeps synonyms
    transform_query = transform(query_vlm.float())
    out["query_gap"] = {"ste_vs_transform_cosine": float(F.cosine_similarity(ste_query, transform_query).mean()),
                        "transform_query_nearest_is_own_ste_query": _nearest_own(transform_query, ste_query)}
    out["synonym_tightness"] = {"VLM": _tightness(query_vlm, queries), "STE query": _tightness(ste_query, queries),
                                "Γ_t query": _tightness(transform_query, queries)}
    # the image side (Eq. 7): distinct vectors, and whether the nearest bank text shares a noun with the photo's captions
    image_nouns: list[set[str]] = [set() for _ in range(int(max(caption_image)) + 1)]
    for caption, image in zip(senses, caption_image):
        image_nouns[image].update(n.lower() for n, _ in caption)
    side = {}
    for name, (_, nearest) in systems.items():
        if nearest is None:
            continue
        nearest = nearest[:len(image_nouns)]  # the evaluated photos (a grown store lists its distractors after them)
        texts_near = [bank_texts[j] for j in nearest.tolist()]
        near_nouns = [{n.lower() for n, _ in c} for c in caption_noun_senses(texts_near, wn)]
        hits = [bool(a & b) for a, b in zip(near_nouns, image_nouns)]
        side[name] = {"distinct_image_vectors": int(nearest.unique().numel()), "images": len(hits),
                      "nearest_text_shares_a_noun": float(np.mean(hits)),
                      "nearest_is_a_bank_word": float((nearest >= len(bank_texts) - n_words).float().mean()),
                      "examples": [[str(i), sorted(image_nouns[i])[:6], texts_near[i]] for i in range(min(5, len(hits)))]}
    out["image_side"] = side
    # Table 3 with ties in one fixed photo order for every query (break_ties shuffles each query's ties on its own)
    pairs_idx = synonym_pairs(queries)
    a, b = torch.tensor([p[0] for p in pairs_idx], dtype=torch.long), torch.tensor([p[1] for p in pairs_idx], dtype=torch.long)
    out["overlap_fixed_tie_order"] = {}
    for name, (scores, _) in (systems.items() if pairs_idx else ()):
        tops = {k: ranked_fixed_order(scores, min(k, scores.shape[1])) for k in ks}
        out["overlap_fixed_tie_order"][name] = {k: float((t[a][:, :, None] == t[b][:, None, :]).any(-1).float().mean())
                                                for k, t in tops.items()}
    return out


def ranked_fixed_order(scores: torch.Tensor, k: int, seed: int = 0) -> torch.Tensor:
    """Top-k ids with ties in one seeded random photo order shared by every query (a store's fixed secondary key),
    where break_ties orders each query's ties independently: the sensitivity of Table 3 to that choice."""
    perm = torch.randperm(scores.shape[1], generator=torch.Generator().manual_seed(seed))
    return perm[scores[:, perm].sort(dim=-1, descending=True, stable=True).indices[:, :k]]


def _recovery(pred: torch.Tensor, target: torch.Tensor) -> dict:
    return {"pairs": int(len(pred)), "recovery_error": recovery_error(pred, target),
            "cosine": float(F.cosine_similarity(pred, target).mean()), "mse": float(((pred - target) ** 2).sum(-1).mean())}


def _nearest_own(a: torch.Tensor, b: torch.Tensor) -> float:
    """Share of rows of ``a`` whose nearest row of ``b`` (cosine) is an identical copy of their own row of ``b``."""
    nearest = (F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T).argmax(-1)
    return float(((b[nearest] - b).abs().amax(-1) < 1e-6).float().mean())


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------
def _f(x: float, digits: int = 3, sign: str = "") -> str:
    return f"{round(x, digits) + 0.0:{sign}.{digits}f}"  # + 0.0: no "-0.000"


def _ci(r: dict) -> str:
    if np.isnan(r["low"]):
        return _f(r["mean"])
    return f"{_f(r['mean'])} [{_f(r['low'])}, {_f(r['high'])}]"


def _diff(r: dict) -> str:
    if np.isnan(r["diff_low"]):
        return _f(r["diff"], sign="+")
    star = " *" if r["diff_low"] > 0 or r["diff_high"] < 0 else ""
    return f"{_f(r['diff'], sign='+')} [{_f(r['diff_low'], sign='+')}, {_f(r['diff_high'], sign='+')}]{star}"


def verdict(table: dict, system: str, base: str = "VLM") -> dict[str, list[str]]:
    """Metrics where ``system`` beats / loses to ``base`` (the paired interval excludes 0) or ties."""
    out: dict[str, list[str]] = {"wins": [], "loses": [], "ties": []}
    for metric, row in table.items():
        r = row[system]
        out["wins" if r["diff_low"] > 0 else "loses" if r["diff_high"] < 0 else "ties"].append(metric)
    return out


def write_photo_report(results: dict, out: str | Path, provenance: dict | None = None, title: str = "") -> Path:
    """``out/`` with report.md (Tables 3–4 with intervals, SemCLIP − VLM, the verdict, the diagnosis),
    stability.csv, retrieval.csv, differences.csv, stability_pairs.csv, diagnostics.json-in-results.json and
    results.json; each file written atomically."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table, ks = results["table"], results["ks"]
    systems, reference = results["systems"], results["reference_systems"]
    cols = ("mean", "low", "high")
    write_csv(out / "stability.csv", ["system", "k", "pairs", "nouns", *cols],
               [[s, k, table[f"overlap@{k}"][s]["units"], table[f"overlap@{k}"][s]["queries"],
                 *(f"{table[f'overlap@{k}'][s][c]:.4f}" for c in cols)] for s in systems + reference for k in ks])
    write_csv(out / "retrieval.csv", ["system", "direction", "metric", "queries", *cols],
               [[s, d, m, table[f"{d} {m}"][s]["units"], *(f"{table[f'{d} {m}'][s][c]:.4f}" for c in cols)]
                for s in systems + reference for d in ("t2i", "i2t") for m in METRICS])
    write_csv(out / "differences.csv", ["system", "minus", "metric", "diff", "diff_low", "diff_high"],
               [[s, systems[0], metric, *(f"{row[s][c]:.4f}" for c in ("diff", "diff_low", "diff_high"))]
                for metric, row in table.items() for s in systems[1:] + reference])
    write_csv(out / "stability_pairs.csv", ["system", "noun", "synonym"] + [f"overlap@{k}" for k in ks],
               [[s, *row[:2], *(f"{v:.4f}" for v in row[2:])] for s, rows in results["pairs"].items() for row in rows])
    with atomic_path(out / "results.json") as tmp:
        tmp.write_text(json.dumps({**results, "provenance": provenance or {}}, indent=2, default=str))

    b = results["bootstrap"]
    n = results["n_images"]
    lines = [f"# {title or 'SemCLIP on real photos'} (Tables 3–4)", ""]
    if provenance:
        lines += [f"- {k}: `{v}`" for k, v in provenance.items() if v is not None] + [""]
    lines += [f"Photos: {n} ({results['split']} split), {results['n_captions']} relevance captions; {results['n_nouns']} "
              f"distinct caption nouns, {results['n_nouns_with_synonyms']} with WordNet synonyms; {results['n_queries']} "
              f"queries (\"{PROMPT} a <noun>\" for each noun and up to {MAX_VARIANTS} synonym variants), "
              f"{results['n_pairs']} (noun, synonym) pairs. {bank_sentence(results)} Nothing was tuned on these photos: "
              "the prompt, the ≤ "
              f"{MAX_VARIANTS} variants, the k's, the bank and the bootstrap follow the paper and the world report "
              "(`--split dev` runs the same on the dev photos, the split for any choice).", "",
              f"Each cell: mean [{100 * b['confidence']:.0f} % {b['method']} bootstrap interval, {b['n_resamples']} "
              f"resamples of the queries, seed {b['seed']}]. Δ: system − {systems[0]}, paired (the same resamples); "
              "* = the interval excludes 0.", "",
              "## Table 3: retrieval stability (overlap@k of a noun's and its synonyms' top-k photos)", "",
              "| System | " + " | ".join(metric_header(f"overlap@{k}") for k in ks) + " |", "|---" * (len(ks) + 1) + "|"]
    lines += [f"| {s} | " + " | ".join(_ci(table[f"overlap@{k}"][s]) for k in ks) + " |" for s in systems]
    lines += [f"| {s} | " + " | ".join(f"skipped: {why}" if i == 0 else "" for i in range(len(ks))) + " |"
              for s, why in results["skipped"].items()]
    lines += [f"| Δ {s} | " + " | ".join(_diff(table[f"overlap@{k}"][s]) for k in ks) + " |" for s in systems[1:]]
    u = table[f"overlap@{ks[0]}"][systems[0]]
    lines += ["", f"{u['units']} (noun, synonym) pairs of {u['queries']} nouns; the bootstrap resamples nouns (each with "
                  "all its pairs). Ties (SemCLIP photos sharing their nearest bank text share a vector, Eq. 7) are broken "
                  "at random with a fixed seed (grounding.retrieval_metrics.break_ties), never by photo order.", "",
              "## Table 4: retrieval with synonym-augmented relevance (@10)", "",
              "| System | " + " | ".join(metric_header(m, TABLE4_HEADERS) for m in TABLE4_ROWS) + " |",
              "|---|---|---|---|---|---|---|"]
    rows4 = list(TABLE4_ROWS)
    lines += [f"| {s} | " + " | ".join(_ci(table[m][s]) for m in rows4) + " |" for s in systems]
    lines += [f"| {s} | skipped: {why} | | | | | |" for s, why in results["skipped"].items()]
    lines += [f"| Δ {s} | " + " | ".join(_diff(table[m][s]) for m in rows4) + " |" for s in systems[1:]]
    t2i, i2t = table["t2i ndcg@10"][systems[0]], table["i2t ndcg@10"][systems[0]]
    lines += ["", f"Relevance: a noun's group is the noun and its synonym variants; a photo is relevant to every query of "
                  "the group when one of its captions has a content noun (spaCy POS + WordNet compounds, lemmatised, "
                  "lower case) among the group's words. t2i: "
                  f"{t2i['units']} queries, resampled by noun ({t2i['queries']} nouns); i2t: {i2t['units']} photos, each "
                  f"ranking all {results['n_queries']} queries, resampled by photo.", ""]
    lines += ["## Verdict", ""]
    for s in systems[1:]:
        v = verdict(table, s)
        lines.append(f"- **{s}** vs {systems[0]}: better on {len(v['wins'])} of {len(table)} metrics"
                     f"{' (' + ', '.join(v['wins']) + ')' if v['wins'] else ''}, worse on {len(v['loses'])}"
                     f"{' (' + ', '.join(v['loses']) + ')' if v['loses'] else ''}, no clear difference on "
                     f"{len(v['ties'])}.")
    lines += ["", "## Diagnosis", ""]
    lines += _diagnosis_lines(results, table, systems, reference, rows4, ks)
    lines += ["", f"Computed in {results['seconds']} s by `python -m grounding.semclip evaluate` (photo mode).", ""]
    with atomic_path(out / "report.md") as tmp:
        tmp.write_text("\n".join(lines), encoding="utf-8")
    return out


def bank_sentence(results: dict) -> str:
    """What the store holds, in one sentence of the report."""
    store = (f"The store: the {results['n_images']} photos and {results['n_distractors']} distractor photos (labelled "
             "from their own non-tagging captions; image→text is scored on the evaluated photos only). "
             if results.get("n_distractors") else "")
    if results.get("bank", "other-images") == "tagging":
        own = results["diagnostics"].get("nearest_is_own_tagging_caption")
        return (store + f"Bank protocol `tagging` (§4, the paper's store): {results['tagging_captions']} caption(s) of "
                f"each stored photo (seed {results['tagging_seed']}) tag it; its other captions alone are relevance "
                f"labels and query nouns. SemCLIP's text bank: {results['bank_captions']} tagging captions + "
                f"{results['bank_words']} query words"
                + (f"; Eq. 7 picks a photo's own tagging caption for {100 * own['evaluated']:.1f} % of the evaluated "
                   "photos." if own else "."))
    return (store + "Bank protocol `other-images`: every caption of an evaluated photo is a relevance label, so none "
            f"is in the bank; SemCLIP's text bank: {results['bank_captions']} alignment captions (other images' text) + "
            f"{results['bank_words']} query words.")


def _sign(r: dict) -> int:
    """+1 / -1 when the paired interval of the difference lies above / below 0, else 0."""
    return 1 if r["diff_low"] > 0 else -1 if r["diff_high"] < 0 else 0


def _reading(table: dict, systems: list[str], reference: list[str], d: dict) -> list[str]:
    """What the reference systems say about where a difference comes from, on t2i NDCG@10 (read from the
    intervals, no threshold of its own)."""
    m = "t2i ndcg@10"
    if len(reference) < 2 or len(systems) < 2 or m not in table:
        return []
    oracle, eq7 = (table[m][s] for s in reference[:2])
    semclip = table[m][systems[1]]
    word = {1: "above", -1: "below", 0: "not clearly different from"}
    out = [f"- **Reading ({m}).** {systems[1]} is {word[_sign(semclip)]} the VLM ({_diff(semclip)}). With each photo "
           f"given its own captions' STE targets, the same STE queries are {word[_sign(oracle)]} the VLM "
           f"({_diff(oracle)}): "
           + ("the STE queries retrieve these photos when the photos carry their captions' STE vectors, so the gap "
              f"between this reference ({_ci(oracle)}) and {systems[1]} ({_ci(semclip)}) is what the image side "
              "(Eq. 7: nearest bank text, then Γ_t) costs. " if _sign(oracle) >= 0 else
              "even ideal photo vectors do not rescue the STE queries: the text side (STE, senses, queries) is a "
              "bottleneck by itself. ")
           + f"Replacing each photo by its nearest bank text in the VLM's own space puts the VLM "
           f"{word[_sign(eq7)]} itself ({_diff(eq7)})"
           + (": the nearest-text step of Eq. 7 alone loses retrieval quality, before Γ_t." if _sign(eq7) < 0 else ".")]
    cost = d.get("gamma_t_cost")
    if cost:
        exact = table[m][EXACT_TARGETS]
        # cost["diff"] = SemCLIP − the exact-target store: below 0, Γ_t's error loses retrieval quality
        lost = {-1: "Γ_t's error costs retrieval quality here",
                1: "the store does better with Γ_t than with the exact targets",
                0: "Γ_t's error is not what costs retrieval quality here"}[_sign(cost)]
        out.append(f"- **Γ_t or the nearest text?** With each photo given its nearest bank text's exact STE target (a "
                   f"perfect Γ_t on the bank), the STE queries reach {_ci(exact)}; {cost['system']} − this store: "
                   f"{_f(cost['diff'], sign='+')} [{_f(cost['diff_low'], sign='+')}, {_f(cost['diff_high'], sign='+')}]"
                   f"{' *' if _sign(cost) else ''} (paired): {lost}"
                   + ("; the rest of the gap to the oracle is Eq. 7's: a photo stands for its nearest bank text, not "
                      "for its own captions." if _sign(oracle) > 0 else "."))
    return out


def _diagnosis_lines(results, table, systems, reference, rows4, ks) -> list[str]:
    d = results["diagnostics"]
    qc, cc = d["query_coverage"], d["caption_noun_coverage"]
    nq = sum(qc["queries"].values())
    nn = sum(qc["nouns"].values())
    lines = [f"- **STE coverage.** Queries whose noun has an STE item: {qc['queries'].get('ste', 0)} of {nq}; through a "
             f"lexical variant (§4): {qc['queries'].get('lexical', 0)}; neither: {qc['queries'].get('none', 0)}; no noun "
             f"found by the tagger in the query: {qc['queries'].get('no noun', 0)} (the last two fall back to Γ_t of "
             f"the VLM query). Caption nouns whose own query has an STE item: {qc['nouns'].get('ste', 0)} of {nn}"
             + (f" (not: {', '.join(qc['nouns_not_in_ste'][:12])}{', …' if len(qc['nouns_not_in_ste']) > 12 else ''})"
                if qc["nouns_not_in_ste"] else "")
             + f". Noun tokens of the {cc['captions']} captions: {cc['in_ste']} in the STE, {cc['outside_ste']} outside; "
             f"{cc['captions_without_ste_noun']} captions without an STE noun."]
    if d["recovery"]:
        lines.append("- **Γ_t recovery error** (§4, nearest-target recovery; the paper's < 4 % is its training fit): "
                     + "; ".join(f"{name}: {100 * r['recovery_error']:.1f} % of {r['pairs']} (cosine to target "
                                 f"{r['cosine']:.3f})" for name, r in d["recovery"].items()) + ".")
    g, t = d["query_gap"], d["synonym_tightness"]
    lines.append(f"- **STE query vs Γ_t query.** Mean cosine between a query's STE vector and Γ_t of its VLM vector: "
                 f"{g['ste_vs_transform_cosine']:.3f}; the Γ_t query's nearest STE query is its own for "
                 f"{100 * g['transform_query_nearest_is_own_ste_query']:.1f} % of the queries. Synonym tightness "
                 "(mean cosine of (noun, variant) query pairs / of two different nouns / margin): "
                 + "; ".join(f"{s} {v['synonym_cosine']:.3f} / {v['other_noun_cosine']:.3f} / {v['margin']:+.3f}"
                             for s, v in t.items()) + ".")
    for name, s in d["image_side"].items():
        lines.append(f"- **Image side (Eq. 7), {name}.** {s['distinct_image_vectors']} distinct vectors for "
                     f"{s['images']} photos; the nearest bank text shares a noun with the photo's captions for "
                     f"{100 * s['nearest_text_shares_a_noun']:.1f} % of the photos; it is a bare query word for "
                     f"{100 * s['nearest_is_a_bank_word']:.1f} %.")
        break  # the same bank and images for every query mode
    fixed = d.get("overlap_fixed_tie_order") or {}
    if fixed:
        lines.append("- **Tie order.** Table 3 with ties in one fixed random photo order shared by all queries (a store's "
                     "secondary key; the table above shuffles each query's ties on its own): "
                     + "; ".join(f"{s} " + ", ".join(f"@{k} {v:.3f}" for k, v in r.items()) for s, r in fixed.items())
                     + ".")
    lines += _reading(table, systems, reference, d)
    if reference:
        lines += ["", "Reference systems (not SemCLIP; each Δ against the VLM):", "",
                  "| System | " + " | ".join(f"Overlap@{k}" for k in ks) + " | " + " | ".join(rows4) + " |",
                  "|---" * (len(ks) + len(rows4) + 1) + "|"]
        for s in reference:
            cells = [table[f"overlap@{k}"][s] for k in ks] + [table[m][s] for m in rows4]
            lines.append(f"| {s} | " + " | ".join(_ci(c) for c in cells) + " |")
            lines.append(f"| Δ {s} | " + " | ".join(_diff(c) for c in cells) + " |")
    return lines


# ------------------------------------------------------------------------------------------------
# Records (grounding.docs_tables): Tables 3–4 as data
# ------------------------------------------------------------------------------------------------
def _record_cells(table: dict, metrics: Sequence[str], system: str | None,
                  keys: tuple[str, str, str] = ("mean", "low", "high")) -> dict:
    """A record row's numbers: for each metric ``X``, ``system``'s ``keys`` (value, low, high) as ``X``, ``X_low``,
    ``X_high`` (not finite, or no ``system``: null)."""
    row = {}
    for metric in metrics:
        column = record_column(metric)
        for suffix, key in zip(("", "_low", "_high"), keys):
            row[column + suffix] = None if system is None else finite_float(table[metric][system][key])
    return row


def photo_record_table(results: dict) -> tuple[list[str], dict[str, str], list[dict]]:
    """Tables 3–4 of :func:`write_photo_report` as one record table (``columns``, ``labels``, ``rows``), their rows in
    the report's order: each system (its mean and bootstrap interval per metric), each skipped system (null, with
    ``skipped``: why), then ``Δ <system>`` for each system after the first (the paired difference to the first and
    its interval). Columns: ``system``, then ``X`` and ``X_ci`` (``[X_low, X_high]``) for overlap@k of each k
    (``overlap_at<k>``) and Table 4's six metrics (``t2i_ndcg_at10``, ``t2i_map``, ``t2i_recall_at10``, the same for
    i2t); labels: the report's headers."""
    table, systems = results["table"], results["systems"]
    metrics = [f"overlap@{k}" for k in results["ks"]] + list(TABLE4_ROWS)
    ci = f"{100 * results['bootstrap']['confidence']:g} % CI"
    labels = {"system": "System"}
    for metric in metrics:
        labels |= {record_column(metric): metric_header(metric, TABLE4_HEADERS), f"{record_column(metric)}_ci": ci}
    rows = [{"system": s, **_record_cells(table, metrics, s)} for s in systems]
    rows += [{"system": s, **_record_cells(table, metrics, None), "skipped": why} for s, why in results["skipped"].items()]
    rows += [{"system": f"Δ {s}", **_record_cells(table, metrics, s, ("diff", "diff_low", "diff_high"))}
             for s in systems[1:]]
    return list(labels), labels, rows


PHOTO_RECORD_NOTE = ("Written by python -m grounding.semclip evaluate --photos --record: Tables 3–4 of the report "
                     "(report.md) as one table, its rows in the report's order. A system's row: each metric's mean over "
                     "the queries with its percentile bootstrap interval (X_low / X_high; the queries resampled by noun "
                     "with all its synonym pairs, by photo for i2t). A skipped system: null, `skipped` says why. A "
                     "'Δ <system>' row: that system minus the first (the base VLM), paired (the same resamples); the "
                     "report stars it where the interval excludes 0. seeds is the bootstrap seed (--seed); the VLM's, "
                     "the STE's and Γ_t's training seeds are their runs', not known to this command.")


def write_photo_record(path: str | Path, results: dict, provenance_keys: dict, inputs: dict | None = None,
                       report: str | Path | None = None, title: str = "") -> Path:
    """The photo report's Tables 3–4 (:func:`photo_record_table`) as a record at ``path``, with ``provenance_keys``
    (:func:`grounding.docs_tables.provenance`), the systems compared, the photos, queries, bank protocol and
    bootstrap behind the rows, the inputs and the report's path."""
    columns, labels, rows = photo_record_table(results)
    b = results["bootstrap"]
    return write_record(path, columns, rows, provenance_keys, title=title or "SemCLIP on real photos (Tables 3–4)",
                        provenance_note=PHOTO_RECORD_NOTE, labels=labels, systems=list(results["systems"]),
                        skipped=dict(results["skipped"]), ks=list(results["ks"]), split=results["split"],
                        n_images=results["n_images"], n_store_images=results.get("n_store_images"),
                        n_queries=results["n_queries"], n_nouns=results["n_nouns"], n_pairs=results["n_pairs"],
                        bank=results.get("bank"), tagging_captions=results.get("tagging_captions"),
                        image_neighbours=results.get("image_neighbours"), resamples=b["n_resamples"],
                        confidence=b["confidence"], interval=b["method"], bootstrap_seed=b["seed"],
                        inputs=jsonable(inputs or {}), report=None if report is None else str(report))


SUMMARY_METRICS = ("overlap@10", "t2i ndcg@10", "t2i map", "i2t ndcg@10")


def write_photo_summary(reports: Sequence[str | Path], out: str | Path, title: str = "") -> Path:
    """One table over several photo reports (``results.json`` of :func:`write_photo_report`: base VLMs × bank
    protocols × stores): each metric of SUMMARY_METRICS for the VLM and SemCLIP (STE query) with intervals, and the
    paired Δ. Writes ``out/summary.md`` and ``out/summary.csv`` (atomically)."""
    rows = []
    for folder in reports:
        path = Path(folder) / "results.json"
        if not path.is_file():
            raise MissingDataError(f"{path} does not exist: run `python -m grounding.semclip evaluate --photos ...` "
                                   f"with --out {folder} first")
        r = json.loads(path.read_text())
        prov = r.get("provenance") or {}
        semclip = next((s for s in r["systems"][1:] if "STE" in s), r["systems"][-1])
        rows.append({"report": str(folder), "vlm": prov.get("vlm", ""), "bank": r.get("bank", "other-images"),
                     "store": r.get("n_store_images", r["n_images"]), "evaluated": r["n_images"],
                     "bank_captions": r["bank_captions"], "system": semclip,
                     **{m: (r["table"][m][r["systems"][0]], r["table"][m][semclip])
                        for m in SUMMARY_METRICS if m in r["table"]}})
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    metrics = [m for m in SUMMARY_METRICS if all(m in row for row in rows)]
    write_csv(out / "summary.csv", ["report", "vlm", "bank", "store_photos", "evaluated_photos", "bank_captions", "system"]
              + [f"{m} {c}" for m in metrics for c in ("vlm", "semclip", "diff", "diff_low", "diff_high")],
              [[row["report"], row["vlm"], row["bank"], row["store"], row["evaluated"], row["bank_captions"],
                row["system"]] + [f"{v:.4f}" for m in metrics for v in (row[m][0]["mean"], row[m][1]["mean"],
                                                                        row[m][1]["diff"], row[m][1]["diff_low"],
                                                                        row[m][1]["diff_high"])] for row in rows])
    lines = [f"# {title or 'SemCLIP on real photos: every report side by side'}", "",
             "Each cell: VLM → SemCLIP (STE query), then SemCLIP − VLM with its paired 95 % bootstrap interval (* = the "
             "interval excludes 0). Bank `tagging`: one caption of each stored photo tags it (§4), the others are the "
             "labels; `other-images`: all captions are labels, the bank is other images' captions.", "",
             "| Base VLM | Bank | Store photos | " + " | ".join(metrics) + " |", "|---" * (3 + len(metrics)) + "|"]
    for row in rows:
        vlm = Path(str(row["vlm"]).partition(":")[2] or row["vlm"]).parent.parent.name or row["vlm"]
        cells = [f"{_f(row[m][0]['mean'])} → {_f(row[m][1]['mean'])}, Δ {_diff(row[m][1])}" for m in metrics]
        lines.append(f"| {vlm} | {row['bank']} | {row['store']:,} | " + " | ".join(cells) + " |")
    lines += ["", "Reports: " + ", ".join(f"`{row['report']}`" for row in rows), ""]
    with atomic_path(out / "summary.md") as tmp:
        tmp.write_text("\n".join(lines), encoding="utf-8")
    return out


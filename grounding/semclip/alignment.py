"""The semantic alignment transform and SemCLIP projection (SemCLIP §4, Eqs. 6–8).

* ``VLM``: the protocol a vision-language model plugs in through (``encode_image``,
  ``encode_text``); the adapters (suite checkpoints, Hugging Face CLIP, open_clip) are in ``vlm.py``.
* ``AlignmentTransform``: Γ_t, the MLP of Eq. 8 (VLM text space -> STE space; 512 -> 4096 ->
  4096 -> 300 at paper scale), trained with MSE by ``fit_alignment`` (AdamW 1e-3, batch 512).
* Targets: a caption's nouns (WordNet-lookup noun detector, Lesk sense disambiguation with a
  first-sense fallback) mapped to STE lemma items and averaged; out-of-vocabulary nouns go to
  their nearest WordNet noun form under the offline MiniLM.
* ``semclip_project_images``: Eq. 7, an image takes Γ_t of its nearest text in VLM space.
* ``SemanticIndex``: cosine-similarity search (exact torch; FAISS when installed and asked for).
* ``overlap_at_k``: retrieval stability between a query's and its synonyms' top-k lists (Table 3).
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Callable, Protocol, Sequence, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from data_modules.wordnet_lists import LEMMA_KEY
from grounding.checkpoints import CheckpointError, load_checkpoint_file
from grounding.errors import MissingInputError, UserInputError
from grounding.lexicon import load_spacy, wordnet
from grounding.nets import RecordedNet, net_hparams
from grounding.paths import cache_dir, resolve_path
from grounding.retrieval_metrics import break_ties
from grounding.semclip.evaluation import TextEncoderEmbedder, cached_encode
from grounding.semclip.ste import STEEmbedding
from grounding.utils.io import atomic_path, sha1_of_file


# ------------------------------------------------------------------------------------------
# VLM protocol
# ------------------------------------------------------------------------------------------
@runtime_checkable
class VLM(Protocol):
    """What SemCLIP needs from a vision-language model: both encoders into one joint space."""

    def encode_image(self, images: torch.Tensor) -> torch.Tensor: ...  # (B, 3, H, W) -> (B, d)

    def encode_text(self, texts: Sequence[str]) -> torch.Tensor: ...   # N strings -> (N, d)


# ------------------------------------------------------------------------------------------
# Γ_t (Eq. 8)
# ------------------------------------------------------------------------------------------
class AlignmentTransform(RecordedNet):
    """Eq. 8: FC3(ReLU(FC2(ReLU(FC1(·))))), VLM text space -> STE space."""

    def __init__(self, in_dim: int = 512, out_dim: int = 300, hidden: int = 4096):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, out_dim))

    def forward(self, c_t: torch.Tensor) -> torch.Tensor:
        return self.net(c_t)


def alignment_loss(predicted: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Eq. 8: ||Γ_t(C_t) - C'_t||²₂, summed over the STE dimensions, averaged over the batch."""
    return F.mse_loss(predicted, targets, reduction="none").sum(-1).mean()


def save_transform(transform: AlignmentTransform, path: str | Path, **provenance) -> Path:
    """Γ_t as a self-describing file (widths + weights + e.g. the VLM spec / STE path), written atomically."""

    lin = [m for m in transform.net if isinstance(m, nn.Linear)]
    payload = {"format": "semclip-alignment-transform/1", "in_dim": lin[0].in_features, "out_dim": lin[-1].out_features,
               "hidden": lin[0].out_features, "state_dict": transform.state_dict(), "provenance": provenance}
    with atomic_path(path, suffix=".pt") as tmp:
        torch.save(payload, tmp)
    return Path(path)


def load_transform(path: str | Path) -> tuple[AlignmentTransform, dict]:
    """Γ_t from :func:`save_transform`'s file or a ``SemCLIPAlignment`` Lightning checkpoint;
    returns the transform (eval mode) and its provenance (VLM spec, STE path, when recorded)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise MissingInputError(f"No alignment transform at {p}: train one with `python -m grounding fit --config "
                                "experiments/semclip/align_world.yaml` (it writes model.init_args.export_path).")
    try:
        obj = load_checkpoint_file(p, "alignment transform")
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - not a file torch.save wrote: the user's to fix
        raise MissingInputError(f"{p} is not an alignment transform (unreadable by torch.load: {type(e).__name__}); "
                                "give the export_path file of an alignment run or its checkpoint") from None
    if isinstance(obj, dict) and obj.get("format", "").startswith("semclip-alignment-transform"):
        t = AlignmentTransform(obj["in_dim"], obj["out_dim"], obj["hidden"])
        t.load_state_dict(obj["state_dict"])
        return t.eval(), dict(obj.get("provenance") or {})
    if isinstance(obj, dict) and "state_dict" in obj:
        state = {k[len("transform."):]: v for k, v in obj["state_dict"].items() if k.startswith("transform.")}
        hp = net_hparams(obj.get("hyper_parameters") or {})
        if not state or hp.get("in_dim") is None:
            raise ValueError(f"{p} is a Lightning checkpoint but not of grounding.semclip.SemCLIPAlignment.")
        t = AlignmentTransform(hp["in_dim"], hp["out_dim"], hp["hidden"])
        t.load_state_dict(state)
        return t.eval(), dict(obj.get("semclip_alignment") or {})
    raise ValueError(f"{p} is neither a saved alignment transform nor a SemCLIPAlignment checkpoint.")


class AlignmentMismatchError(UserInputError, ValueError):
    """Γ_t queried through another VLM than the one it was fitted on (its text space is another space)."""


def _same_vlm(fitted: str, spec: str) -> bool | None:
    """Whether two VLM specs name the same model: suite checkpoints by file (a hard link or a copy is the same
    checkpoint), other specs by their resolved text; None when the fitted one's file is gone (cannot tell)."""
    if fitted.startswith("suite:") and spec.startswith("suite:"):
        a, b = (resolve_path(s.removeprefix("suite:")) for s in (fitted, spec))
        if not (a.is_file() and b.is_file()):
            return None
        return os.path.samefile(a, b) or (a.stat().st_size == b.stat().st_size and sha1_of_file(a) == sha1_of_file(b))
    kind_a, _, rest_a = fitted.partition(":")
    kind_b, _, rest_b = spec.partition(":")
    return kind_a == kind_b and resolve_path(rest_a) == resolve_path(rest_b)


def check_fitted_vlm(provenance: dict, spec: str, transform_path: str | Path) -> None:
    """Refuse to query Γ_t (``transform_path``, its recorded ``provenance``) through the VLM ``spec`` when it was
    fitted on another one: Γ_t maps one VLM's text space, so another checkpoint's vectors (even the same model's
    last epoch instead of its dev-best) give a silently wrong store. An unrecorded or vanished fitted VLM passes."""
    fitted = provenance.get("vlm")
    if isinstance(fitted, str) and fitted and _same_vlm(fitted, spec) is False:
        raise AlignmentMismatchError(f"Γ_t {transform_path} was fitted on the VLM {fitted}, but it is queried through "
                                     f"{spec}: name the same checkpoint (semclip.vlm) or refit Γ_t on this VLM.")


def fit_alignment(transform: AlignmentTransform, vlm_text: torch.Tensor, ste_targets: torch.Tensor, epochs: int = 200,
                  batch_size: int = 512, lr: float = 1e-3, weight_decay: float = 1e-2, seed: int = 0,
                  log: Callable[[int, float], None] | None = None) -> list[float]:
    """Train Γ_t with the MSE of Eq. 8 (AdamW); returns the mean loss of every epoch."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(transform.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    transform.train()
    for epoch in range(epochs):
        perm = torch.randperm(len(vlm_text), generator=g)
        total = 0.0
        for idx in perm.split(batch_size):
            loss = alignment_loss(transform(vlm_text[idx]), ste_targets[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        losses.append(total / len(vlm_text))
        if log is not None:
            log(epoch, losses[-1])
    transform.eval()
    return losses


@torch.no_grad()
def recovery_error(predicted: torch.Tensor, targets: torch.Tensor) -> float:
    """§4's nearest-neighbour recovery error: fraction of pairs whose prediction's nearest target
    (cosine) is not its own target (distinct target rows; identical targets count as recovered)."""
    p, t = F.normalize(predicted, dim=-1), F.normalize(targets, dim=-1)
    nearest = (p @ t.T).argmax(dim=-1)
    same = (t[nearest] - t).abs().amax(dim=-1) < 1e-6
    return float(1.0 - same.float().mean())


# ------------------------------------------------------------------------------------------
# Caption vocabulary -> STE targets
# ------------------------------------------------------------------------------------------
_WORD = re.compile(r"[a-z]+(?:[-'][a-z]+)*")
# Closed-class words: never nouns, never Lesk evidence ("a", "in", "it").
_STOP = frozenset("""a an the and or but of in on at to for with by from up down over under into onto off out as is are was were be been
being has have had do does did it its this that these those there here he she they them his her their our we you i me my your
some any all each every no not very too so than then while who whom which what where when why how one two three four five
six seven eight nine ten near next behind front top side other another several many few more most while""".split())
# Nouns that name the depiction, not its content, in a prompt's "a photo of a car": dropped when "of" follows.
DEPICTION_NOUNS = frozenset({"photo", "photograph", "picture", "image", "pic", "snapshot", "shot", "closeup", "close-up"})
_NOUN_TAGS = frozenset({"NOUN", "PROPN"})
_NOT_IN_COMPOUND = frozenset({"DET", "ADP", "PRON", "AUX", "CCONJ", "SCONJ", "PUNCT", "PART", "NUM"})
_CONTENT_TAGS = frozenset({"NOUN", "PROPN", "VERB", "ADJ"})


@functools.lru_cache(maxsize=1)
def pos_tagger():
    """spaCy's small English pipeline without parser and NER (tagger + lemmatizer), loaded once."""
    return load_spacy(exclude=("parser", "ner"))


def caption_nouns(doc, wn) -> list[str]:
    """The content nouns of a tagged caption (a spaCy ``Doc``), in order: the longest WordNet noun compound
    (up to 3 words, at least one tagged a noun, no closed-class word: "hot dog", "fire hydrant") at each
    position, else a token tagged NOUN / PROPN, lemmatised (WordNet's base form when it has one). A depiction
    noun followed by "of" ("a photo of a car") is the prompt, not content. Nouns outside WordNet ("selfie")
    are kept: the lexical-variant step maps them (§4)."""
    tokens = list(doc)
    out, i = [], 0
    while i < len(tokens):
        for n in (3, 2):
            span = tokens[i:i + n]
            if (len(span) == n and any(t.pos_ in _NOUN_TAGS for t in span)
                    and not any(t.pos_ in _NOT_IN_COMPOUND for t in span)):
                base = wn.morphy("_".join(t.text.lower() for t in span), "n")
                if base is not None:
                    out.append(base.replace("_", " "))
                    i += n
                    break
        else:
            tok = tokens[i]
            text = tok.text.lower()
            following = tokens[i + 1].text.lower() if i + 1 < len(tokens) else ""
            if (tok.pos_ in _NOUN_TAGS and _WORD.fullmatch(text) and text not in _STOP and len(text) > 1
                    and not (text in DEPICTION_NOUNS and following == "of")):
                lemma = tok.lemma_.lower() if _WORD.fullmatch(tok.lemma_.lower() or "") else text
                base = wn.morphy(lemma, "n") or wn.morphy(text, "n")
                out.append((base or lemma).replace("_", " "))
            i += 1
    return out


def content_words(doc) -> set[str]:
    """Lesk's context: the lemmas of the caption's nouns, verbs and adjectives (closed-class words carry no
    evidence about a sense, and counting them is what makes plain Lesk pick railcar for "a photo of a car")."""
    return {t.lemma_.lower() for t in doc if t.pos_ in _CONTENT_TAGS and t.lemma_.lower() not in _STOP}


@functools.lru_cache(maxsize=1 << 16)
def _signature(synset) -> frozenset[str]:
    text = " ".join([synset.definition(), *synset.examples(), *(lem.name().replace("_", " ") for lem in synset.lemmas())])
    return frozenset(w for w in _WORD.findall(text.lower()) if w not in _STOP)


def disambiguate(noun: str, context: set[str], wn, known: Callable[[str], bool] | None = None) -> str | None:
    """The STE lemma key (``synset.lemma``) of ``noun`` in a caption (§4 "word sense disambiguation").

    Simplified Lesk on content words: the sense whose gloss, examples and lemmas share most words with the
    caption's content words (``context``, the noun itself left out). With no shared word, Lesk abstains and the
    noun's default sense is taken: the first sense whose synset WordNet names after the noun (hamper ->
    hamper.n.02, the basket, not shackle.n.01, where "hamper" is a minor lemma), else WordNet's first sense
    (its most frequent). ESC, the paper's disambiguator, needs a model that is not available offline.
    ``known``: a synset-name predicate (the senses the semantic memory holds): when some senses pass, the
    choice is among those only (a subset STE, e.g. the embedded world's)."""
    name = noun.replace(" ", "_")
    synsets = wn.synsets(name, pos="n")
    if not synsets:
        return None
    if known is not None:
        synsets = [s for s in synsets if known(s.name())] or synsets
    head = name.lower()
    default = next((s for s in synsets if s.name().split(".")[0].lower() == head), synsets[0])
    evidence = set(context) - {noun.lower(), *noun.lower().split()}
    overlaps = [len(_signature(s) & evidence) for s in synsets]
    best = max(overlaps)
    sense = default if best == 0 or overlaps[synsets.index(default)] == best else synsets[overlaps.index(best)]
    lemma = next((lem.name() for lem in sense.lemmas() if lem.name().lower() == head), sense.lemmas()[0].name())
    return f"{sense.name()}.{lemma}"


class CaptionTargets:
    """STE targets for captions and queries (§4): the mean STE vector of a text's disambiguated content nouns.

    Nouns by spaCy's POS tagger (:func:`caption_nouns`), senses by Lesk on content words with a default sense
    when it abstains (:func:`disambiguate`). ``lexical``: maps nouns outside the STE (not in WordNet, like
    "selfie", or a sense the STE lacks) to STE lemma keys (the paper's SBERT nearest lexical variants;
    :func:`minilm_lexical_variants` builds one); without it they are dropped."""

    def __init__(self, ste: STEEmbedding, wn=None, lexical: Callable[[Sequence[str]], list[str | None]] | None = None):
        if wn is None:
            wn = wordnet()
        self.ste, self.wn, self.lexical = ste, wn, lexical
        self.synsets = frozenset(k[:m.end("sense")] for k in ste.keys if (m := LEMMA_KEY.match(k)))

    def doc_keys(self, doc) -> tuple[list[str], list[str]]:
        """(STE keys of the text's nouns, its nouns outside the STE)."""
        context = content_words(doc)
        keys, oov = [], []
        for noun in caption_nouns(doc, self.wn):
            key = disambiguate(noun, context, self.wn, known=self.synsets.__contains__)
            if key is not None and key in self.ste.index:
                keys.append(key)
            else:
                oov.append(noun)
        return keys, oov

    def _with_variants(self, per_text: list[tuple[list[str], list[str]]]) -> list[list[str]]:
        """Each text's keys plus its outside nouns' lexical variants: one lookup for all the texts' distinct nouns."""
        outside = sorted({noun for _, oov in per_text for noun in oov})
        mapped = dict(zip(outside, self.lexical(outside))) if outside and self.lexical is not None else {}
        return [keys + [mapped[n] for n in oov if mapped.get(n) in self.ste.index] for keys, oov in per_text]

    def keys(self, caption: str) -> list[str]:
        return self._with_variants([self.doc_keys(pos_tagger()(caption))])[0]

    def __call__(self, captions: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(targets (N, d_ste), kept (N,) bool): captions without any STE noun are dropped."""
        per_text = [self.doc_keys(doc) for doc in pos_tagger().pipe(list(captions), batch_size=256)]
        vecs, kept = [], []
        for keys in self._with_variants(per_text):
            rows = [self.ste.index[k] for k in keys]
            kept.append(bool(rows))
            if rows:
                vecs.append(self.ste.vectors[rows].mean(0))
        return (torch.stack(vecs) if vecs else torch.empty(0, self.ste.dim)), torch.tensor(kept, dtype=torch.bool)


def minilm_lexical_variants(ste: STEEmbedding, encoder: str = "minilm", batch_size: int = 512,
                            min_similarity: float = -1.0):
    """OOV noun -> the STE lemma key of its nearest WordNet noun form under a sentence encoder
    (None when that cosine similarity is below ``min_similarity``). The forms' vectors are computed once per
    encoder and form list (minutes on a CPU) and cached, as the STE report's (grounding.semclip.evaluation)."""

    embedder = TextEncoderEmbedder(encoder, batch_size=batch_size)
    index = ste.surface_index()
    forms = sorted(index)
    bank = cached_encode(embedder, forms, cache_dir() / "semclip" / "encoder_vectors")

    def lookup(words: Sequence[str]) -> list[str | None]:
        if not words:
            return []
        best, nearest = (embedder.encode([w.lower() for w in words]) @ bank.T).max(-1)
        return [ste.keys[index[forms[j]][0]] if b >= min_similarity else None
                for b, j in zip(best.tolist(), nearest.tolist())]

    return lookup


# ------------------------------------------------------------------------------------------
# Eq. 7 and retrieval
# ------------------------------------------------------------------------------------------
def nearest_texts(image_vlm: torch.Tensor, text_vlm: torch.Tensor, k: int = 1) -> torch.Tensor:
    """(N, k) indices of each image's k nearest texts by cosine in the VLM space, nearest first."""
    if not 1 <= k <= len(text_vlm):
        raise ValueError(f"image_neighbours must lie in [1, {len(text_vlm)}] (the bank's texts); got {k}")
    sim = F.normalize(image_vlm, dim=-1) @ F.normalize(text_vlm, dim=-1).T
    return sim.argmax(dim=-1, keepdim=True) if k == 1 else sim.topk(k, dim=-1).indices


@torch.no_grad()
def semclip_project_images(image_vlm: torch.Tensor, text_vlm: torch.Tensor, text_semclip: torch.Tensor,
                           neighbours: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 7: Γ_i(C_i) = Γ_t(C_{t_i}) with t_i = argmin_t' cosine distance(C_i, C_t').

    ``text_semclip`` holds Γ_t of every text (rows aligned with ``text_vlm``). ``neighbours`` k > 1 (not the
    paper's: an ablation) averages Γ_t of the image's k nearest texts instead. Returns the images' SemCLIP vectors
    and the index of each image's nearest text."""
    near = nearest_texts(image_vlm, text_vlm, neighbours)
    return text_semclip[near].mean(1), near[:, 0]


class SemanticIndex:
    """Cosine-similarity index over vectors: ``backend="torch"`` exact matmul (default); with faiss-cpu
    installed, ``"faiss"`` (exact inner-product IndexFlatIP), and the approximate ``"faiss-ivf"``
    (inverted lists, ``nlist`` ≈ 4√N cells, ``nprobe`` searched) and ``"faiss-hnsw"`` (HNSW graph,
    M=32, ``ef_search``) for large collections."""

    BACKENDS = ("torch", "faiss", "faiss-ivf", "faiss-hnsw")

    def __init__(self, vectors: torch.Tensor, backend: str = "torch", nprobe: int = 16, ef_search: int = 64):
        self.vectors = F.normalize(torch.as_tensor(vectors, dtype=torch.float32), dim=-1)
        self.backend = backend
        if backend not in self.BACKENDS:
            raise ValueError(f"backend must be one of {self.BACKENDS}, got {backend!r}")
        if backend.startswith("faiss"):
            try:
                import faiss
            except ImportError as e:
                raise ImportError(f"backend={backend!r} needs faiss-cpu (`pip install -e '.[ann]'` or `pip install "
                                  "faiss-cpu`); backend='torch' is exact and needs nothing.") from e
            faiss.omp_set_num_threads(torch.get_num_threads())
            n, d = self.vectors.shape
            x = self.vectors.numpy()
            if backend == "faiss":
                self._faiss = faiss.IndexFlatIP(d)
            elif backend == "faiss-ivf":
                nlist = max(1, min(n // 39, int(4 * n ** 0.5)))  # faiss wants >= 39 training points a cell
                self._faiss = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
                self._faiss.train(x)
                self._faiss.nprobe = min(nprobe, nlist)
            else:
                self._faiss = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
                self._faiss.hnsw.efSearch = ef_search
            self._faiss.add(x)

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        q = F.normalize(torch.as_tensor(queries, dtype=torch.float32), dim=-1)
        k = min(k, len(self.vectors))
        if self.backend != "torch":
            scores, idx = self._faiss.search(np.ascontiguousarray(q.numpy()), k)
            scores, idx = torch.from_numpy(scores), torch.from_numpy(idx).long()
            # Approximate backends return id -1 when fewer than k items were reachable: score -inf, and
            # callers must skip negative ids (never index with them).
            return scores.masked_fill(idx < 0, float("-inf")), idx
        scores = q @ self.vectors.T
        # equal scores (Eq. 7's shared vectors) in a seeded random order: re-ranked only in the rows whose top k + 1
        # hold a tie (break_ties costs ~40x a top-k over a large store)
        top = scores.topk(min(k + 1, scores.shape[1]), dim=-1)
        idx = top.indices[:, :k]
        tied = (top.values[:, 1:] == top.values[:, :-1]).any(-1)
        if bool(tied.any()):
            idx = idx.clone()
            idx[tied] = break_ties(scores[tied]).topk(k, dim=-1).indices
        return scores.gather(-1, idx), idx


def overlap_at_k(query_topk: torch.Tensor, synonym_topk: torch.Tensor) -> float:
    """Table 3: mean |top-k(q) ∩ top-k(q')| / k over (query, synonym-variant) pairs.
    query_topk: (N, k) retrieved ids for each query; synonym_topk: (N, S, k) for its S variants."""
    n, s, k = synonym_topk.shape
    inter = (query_topk[:, None, :, None] == synonym_topk[:, :, None, :]).any(-1).sum(-1)  # (N, S)
    return float(inter.float().mean() / k)


def retrieval_scores(scores: torch.Tensor, relevant: torch.Tensor, k: int = 10) -> dict[str, float]:
    """NDCG@k, mAP and R@k (torchmetrics.retrieval) of a (Q, N) score matrix with (Q, N) boolean
    relevance (ground truth already augmented with synonym labels)."""
    from torchmetrics.retrieval import RetrievalMAP, RetrievalNormalizedDCG, RetrievalRecall

    q, n = scores.shape
    indexes = torch.arange(q)[:, None].expand(q, n).reshape(-1)
    preds, target = scores.reshape(-1).float(), relevant.reshape(-1).bool()
    return {f"ndcg@{k}": float(RetrievalNormalizedDCG(top_k=k)(preds, target, indexes=indexes)),
            "map": float(RetrievalMAP()(preds, target, indexes=indexes)),
            f"recall@{k}": float(RetrievalRecall(top_k=k)(preds, target, indexes=indexes))}

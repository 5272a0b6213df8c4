"""The retrieval explorer's models: each leaderboard row whose files exist, loaded once, answering a text query over a
gallery of photos (and a photo over the gallery's captions), with what the row's paper says about why it matched.

Four kinds, by the checkpoint's class (the config's class must be the checkpoint's):

* :class:`VectorModel` — one vector per image and per text (the CLIP-style dual encoder, VG-BERT's search heads, VSE):
  :class:`grounding.semclip.vlm.SuiteVLM`, cosine similarity.
* :class:`MatchMapModel` — VG-BERT stage 1 (:class:`grounding.vgbert.pretrain.GroundingPretrain`): visual tokens
  per image, word tokens per text, Eq. 1's match-map score (the module's own ``eval_scores``); the per-word match
  maps M = V·Lᵀ of one image are the explanation.
* :class:`CrossModel` — COMPOSER, ViLBERT-style, ViLBERT + MVSA (:class:`RegionRetrievalModule`): region tokens per
  image, each text cross-encoded with a first stage's top-K images (the module's own ``score_caption_batch``);
  COMPOSER's explanation is the query's Concept & Relation Graph with each concept's score on one image.
* :class:`SemCLIPModel` — the content store on its VLM (the test set's training captions as the bank, the gallery
  ingested by Eq. 7); the explanation is the query's WordNet synonyms, each one's top-k and its overlap@k.

Everything text-independent (gallery image encodings, caption encodings) is computed once per checkpoint and
gallery and cached under ``.cache/explore/`` (keyed by the checkpoint's path, size and time and the gallery's
files; temporary name, then rename). Frozen backbone maps come from the suite's feature cache, so every model on
one backbone reads them once.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import yaml

from data_modules.captions import CaptionDataset
from data_modules.collate import tokenize
from grounding import feature_cache as fcache
from grounding.checkpoints import CheckpointError, checkpoint_class, read_checkpoint
from grounding.cli import build_stage, resolved_config
from grounding.composer.graph_build import texts_batch
from grounding.composer.training import ComposerTraining, RegionRetrievalModule
from grounding.composer.vse_vilbert import VSETraining
from grounding.errors import UserInputError
from grounding.leaderboard.board import ModelEntry, TestSet, missing_files, reference_data
from grounding.lexicon import wordnet
from grounding.nets import class_of, regrouped_config
from grounding.paths import cache_dir, resolve_path
from grounding.semclip.alignment import check_fitted_vlm, load_transform
from grounding.semclip.ste import STEEmbedding
from grounding.semclip.store import SemCLIPStore
from grounding.semclip.vlm import SuiteVLM, cosine_scores, load_vlm
from grounding.utils.io import atomic_path, sha1_of_json
from grounding.vgbert.match_map import match_map
from grounding.vgbert.pretrain import GroundingPretrain

MAX_QUERY_CHARS = 300
GALLERY_SPLITS = ("test", "all")
CHUNK = 256  # gallery images encoded at a time


class ExplorerError(UserInputError, ValueError):
    """A configuration the explorer cannot serve (one line at start-up, exit status 2)."""


def _norm(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


@dataclass
class Gallery:
    """The photos a query searches (a caption DataModule's test split) and their captions."""

    name: str
    image_paths: list[Path]
    captions: list[list[str]]
    bank: list[str]  # the same data's training captions (SemCLIP's text bank: no gallery caption tags a photo)

    @classmethod
    def from_test_set(cls, test_set: TestSet, splits: str = "test") -> "Gallery":
        """The test set's ``test`` split, or ``all`` of its splits (train, val, test: every photo of the data)."""
        if splits not in GALLERY_SPLITS:
            raise ExplorerError(f"--gallery {splits!r}: one of {GALLERY_SPLITS}")
        dm = reference_data(test_set)  # a missing photo folder or caption file: one LeaderboardError line
        parts = [dm.test_dataset] if splits == "test" else [
            d for d in (getattr(dm, f"{s}_dataset", None) for s in ("train", "val", "test")) if d is not None]
        paths = [Path(p) for d in parts for p in d.image_paths]
        missing = [p for p in paths if not p.is_file()]
        if missing:
            raise ExplorerError(f"test_set ({test_set.name}): {len(missing)} of {len(paths)} photos are "
                                f"missing (e.g. {missing[0]}); point captions.init_args at the folder that holds them")
        train = getattr(dm, "train_dataset", None)
        bank = [c for caps in train.captions for c in caps] if train is not None else []
        name = test_set.name if splits == "test" else f"{test_set.name} (all splits)"
        return cls(name, paths, [list(c) for d in parts for c in d.captions], bank)

    @property
    def flat_captions(self) -> list[str]:
        return [c for caps in self.captions for c in caps]

    @property
    def caption_image(self) -> torch.Tensor:
        return torch.repeat_interleave(torch.arange(len(self.captions)), torch.tensor([len(c) for c in self.captions]))

    @property
    def folders(self) -> list[Path]:
        return sorted({p.resolve().parent for p in self.image_paths})

    def matching_images(self, query: str) -> set[int]:
        """Images with a caption equal to ``query`` (case, spacing and punctuation aside): the query's ground truth."""
        q = _norm(query)
        return {int(i) for c, i in zip(self.flat_captions, self.caption_image.tolist()) if _norm(c) == q} if q else set()

    def key(self) -> str:
        return sha1_of_json([[str(p.resolve()), p.stat().st_size] for p in self.image_paths] + [self.flat_captions])[:16]


def cached(name: str, make: Callable[[], object], key: dict):
    """``make()`` once per ``key``: saved under ``.cache/explore/`` (temporary name, then rename) and read back after."""
    path = cache_dir() / "explore" / f"{name}-{sha1_of_json(key)[:16]}.pt"
    if path.is_file():
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - a damaged cache file is rebuilt
            pass
    value = make()
    with atomic_path(path, suffix=".pt") as tmp:
        torch.save(value, tmp)
    return value


def _file_key(path: Path) -> list:
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


@dataclass
class Ranked:
    """A model's answer: gallery rows (images or captions) best first, their scores, and how long it took."""

    rows: list[int]
    scores: list[float]
    seconds: float
    note: str = ""


def _top(scores: torch.Tensor, k: int) -> tuple[list[int], list[float]]:
    k = min(k, len(scores))
    s, i = torch.topk(scores.float(), k)
    return i.tolist(), s.tolist()


class ExplorerModel:
    """What the page asks of a model (see the module docstring)."""

    kind = "model"
    cross_encoder = False

    def __init__(self, entry: ModelEntry, gallery: Gallery):
        self.entry, self.gallery, self.name = entry, gallery, entry.name

    def text_scores(self, query: str) -> torch.Tensor:
        """Scores of every gallery image for ``query`` (I,)."""
        raise NotImplementedError

    def caption_scores(self, image: int) -> torch.Tensor:
        """Scores of every gallery caption for image ``image`` (C,)."""
        raise NotImplementedError

    def rank_images(self, query: str, k: int, candidates: torch.Tensor | None = None) -> Ranked:
        start = time.perf_counter()
        rows, scores = _top(self.text_scores(query), k)
        return Ranked(rows, scores, time.perf_counter() - start)

    def rank_captions(self, image: int, k: int, candidates: torch.Tensor | None = None) -> Ranked:
        start = time.perf_counter()
        rows, scores = _top(self.caption_scores(image), k)
        return Ranked(rows, scores, time.perf_counter() - start)


def _run_sections(ckpt: Path, cls: type) -> dict | None:
    """The ``model`` and ``data`` sections of the config the checkpoint's run was fit with (``<run>/config.yaml``, every
    command-line override included, e.g. the stage-2 checkpoint a search-head run read its architecture from), when
    that run fit the same class; else None."""
    path = ckpt.parent.parent / "config.yaml"
    try:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model"), dict):
        return None
    if class_of(cfg["model"].get("class_path")) is not cls:
        return None
    sections = {k: cfg[k] for k in ("model", "data") if isinstance(cfg.get(k), dict)}
    # a run recorded before options moved into groups holds them flat: given as they are now (plain YAML values)
    return json.loads(json.dumps(regrouped_config(sections)))


def _checked_module(entry: ModelEntry, workdir: str):
    """The row's LightningModule and DataModule built from its config (with the sections of the config its run was fit
    with on top, when there is one), holding the checkpoint's weights; a checkpoint of another class than the
    config's is refused."""
    ckpt = entry.checkpoint()
    named = str(resolved_config(resolve_path(entry.config))["model"]["class_path"])
    cls = class_of(named)
    recorded = checkpoint_class(ckpt)
    if recorded is not None and class_of(recorded) is not cls:
        raise CheckpointError(f"{entry.name}: {ckpt} is a checkpoint of {recorded}, but its config {entry.config} names "
                              f"{named}; give a checkpoint of {named.rpartition('.')[2]}")
    run = _run_sections(ckpt, cls)
    cli = build_stage(resolve_path(entry.config), [run] if run else [], workdir=workdir)
    module, dm = cli.model, cli.datamodule
    state = read_checkpoint(ckpt, entry.name)["state_dict"]
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{entry.name}: {ckpt} does not fit the network of {entry.config} "
                              f"({str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else e})") from None
    return module.eval(), dm


def _backbone_maps(backbone: torch.nn.Module, gallery: Gallery, transform) -> fcache.CachedFeatureLoader:
    """The gallery's frozen-backbone maps from the suite's feature cache (built once, shared by every model)."""
    ds = CaptionDataset(gallery.image_paths, gallery.captions, transform)
    return fcache.build_or_load(backbone, ds)


def _encode_gallery(loader: fcache.CachedFeatureLoader, n: int, encode: Callable[[torch.Tensor], object]) -> list:
    with torch.inference_mode():
        return [encode(loader.lookup(torch.arange(s, min(s + CHUNK, n))).float()) for s in range(0, n, CHUNK)]


class VectorModel(ExplorerModel):
    """One vector per image and text (:class:`SuiteVLM`): the dual encoder, the search heads, VSE."""

    kind = "vector"

    def __init__(self, entry: ModelEntry, gallery: Gallery, workdir: str):
        super().__init__(entry, gallery)
        ckpt = entry.checkpoint()
        _checked_module(entry, workdir)  # the checkpoint is of the config's class and fits its network
        self.vlm = SuiteVLM(ckpt)
        key = {"ckpt": _file_key(ckpt), "gallery": gallery.key()}
        self.images = cached("vector-images", lambda: self.vlm.encode_image([str(p) for p in gallery.image_paths]), key)
        self._captions = None
        self._key = key

    @property
    def captions(self) -> torch.Tensor:
        if self._captions is None:
            self._captions = cached("vector-captions", lambda: self.vlm.encode_text(self.gallery.flat_captions), self._key)
        return self._captions

    def text_scores(self, query: str) -> torch.Tensor:
        return cosine_scores(self.vlm.encode_text([query]), self.images)[0]

    def caption_scores(self, image: int) -> torch.Tensor:
        return cosine_scores(self.images[image:image + 1], self.captions)[0]


class MatchMapModel(ExplorerModel):
    """VG-BERT stage 1: Eq. 1 over visual and word tokens; per-word match maps of one image as the explanation."""

    kind = "match map"

    def __init__(self, entry: ModelEntry, gallery: Gallery, workdir: str):
        super().__init__(entry, gallery)
        self.module, dm = _checked_module(entry, workdir)
        self.tokenizer, self.max_length = dm.tokenizer, dm.max_length
        key = {"ckpt": _file_key(entry.checkpoint()), "gallery": gallery.key()}
        loader = _backbone_maps(self.module.frozen_backbone(), gallery, dm.transform)

        def encode():
            return torch.cat(_encode_gallery(loader, len(gallery.image_paths),
                                             lambda maps: self.module.encode_images(maps).half()))

        self.visual = cached("matchmap-images", encode, key)  # (I, h, w, p)
        self._captions, self._key = None, key

    def words(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids, mask = tokenize(self.tokenizer, list(texts), self.max_length)
        with torch.inference_mode():
            words, word_mask = self.module.encode_texts(ids, mask)
        return ids, words.float(), word_mask

    def text_scores(self, query: str) -> torch.Tensor:
        _, words, mask = self.words([query])
        with torch.inference_mode():  # the fp16 visual tokens in float32 a chunk at a time, not the whole gallery's
            return torch.cat([self.module.eval_scores(self.visual[s:s + 1024].float(), words, mask)[:, 0]
                              for s in range(0, len(self.visual), 1024)])

    def caption_scores(self, image: int) -> torch.Tensor:
        if self._captions is None:
            def encode():
                _, words, mask = self.words(self.gallery.flat_captions)
                return words.half(), mask
            self._captions = cached("matchmap-captions", encode, self._key)
        words, mask = self._captions
        with torch.inference_mode():
            return self.module.eval_scores(self.visual[image:image + 1].float(), words.float(), mask)[0]

    def word_maps(self, query: str, image: int) -> tuple[list[str], torch.Tensor]:
        """The query's counted words and their match maps on ``image`` (T', h, w): M = V·Lᵀ (Eq. 1 before the max)."""
        ids, words, mask = self.words([query])
        visual = self.visual[image:image + 1].float()
        if visual.dim() == 3:  # (1, N, d) over a square grid of locations
            side = int(round(visual.shape[1] ** 0.5))
            visual = visual.view(1, side, side, -1)
        with torch.inference_mode():
            maps = match_map(visual, words)[0]  # (h, w, T)
        keep = mask[0].nonzero().flatten()
        tokens = self.tokenizer.convert_ids_to_tokens(ids[0, keep].tolist())
        return tokens, maps[..., keep].permute(2, 0, 1)


@dataclass
class ConceptNode:
    text: str
    score: float
    children: list["ConceptNode"]


class CrossModel(ExplorerModel):
    """COMPOSER and its cross-encoder baselines: each text composed / cross-encoded with candidate images."""

    kind = "cross-encoder"
    cross_encoder = True

    def __init__(self, entry: ModelEntry, gallery: Gallery, workdir: str):
        super().__init__(entry, gallery)
        self.module, dm = _checked_module(entry, workdir)
        if getattr(self.module, "rerank_top_k", None) is not None:
            self.module.rerank_top_k = None  # the explorer gives each text its candidates itself
        self.tokenizer, self.max_length = dm.tokenizer, dm.max_length
        self.backend = getattr(dm, "backend", "spacy")
        key = {"ckpt": _file_key(entry.checkpoint()), "gallery": gallery.key()}
        loader = _backbone_maps(self.module.frozen_backbone(), gallery, dm.transform)

        def encode():
            parts = _encode_gallery(loader, len(gallery.image_paths), lambda maps: self.module.regions({"images": maps}))
            return torch.cat([r for r, _ in parts]), torch.cat([m for _, m in parts])

        self.regions, self.region_mask = cached("cross-regions", encode, key)

    @property
    def composes(self) -> bool:
        return isinstance(self.module, ComposerTraining)

    def _scores(self, texts: Sequence[str], images: torch.Tensor) -> torch.Tensor:
        """(len(images), len(texts)) scores of every text with every listed image."""
        batch, _ = texts_batch(list(texts), self.tokenizer, self.backend, self.max_length)
        with torch.inference_mode():
            sentence, _ = self.module.score_caption_batch(batch, self.regions[images], self.region_mask[images],
                                                          split="explore")
        return sentence.float()

    def text_scores(self, query: str, images: torch.Tensor | None = None,
                    progress: Callable[[float], None] | None = None) -> torch.Tensor:
        """The query cross-encoded with each listed image (default: every gallery image), 64 images at a time."""
        images = torch.arange(len(self.regions)) if images is None else images
        return torch.cat([self._scores([query], images[s:s + 64])[:, 0] for s in _steps(len(images), 64, progress)])

    def caption_scores(self, image: int, captions: torch.Tensor | None = None) -> torch.Tensor:
        """The image cross-encoded with each listed gallery caption (default: all), 100 captions at a time."""
        captions = torch.arange(len(self.gallery.flat_captions)) if captions is None else captions
        texts = self.gallery.flat_captions
        return torch.cat([self._scores([texts[c] for c in captions[s:s + 100].tolist()], torch.tensor([image]))[0]
                          for s in range(0, len(captions), 100)])

    def rank_images(self, query: str, k: int, candidates: torch.Tensor | None = None,
                    progress: Callable[[float], None] | None = None) -> Ranked:
        start = time.perf_counter()
        images = torch.arange(len(self.regions)) if candidates is None else candidates
        scores = self.text_scores(query, images, progress)
        order = torch.argsort(scores, descending=True, stable=True)[:k]
        return Ranked(images[order].tolist(), scores[order].tolist(), time.perf_counter() - start)

    def rank_captions(self, image: int, k: int, candidates: torch.Tensor | None = None) -> Ranked:
        start = time.perf_counter()
        captions = torch.arange(len(self.gallery.flat_captions)) if candidates is None else candidates
        scores = self.caption_scores(image, captions)
        order = torch.argsort(scores, descending=True, stable=True)[:k]
        return Ranked(captions[order].tolist(), scores[order].tolist(), time.perf_counter() - start)

    @property
    def score_formula(self) -> str:
        """COMPOSER's concept score as its head computes it: θᵀv (Eq. 3) or, with ``score_head: image_gated``,
        θᵀ(v ⊙ g(x))."""
        return "θᵀv" if getattr(self.module.net, "image_gate", None) is None else "θᵀ(v ⊙ g(x))"

    def concept_tree(self, query: str, image: int) -> ConceptNode:
        """COMPOSER's Concept & Relation Graph of ``query`` with every concept's score on ``image``
        (:attr:`score_formula`)."""
        batch, graph = texts_batch([query], self.tokenizer, self.backend, self.max_length)
        one = torch.tensor([image])
        with torch.inference_mode():
            pair = torch.zeros(1, dtype=torch.long)
            net = self.module.net
            table, ptr = net.compose(batch, self.regions[one], self.region_mask[one], pair, pair)
            scores = net.node_scores(table, ptr, self.regions[one], self.region_mask[one], pair).float()[ptr[0]:ptr[1]].tolist()
        concept = batch["node_concept"].tolist()
        text = [graph.concept_text[c] if c >= 0 else query for c in concept]
        children: dict[int, list[int]] = {i: [] for i in range(len(concept))}
        for local, args in zip(batch["app_local"].tolist(), batch["app_args"].tolist()):
            children[local] = [a for a in args if a >= 0]

        def node(i: int) -> ConceptNode:
            return ConceptNode(text[i], scores[i], [node(c) for c in children[i]])

        return node(int(batch["caption_root"][0]))


def _steps(n: int, step: int, progress: Callable[[float], None] | None):
    for s in range(0, n, step):
        if progress is not None:
            progress(s / max(n, 1))
        yield s


@dataclass
class SynonymRow:
    query: str
    semclip_top: list[int]
    semclip_overlap: float
    vlm_top: list[int]
    vlm_overlap: float


class SemCLIPModel(ExplorerModel):
    """SemCLIP's content store over its VLM; the explanation is its synonym stability (§4, Table 3)."""

    kind = "SemCLIP"

    def __init__(self, entry: ModelEntry, gallery: Gallery):
        super().__init__(entry, gallery)
        spec = entry.semclip["vlm"]
        if spec.startswith("suite:"):
            spec = f"suite:{resolve_path(spec.removeprefix('suite:'))}"
        self.vlm = load_vlm(spec)
        transform_path, ste_path = resolve_path(entry.semclip["transform"]), resolve_path(entry.semclip["ste"])
        transform, provenance = load_transform(transform_path)
        check_fitted_vlm(provenance, entry.semclip["vlm"], transform_path)
        self.store = SemCLIPStore(self.vlm, transform, STEEmbedding.load(ste_path),
                                  query_mode=entry.semclip.get("query_mode", "ste"))
        if not gallery.bank:
            raise ExplorerError(f"{entry.name}: the test set has no training captions, SemCLIP's text bank")
        files = [transform_path, *sorted(p for p in ste_path.rglob("*") if p.is_file())]
        key = {"vlm": spec, "vlm_files": [_file_key(p) for p in ([Path(spec[6:])] if spec.startswith("suite:") else [])],
               "files": [_file_key(p) for p in files], "gallery": gallery.key(), "bank": sha1_of_json(gallery.bank)}
        bank_vlm = cached("semclip-bank", lambda: self.vlm.encode_text(gallery.bank), key)
        self.store.add_texts(gallery.bank, vlm_embeddings=bank_vlm)
        image_vlm = cached("semclip-images", lambda: self.vlm.encode_image([str(p) for p in gallery.image_paths]), key)
        self.store.ingest(ids=list(range(len(gallery.image_paths))), vlm_embeddings=image_vlm)
        self._captions, self._key = None, key
        self.store.targets.keys("a photo of a dog")  # loads the POS tagger and WordNet now, not on the first query

    def text_scores(self, query: str) -> torch.Tensor:
        return self.store.scores([query])[0]

    def caption_scores(self, image: int) -> torch.Tensor:
        if self._captions is None:  # the gallery's captions in SemCLIP space (Γ_t of their VLM embeddings)
            def encode():
                with torch.inference_mode():
                    return self.store.transform(self.vlm.encode_text(self.gallery.flat_captions).float())
            self._captions = cached("semclip-captions", encode, self._key)
        return cosine_scores(self.store.image_semclip[image:image + 1], self._captions)[0]

    def synonym_variants(self, query: str) -> list[str]:
        """The query with each content noun replaced by the other lemmas of its WordNet synset (the sense the STE query
        uses); a noun not found as written is asked as "a photo of a <lemma>" with its own form first."""
        wn = wordnet()
        variants = []
        for key in self.store.targets.keys(query):
            synset, _, lemma = key.rpartition(".")
            own = lemma.replace("_", " ")
            others = [n.replace("_", " ") for n in wn.synset(synset).lemma_names() if n.lower() != lemma.lower()]
            pattern = re.compile(rf"\b{re.escape(own)}(s|es)?\b", re.IGNORECASE)
            for other in others[:4]:
                if pattern.search(query):
                    variants.append(pattern.sub(other, query, count=1))
                else:
                    variants.append(f"a photo of a {other}")
        return list(dict.fromkeys(v for v in variants if _norm(v) != _norm(query)))

    def synonyms(self, query: str, k: int) -> list[SynonymRow]:
        """Each synonym variant's top-k in SemCLIP space and in the base VLM's, with |top-k ∩ top-k(query)| / k."""
        variants = self.synonym_variants(query)
        texts = [query, *variants]
        semclip = self.store.scores(texts)
        vlm = cosine_scores(self.vlm.encode_text(texts), self.store.image_vlm)
        k = min(k, semclip.shape[1])
        s_top, v_top = semclip.topk(k, dim=1).indices, vlm.topk(k, dim=1).indices

        def overlap(top: torch.Tensor, i: int) -> float:
            return float(np.isin(top[i].numpy(), top[0].numpy()).mean())

        return [SynonymRow(t, s_top[i].tolist(), overlap(s_top, i), v_top[i].tolist(), overlap(v_top, i))
                for i, t in enumerate(texts)]


def model_kind(class_path: str | None) -> type:
    """The explorer class for a checkpoint's LightningModule class: match maps for VG-BERT stage 1, cross-encoding
    for COMPOSER's family (VSE aside: one vector per image and text), vectors for the rest."""
    cls = class_of(class_path)
    if isinstance(cls, type) and issubclass(cls, GroundingPretrain):
        return MatchMapModel
    if isinstance(cls, type) and issubclass(cls, RegionRetrievalModule) and not issubclass(cls, VSETraining):
        return CrossModel
    return VectorModel


@dataclass
class LoadReport:
    """What loaded, what is missing (with the command that makes it) and what failed (with why)."""

    models: list[ExplorerModel]
    missing: list[tuple[str, str, list[str]]]  # (name, command, missing files)
    failed: list[tuple[str, str]]  # (name, reason)


def load_models(entries: Sequence[ModelEntry], gallery: Gallery, log: Callable[[str], None] = print) -> LoadReport:
    """Every row whose files exist; a row that cannot be loaded is reported with its reason, not fatal."""
    models, missing, failed = [], [], []
    with tempfile.TemporaryDirectory(prefix="grounding-explore-") as workdir:  # the configs' trainer folder: unused
        for entry in entries:
            _load_one(entry, gallery, workdir, models, missing, failed, log)
    return LoadReport(models, missing, failed)


def _load_one(entry: ModelEntry, gallery: Gallery, workdir: str, models: list, missing: list, failed: list,
              log: Callable[[str], None]) -> None:
    """One row into ``models``, ``missing`` (files not made yet) or ``failed`` (why it cannot be loaded)."""
    if entry.ensemble:  # fused test scores of other rows, no model of its own to query
        log(f"{entry.name}: not loaded (an ensemble of {', '.join(entry.ensemble)}: the explorer shows each member)")
        return
    gone = missing_files(entry)
    if gone and entry.demo_ckpt and resolve_path(entry.demo_ckpt).is_file():
        # the row's own run is not made yet, the demo's model of the same config is: shown, and said so
        log(f"{entry.name}: {entry.ckpt} not made yet (`{entry.command}`); showing {entry.demo_ckpt}")
        entry, gone = replace(entry, ckpt=entry.demo_ckpt, other_seeds=[]), []
    if gone:
        missing.append((entry.name, entry.command, gone))
        return
    start = time.perf_counter()
    try:
        if entry.semclip is not None:
            model = SemCLIPModel(entry, gallery)
        else:
            model = model_kind(checkpoint_class(entry.checkpoint()))(entry, gallery, workdir)
    except (UserInputError, ValueError, FileNotFoundError, RuntimeError, KeyError) as e:
        failed.append((entry.name, " ".join(str(e).split())[:300]))
        log(f"{entry.name}: not loaded: {failed[-1][1]}")
        return
    models.append(model)
    log(f"{entry.name}: {model.kind}, ready in {time.perf_counter() - start:.1f} s")


def first_stage_of(models: Sequence[ExplorerModel], name: str | None) -> ExplorerModel | None:
    """The model whose top-K the cross-encoders rerank: ``name``, else the first vector model loaded."""
    if name is not None:
        found = [m for m in models if m.name == name]
        if not found or found[0].cross_encoder:
            raise ExplorerError(f"--first-stage {name!r}: not a loaded non-cross-encoder model; one of "
                                f"{[m.name for m in models if not m.cross_encoder]}")
        return found[0]
    return next((m for m in models if isinstance(m, VectorModel)), next((m for m in models if not m.cross_encoder), None))

"""A SemCLIP content store (§4 "Using SemCLIP for content stores").

A text bank (the captions used to tag images, plus any base noun vocabulary) is projected into
SemCLIP space by Γ_t. Each ingested image takes Γ_t of its nearest bank text in the VLM space
(Eq. 7). A query is embedded as the STE of its composed entities (the paper's retrieval:
``query_mode="ste"``, mean STE vector of its disambiguated nouns; Γ_t of its VLM embedding when it
has no STE noun) or as Γ_t of its VLM embedding (``query_mode="transform"``), and answered by
cosine similarity in SemCLIP space: exact torch search by default, FAISS when asked for.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch

from grounding.semclip.alignment import AlignmentTransform, CaptionTargets, SemanticIndex, semclip_project_images
from grounding.semclip.ste import STEEmbedding
from grounding.semclip.vlm import list_images

QUERY_MODES = ("ste", "transform")


class SemCLIPStore:
    """Ingest images (pixel batch, paths or a folder) and answer text queries in SemCLIP space.

    Args: ``vlm`` (any :class:`grounding.semclip.alignment.VLM`), ``transform`` (Γ_t), ``ste`` (needed
    for ``query_mode="ste"``), ``backend`` ("torch" exact | "faiss"), ``targets`` (a prebuilt
    CaptionTargets, e.g. with MiniLM lexical variants for OOV query nouns), ``image_neighbours`` (1: Eq. 7, an image
    is Γ_t of its nearest bank text; k > 1, an ablation: the mean of Γ_t of its k nearest).
    """

    def __init__(self, vlm, transform: AlignmentTransform, ste: STEEmbedding | None = None, query_mode: str = "ste",
                 backend: str = "torch", targets: CaptionTargets | None = None, image_neighbours: int = 1):
        if query_mode not in QUERY_MODES:
            raise ValueError(f"query_mode must be one of {QUERY_MODES}, got {query_mode!r}")
        if query_mode == "ste" and ste is None and targets is None:
            raise ValueError("query_mode='ste' embeds queries by the STE of their nouns: pass ste= (an STEEmbedding).")
        self.vlm, self.transform, self.ste = vlm, transform.eval(), ste
        self.query_mode, self.backend = query_mode, backend
        if image_neighbours < 1:
            raise ValueError(f"image_neighbours must be >= 1; got {image_neighbours}")
        self.image_neighbours = image_neighbours
        self._targets = targets
        self.texts: list[str] = []
        self.text_vlm = self.text_semclip = None
        self.image_ids: list = []
        self.image_vlm = self.image_semclip = self.nearest_text = None
        self._index: SemanticIndex | None = None

    # ------------------------------------------------------------------------------ bank
    @torch.no_grad()
    def add_texts(self, texts: Sequence[str], vlm_embeddings: torch.Tensor | None = None) -> None:
        """Project bank texts into SemCLIP space (Γ_t of their VLM text embeddings)."""
        texts = list(texts)
        c_t = self.vlm.encode_text(texts).float() if vlm_embeddings is None else torch.as_tensor(vlm_embeddings).float()
        if len(c_t) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(c_t)} VLM embeddings")
        g = self.transform(c_t)
        self.texts += texts
        self.text_vlm = c_t if self.text_vlm is None else torch.cat([self.text_vlm, c_t])
        self.text_semclip = g if self.text_semclip is None else torch.cat([self.text_semclip, g])

    # ------------------------------------------------------------------------------ images
    @torch.no_grad()
    def ingest(self, images=None, ids: Sequence | None = None, vlm_embeddings: torch.Tensor | None = None) -> torch.Tensor:
        """Eq. 7 for a pixel batch, image paths, a folder (or precomputed VLM image embeddings).
        Returns the index of each image's nearest bank text."""
        if self.text_vlm is None:
            raise ValueError("The store has no text bank: add_texts(captions) before ingesting images (Eq. 7 maps "
                             "each image onto the transform of its nearest text).")
        if vlm_embeddings is None:
            if images is None:
                raise ValueError("ingest() needs images or vlm_embeddings")
            if isinstance(images, (str, os.PathLike)) and os.path.isdir(os.path.expanduser(str(images))):
                images = list_images(images)
            vlm_embeddings = self.vlm.encode_image(images)
        c_i = torch.as_tensor(vlm_embeddings).float()
        if ids is None:
            start = len(self.image_ids)
            ids = [str(p) for p in images] if isinstance(images, (list, tuple)) else list(range(start, start + len(c_i)))
        if len(ids) != len(c_i):
            raise ValueError(f"{len(ids)} ids for {len(c_i)} images")
        projected, nearest = semclip_project_images(c_i, self.text_vlm, self.text_semclip, self.image_neighbours)
        cat = lambda a, b: b if a is None else torch.cat([a, b])  # noqa: E731
        self.image_vlm, self.image_semclip = cat(self.image_vlm, c_i), cat(self.image_semclip, projected)
        self.nearest_text = cat(self.nearest_text, nearest)
        self.image_ids += list(ids)
        self._index = None
        return nearest

    # ------------------------------------------------------------------------------ queries
    @property
    def targets(self) -> CaptionTargets:
        if self._targets is None:
            self._targets = CaptionTargets(self.ste)
        return self._targets

    @torch.no_grad()
    def embed_queries(self, texts: Sequence[str]) -> torch.Tensor:
        """Queries in SemCLIP space (see ``query_mode``)."""
        texts = list(texts)
        if self.query_mode == "transform":
            return self.transform(self.vlm.encode_text(texts).float())
        vecs, kept = self.targets(texts)
        out = torch.empty(len(texts), vecs.shape[1] if len(vecs) else self.transform.net[-1].out_features)
        out[kept] = vecs
        if (~kept).any():  # no STE noun in the query: fall back to Γ_t of its VLM embedding
            out[~kept] = self.transform(self.vlm.encode_text([t for t, k in zip(texts, kept.tolist()) if not k]).float())
        return out

    @property
    def index(self) -> SemanticIndex:
        if self._index is None:
            if self.image_semclip is None:
                raise ValueError("The store holds no images: ingest() some first.")
            self._index = SemanticIndex(self.image_semclip, backend=self.backend)
        return self._index

    def search(self, texts: Sequence[str], k: int = 10) -> tuple[torch.Tensor, list[list]]:
        """Top-k (scores (Q, k), image ids per query) by cosine similarity in SemCLIP space."""
        scores, idx = self.index.search(self.embed_queries(texts), k)
        # Negative ids: an approximate index reached fewer than k items (see SemanticIndex.search).
        return scores, [[self.image_ids[j] for j in row if j >= 0] for row in idx.tolist()]

    def scores(self, texts: Sequence[str]) -> torch.Tensor:
        """Cosine similarity of every query to every stored image (Q, N), for evaluation."""
        q = torch.nn.functional.normalize(self.embed_queries(texts).float(), dim=-1)
        return q @ self.index.vectors.T

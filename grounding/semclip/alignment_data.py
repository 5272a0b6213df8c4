"""SemCLIP alignment pairs (§4 "Learning the alignment transform") as a LightningDataModule.

From a caption vocabulary (COCO-format caption JSON, Karpathy split JSON, or a plain text file with
one caption a line), every distinct caption becomes one pair (C_t, C'_t): its VLM text embedding and
its STE target, the mean STE vector of its disambiguated nouns (``CaptionTargets``: Lesk with a
first-sense fallback; out-of-vocabulary nouns through their nearest lexical variant under MiniLM when
``lexical_variants``). Captions without any STE noun are dropped.

The pairs are computed once and cached atomically in one ``.pt`` file keyed by the VLM (spec + file
sizes/mtimes), the STE export and the caption files (content hashes), then split into train/val by a
seeded permutation. The targets, the costly half, are also cached on their own (``caption_targets-<key>.pt``,
keyed without the VLM), so Γ_t for another VLM on the same captions and STE only encodes the captions.
Batches are ``(vlm_text (B, d_vlm), target (B, d_ste))``.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Sequence

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, TensorDataset

from data_modules.file_checks import MalformedDataError, MissingDataError
from data_modules.formats import read_caption_texts
from grounding.composer.captions import CaptionFileError
from grounding.composer.captions import read_captions as read_caption_set
from grounding.errors import MissingInputError
from grounding.paths import cache_dir, resolve_path
from grounding.semclip.alignment import CaptionTargets, minilm_lexical_variants
from grounding.semclip.ste import STEEmbedding
from grounding.semclip.vlm import load_vlm, vlm_fingerprint
from grounding.utils.io import atomic_path, sha1_of_file, sha1_of_json

log = logging.getLogger(__name__)
FORMAT_VERSION = 2  # 2: nouns by POS, content-word Lesk, lexical step for every noun outside the STE
CAPTIONS_HELP = ("captions must be COCO-format caption JSON ({\"annotations\": [{\"caption\": str}, ...]}), a Karpathy "
                 "split JSON ({\"images\": [{\"sentences\": [{\"raw\": str}]}]}) or a .txt file with one caption a line; "
                 "e.g. data/world/coco/annotations/captions_train2017.json")


def read_captions(paths: str | Sequence[str], images: str | None = None) -> list[str]:
    """Distinct captions (whitespace-normalised, first occurrence order) of one or more caption files; with
    ``images`` (image file names, one a line, e.g. Flickr_8k.trainImages.txt) only those images' captions,
    so the test images' captions stay out of training (the files must then name images: not plain text)."""

    if images is not None and not resolve_path(images).is_file():
        raise MissingDataError(f"caption_images={images} does not exist: expected a file of image names, one a line "
                               "(e.g. ../shared/data/flickr8k/Flickr_8k.trainImages.txt)")
    out: dict[str, None] = {}
    for name in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        if images is None:
            texts = read_caption_texts(resolve_path(name), MalformedDataError, CAPTIONS_HELP, MissingDataError)
        else:
            try:
                texts = read_caption_set(resolve_path(name), images_list=resolve_path(images)).captions
            except CaptionFileError as e:
                raise MalformedDataError(f"{e} (caption_images={images})") from None
        for c in texts:
            if c := re.sub(r"\s+", " ", c).strip():
                out.setdefault(c, None)
    if not out:
        raise MalformedDataError(f"No captions in {paths}. {CAPTIONS_HELP}.")
    return list(out)


def ste_fingerprint(path: str | os.PathLike) -> dict:
    p = resolve_path(path)
    if not p.exists():
        raise MissingInputError(f"STE export {p} does not exist: train and export one first (`python -m grounding fit "
                                "--config experiments/semclip/ste_world.yaml` or ste_wordnet.yaml writes export_dir).")
    files = [p / "vocab.txt", p / "vectors.npy"] if p.is_dir() else [p]
    return {"path": str(p), "files": [(f.name, sha1_of_file(f)) for f in files if f.is_file()]}


def caption_targets(ste, captions: Sequence[str], lexical_variants: bool = True, lexical_min_similarity: float = -1.0,
                    cache: str | os.PathLike | None = None) -> tuple[list[str], torch.Tensor]:
    """The captions that have STE nouns and their targets C'_t (N, d_ste): the costly, VLM-independent half of the
    pairs (POS tagging, Lesk, the lexical step), stored in ``cache`` when given and reused from it (the caller keys
    the file by the STE, the captions and the settings), so a second VLM on the same captions pays only its encoding."""
    if cache is not None and Path(cache).is_file():
        try:
            stored = torch.load(cache, map_location="cpu", weights_only=True)
            if len(stored["captions"]) == len(stored["targets"]) and stored["targets"].shape[1] == ste.dim:
                return list(stored["captions"]), stored["targets"]
        except Exception:  # noqa: BLE001 - unreadable or another layout: rebuilt below, never trusted
            pass
        log.info("caption targets cache %s is unreadable: rebuilding it", cache)
    lexical = minilm_lexical_variants(ste, min_similarity=lexical_min_similarity) if lexical_variants else None
    targets, kept = CaptionTargets(ste, lexical=lexical)(captions)
    kept_captions = [c for c, k in zip(captions, kept.tolist()) if k]
    if not kept_captions:
        raise ValueError(f"None of the {len(captions)} captions has a noun in the STE vocabulary ({len(ste.keys)} items); "
                         "use an STE that covers the captions' nouns (e.g. experiments/semclip/ste_world.yaml for the world).")
    targets = targets.float()
    if cache is not None:
        Path(cache).parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(cache, suffix=".pt") as tmp:
            torch.save({"captions": kept_captions, "targets": targets}, tmp)
    return kept_captions, targets


def build_pairs(vlm, ste, captions: Sequence[str], lexical_variants: bool = True,
                lexical_min_similarity: float = -1.0, targets_cache: str | os.PathLike | None = None) -> dict:
    """{"captions": kept captions, "vlm_text": (N, d_vlm), "targets": (N, d_ste)} for a VLM object and an STEEmbedding
    (``targets_cache``: :func:`caption_targets`' file)."""
    kept_captions, targets = caption_targets(ste, captions, lexical_variants, lexical_min_similarity, targets_cache)
    vlm_text = vlm.encode_text(kept_captions).float()
    return {"captions": kept_captions, "vlm_text": vlm_text, "targets": targets}


class AlignmentPairsDataModule(LightningDataModule):
    """(VLM text embedding, STE target) pairs of a caption vocabulary, cached and split.

    Args:
        vlm: VLM spec (``suite:<ckpt>``, ``hf-clip:<dir>``, ``open-clip:<arch>:<file>``; see grounding.semclip.vlm).
        ste: exported STE folder (``python -m grounding.semclip export``) or word2vec text file.
        captions: caption file(s) (COCO / Karpathy JSON, Flickr token file, or text with one caption a line).
        caption_images: a file of image names, one a line (e.g. Flickr_8k.trainImages.txt): only their captions
            train Γ_t, so a test split's captions never do. None: every caption of the files.
        lexical_variants: map out-of-vocabulary nouns to their nearest STE lemma form under MiniLM (§4);
            ``lexical_min_similarity``: below this cosine the noun is dropped instead.
        max_captions: keep the first N distinct captions (smoke runs).
        val_fraction: held-out pairs for the loss and the nearest-neighbour recovery error.
        batch_size: 512 in the paper. cache: the cache file (default: under the cache folder, keyed).
    """

    def __init__(self, vlm: str, ste: str, captions: str | list[str], caption_images: str | None = None,
                 lexical_variants: bool = True,
                 lexical_min_similarity: float = -1.0, max_captions: int | None = None, val_fraction: float = 0.1,
                 batch_size: int = 512, eval_batch_size: int | None = None, num_workers: int = 0, seed: int = 0,
                 cache: str | None = None, device: str = "cpu"):
        super().__init__()
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must lie in [0, 1); got {val_fraction}")
        self.save_hyperparameters()
        self.pairs: dict | None = None

    # ------------------------------------------------------------------------------ cache
    def cache_key(self) -> str:
        """The pairs file's key: the VLM and everything :meth:`targets_key` holds."""
        vlm = vlm_fingerprint(self.hparams.vlm)  # missing weights are reported first
        return sha1_of_json({**self._targets_fields(), "vlm": vlm})

    def targets_key(self) -> str:
        """The caption targets' key: the STE, the caption files (content) and the settings, not the VLM."""
        return sha1_of_json(self._targets_fields())

    def _targets_fields(self) -> dict:
        h = self.hparams
        ste = ste_fingerprint(h.ste)
        caps = [h.captions] if isinstance(h.captions, str) else list(h.captions)
        for c in caps:
            if not resolve_path(c).is_file():
                read_captions(c)  # raises the clear missing-file error
        key = {"version": FORMAT_VERSION, "ste": ste, "captions": [sha1_of_file(resolve_path(c)) for c in caps],
               "lexical": h.lexical_variants, "lexical_min_similarity": h.lexical_min_similarity,
               "max_captions": h.max_captions}
        if h.caption_images is not None:  # only then in the key, so caches built before the option keep theirs
            if not resolve_path(h.caption_images).is_file():
                read_captions(caps, h.caption_images)  # raises the clear missing-file error
            key["caption_images"] = sha1_of_file(resolve_path(h.caption_images))
        return key

    def check_inputs(self) -> None:
        """VLM weights, STE export, caption files and image list exist (before any model is built)."""
        self.cache_key()

    def cache_path(self) -> Path:
        if self.hparams.cache:
            return resolve_path(self.hparams.cache)
        return cache_dir() / "semclip" / f"alignment_pairs-{self.cache_key()[:16]}.pt"

    def prepare_data(self):
        path = self.cache_path()
        if path.is_file():
            if not self.hparams.cache:
                return  # the key is in the file name
            try:  # an explicit cache path is reused only for the same VLM, STE and captions
                if torch.load(path, map_location="cpu", weights_only=True).get("meta", {}).get("key") == self.cache_key():
                    return
            except Exception:  # unreadable: rebuilt below, never trusted
                pass
            log.info("alignment pairs cache %s was built from other inputs: rebuilding it", path)

        h = self.hparams
        captions = read_captions(h.captions, h.caption_images)
        if h.max_captions is not None:
            captions = captions[: h.max_captions]
        ste = STEEmbedding.load(resolve_path(h.ste))
        vlm = load_vlm(h.vlm, device=h.device)
        targets_cache = cache_dir() / "semclip" / f"caption_targets-{self.targets_key()[:16]}.pt"
        pairs = build_pairs(vlm, ste, captions, h.lexical_variants, h.lexical_min_similarity, targets_cache)
        pairs["meta"] = {"vlm": h.vlm, "ste": str(h.ste), "captions": h.captions,
                         "caption_images": h.caption_images, "n_captions": len(captions),
                         "n_pairs": len(pairs["captions"]), "key": self.cache_key()}
        log.info("alignment pairs: %d of %d captions have STE nouns", len(pairs["captions"]), len(captions))
        with atomic_path(path, suffix=".pt") as tmp:
            torch.save(pairs, tmp)

    def load_pairs(self) -> dict:
        if self.pairs is None:
            path = self.cache_path()
            if not path.is_file():
                self.prepare_data()
            self.pairs = torch.load(path, map_location="cpu", weights_only=True)
        return self.pairs

    # ------------------------------------------------------------------------------ splits
    @property
    def vlm_dim(self) -> int:
        return self.load_pairs()["vlm_text"].shape[1]

    @property
    def ste_dim(self) -> int:
        return self.load_pairs()["targets"].shape[1]

    def split_indices(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self.load_pairs()["captions"])
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.hparams.seed))
        n_val = int(round(self.hparams.val_fraction * n)) if n > 1 else 0
        return perm[n_val:].sort().values, perm[:n_val].sort().values

    def setup(self, stage: str | None = None):
        pairs = self.load_pairs()
        self.train_idx, self.val_idx = self.split_indices()
        self.train_set = TensorDataset(pairs["vlm_text"][self.train_idx], pairs["targets"][self.train_idx])
        self.val_set = TensorDataset(pairs["vlm_text"][self.val_idx], pairs["targets"][self.val_idx])

    def train_dataloader(self):
        g = torch.Generator().manual_seed(self.hparams.seed)
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True, generator=g,
                          num_workers=self.hparams.num_workers)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.eval_batch_size or self.hparams.batch_size,
                          num_workers=self.hparams.num_workers)

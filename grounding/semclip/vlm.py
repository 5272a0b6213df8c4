"""VLM adapters for SemCLIP (§4): any model with ``encode_image`` / ``encode_text`` into one joint space.

* :class:`SuiteVLM`: a checkpoint of the suite's own CLIP-style models, the dual-encoder baseline
  (:class:`grounding.vgbert.DualEncoderBaseline`), the VG-BERT search heads
  (:class:`grounding.vgbert.SearchHeads`: image side F_V, text side F_L) or COMPOSER's VSE baseline
  (:class:`grounding.composer.vse_vilbert.VSETraining`, grid regions: the mean of its region embeddings). Architecture, tokenizer and
  image size come from the checkpoint's hyperparameters; the pixel normalisation from the run's
  ``config.yaml`` (written beside ``checkpoints/`` by the CLI) when present.
* :class:`HFCLIP`: a Hugging Face CLIP from a local folder.
* :class:`OpenCLIP`: an open_clip model from a local weights file (optional dependency).

``load_vlm(spec)`` builds one from a string: ``suite:<ckpt>``, ``hf-clip:<dir>``,
``open-clip:<arch>:<weights file>``. Image inputs may be a normalised pixel batch (B, 3, H, W),
image paths, PIL images or a folder.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
import yaml

from data_modules.captions import CaptionDataset
from data_modules.collate import tokenize
from data_modules.images import build_transform, open_rgb
from grounding import feature_cache as fcache
from grounding.checkpoints import CheckpointError, read_checkpoint
from grounding.composer.vse_vilbert import VSETraining
from grounding.encoders import load_tokenizer
from grounding.errors import MissingInputError
from grounding.nets import build_net
from grounding.vgbert.dual_encoder import DualEncoderBaseline
from grounding.vgbert.search_heads import SearchHeads

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
SPEC_HELP = ("a VLM spec is 'suite:<checkpoint.ckpt>' (a DualEncoderBaseline, SearchHeads or VSETraining checkpoint of "
             "this suite), "
             "'hf-clip:<local CLIP folder>' or 'open-clip:<architecture>:<weights file>'")


def list_images(folder: str | os.PathLike) -> list[Path]:
    """Image files of a folder, sorted by name (the ingestion order of a store)."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise MissingInputError(f"Image folder {folder} does not exist.")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise MissingInputError(f"{folder} holds no image files ({', '.join(IMAGE_SUFFIXES)}).")
    return files


def image_items(images) -> list:
    """A folder, one path or a sequence of paths / PIL images -> a list of paths / PIL images."""
    if isinstance(images, (str, os.PathLike)):
        p = Path(images).expanduser()
        return list_images(p) if p.is_dir() else [p]
    return list(images)


def _load_pixels(items: list, transform) -> torch.Tensor:
    return torch.stack([transform(open_rgb(Path(it)) if isinstance(it, (str, os.PathLike)) else it.convert("RGB"))
                        for it in items])


def _run_config(ckpt: Path) -> dict:
    """The ``data.init_args`` of the LightningCLI run that wrote ``ckpt`` (``<run>/config.yaml``), if any, with its
    ``transform`` group's fields (``image_size``, ``resize_size``, ``mean``, ``std``) beside the others: a run recorded
    before the group holds them there already."""
    for cfg in (ckpt.parent.parent / "config.yaml", ckpt.parent / "config.yaml"):
        if cfg.is_file():
            data = (yaml.safe_load(cfg.read_text()) or {}).get("data") or {}
            init = dict(data.get("init_args") or {})
            transform = init.pop("transform", None)
            return {**init, **(transform if isinstance(transform, dict) else {})}
    return {}


class PooledRegions(torch.nn.Module):
    """A grid-region VSE (COMPOSER App. C) as one vector per image: the normalised mean of its region embeddings
    over the backbone's maps, from pixels or from cached maps (what ``encode_images`` of the other suite nets take)."""

    def __init__(self, vse: torch.nn.Module):
        super().__init__()
        self.vse = vse

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        return self.vse.encode_images(*self.vse.embed_regions(images))

    def encode_texts(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.vse.encode_texts(ids, mask)


class SuiteVLM:
    """A suite checkpoint as a VLM: ``DualEncoderBaseline`` (both heads of the dual encoder) or
    ``SearchHeads`` (F_V for images, F_L for texts, App. B.5). Outputs are unit vectors.

    ``mean`` / ``std`` / ``image_size`` / ``resize_size`` / ``max_length`` override what is read from
    the checkpoint and its run's config.yaml (defaults: the backbone's input statistics, 224 / 256,
    32 tokens).
    ``feature_cache``: image files go through the frozen CNN once (cached like the training's maps).
    """

    KINDS = ("DualEncoderBaseline", "SearchHeads", "VSETraining")

    def __init__(self, ckpt: str | os.PathLike, device: str = "cpu", batch_size: int = 64,
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None, image_size: int | None = None,
                 resize_size: int | None = None, max_length: int | None = None, feature_cache: bool = True):
        self.path = Path(ckpt).expanduser()
        ck = read_checkpoint(self.path, "VLM")
        hp = dict(ck["hyper_parameters"])
        kind = str(hp.get("_class_path", "")).rsplit(".", 1)[-1]
        if kind not in self.KINDS:
            raise CheckpointError(f"{self.path} is a {kind or 'unknown'} checkpoint; SemCLIP's suite adapter needs one "
                                  f"of {self.KINDS} (one vector per image and per text). Train one with "
                                  "`make baseline` or `make stage3`, or pass 'hf-clip:<dir>'.")
        self.kind = kind
        if kind in ("DualEncoderBaseline", "VSETraining"):
            cls = DualEncoderBaseline if kind == "DualEncoderBaseline" else VSETraining
            if not isinstance(hp.get("net"), dict):
                raise CheckpointError(f"{self.path} holds no network spec (hyperparameter 'net'): it was written before "
                                      f"the {kind} took an injected network; retrain it.")
            if kind == "VSETraining" and hp["net"].get("init_args", {}).get("region_source", "grid") != "grid":
                raise CheckpointError(f"{self.path}: a VSE on {hp['net']['init_args']['region_source']} regions needs "
                                      "detector boxes or files per image; SemCLIP's adapter reads grid-region VSEs only.")
            hp.update(net=build_net(hp["net"], backbone_weights=None), feature_cache=False)  # weights: the checkpoint
            text_encoder, size = hp["net"].init_args["text_encoder"], hp["net"].init_args["image_size"]
        else:
            cls = SearchHeads
            hp["stage2"] = dict(hp.get("stage2") or {}, backbone_weights=None)
            hp.update(backbone_weights=None, feature_cache=False)
            text_encoder, size = hp["stage2"].get("text_encoder", "minilm"), hp["stage2"].get("image_size", 224)
        accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "optimizer", "lr_scheduler"}
        module = cls(**{k: v for k, v in hp.items() if k in accepted})
        missing, _ = module.load_state_dict(ck["state_dict"], strict=False)
        if missing:
            raise CheckpointError(f"{self.path} lacks {len(missing)} weight(s) of its {kind} (e.g. {missing[:3]}); "
                                  "the file is incomplete or from another version of the model.")
        net = {"DualEncoderBaseline": lambda: module.model, "SearchHeads": lambda: module.search,
               "VSETraining": lambda: PooledRegions(module.net)}[kind]()
        self.net = net.to(device).eval()
        run = _run_config(self.path)
        self.image_size = int(image_size or run.get("image_size") or size)
        self.resize_size = int(resize_size or run.get("resize_size") or round(self.image_size * 256 / 224))
        # The backbone's own input statistics (what the CLI links into the DataModule) unless given.
        self.mean = tuple(mean or run.get("mean") or self.backbone.mean)
        self.std = tuple(std or run.get("std") or self.backbone.std)
        self.max_length = int(max_length or run.get("max_length") or 32)
        self.transform = build_transform(self.image_size, self.resize_size, self.mean, self.std)
        self.tokenizer = load_tokenizer(text_encoder)
        self.device, self.batch_size, self.feature_cache = device, batch_size, feature_cache
        self.spec = f"suite:{self.path}"

    @torch.inference_mode()
    def encode_image(self, images) -> torch.Tensor:
        """Pixels (B, 3, H, W) normalised as in training, or paths / PIL images / a folder -> (B, d)."""
        if isinstance(images, torch.Tensor):
            return torch.cat([self.net.encode_images(b.to(self.device)).float().cpu()
                              for b in images.split(self.batch_size)]) if len(images) else torch.empty(0, self.dim)
        items = image_items(images)
        if not items:
            return torch.empty(0, self.dim)
        if self.feature_cache and all(isinstance(it, (str, os.PathLike)) for it in items):
            return self._encode_cached(items)
        return torch.cat([self.encode_image(_load_pixels(items[s:s + self.batch_size], self.transform))
                          for s in range(0, len(items), self.batch_size)])

    def _encode_cached(self, paths: list) -> torch.Tensor:
        """The frozen CNN's maps from the suite's feature cache (grounding.feature_cache), then the
        trainable layers. The list is wrapped like a caption split (CaptionDataset), so the maps
        cached while the VLM trained on the same images are reused."""
        ds = CaptionDataset([Path(p) for p in paths], [[] for _ in paths], self.transform)
        loader = fcache.build_or_load(self.backbone, ds, device=self.device)
        feats = loader.lookup(torch.arange(len(paths)))
        return torch.cat([self.net.encode_images(b.to(self.device).float()).float().cpu()
                          for b in feats.split(self.batch_size)])

    @property
    def backbone(self):
        if self.kind == "VSETraining":
            return self.net.vse.backbone
        return self.net.visual.backbone if self.kind == "DualEncoderBaseline" else self.net.grounding.visual.backbone

    @torch.inference_mode()
    def encode_text(self, texts: Sequence[str]) -> torch.Tensor:
        texts = [texts] if isinstance(texts, str) else list(texts)
        out = []
        for s in range(0, len(texts), self.batch_size):
            ids, mask = tokenize(self.tokenizer, texts[s:s + self.batch_size], self.max_length)
            out.append(self.net.encode_texts(ids.to(self.device), mask.to(self.device)).float().cpu())
        return torch.cat(out) if out else torch.empty(0, self.dim)

    @property
    def dim(self) -> int:
        if self.kind == "VSETraining":
            return self.net.vse.dim
        if self.kind == "DualEncoderBaseline":
            return self.net.language_head.out_features
        return self.net.text_head.mlp[-1].out_features


def projected_features(output) -> torch.Tensor:
    """``CLIPModel.get_text_features`` / ``get_image_features``: a tensor up to transformers 4, a
    ``BaseModelOutputWithPooling`` whose ``pooler_output`` holds the projected features from transformers 5 on."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


class HFCLIP:
    """A Hugging Face CLIP (``CLIPModel``) loaded from a local directory or the local hub cache."""

    def __init__(self, path: str, device: str = "cpu", batch_size: int = 256):
        from transformers import CLIPModel, CLIPTokenizerFast  # here: CLIP classes load only for this adapter

        p = Path(path).expanduser()
        try:
            self.model = CLIPModel.from_pretrained(str(p), local_files_only=True).to(device).eval()
            self.tokenizer = CLIPTokenizerFast.from_pretrained(str(p), local_files_only=True)
        except (OSError, ValueError) as e:
            raise MissingInputError(
                f"No CLIP weights at {path!r}. SemCLIP's paper VLM is OpenAI CLIP (e.g. openai/clip-vit-base-patch32): "
                "download it on a machine with internet (`huggingface-cli download openai/clip-vit-base-patch32 "
                "--local-dir DIR`) and pass DIR, or plug in any object with encode_image/encode_text (grounding.semclip.VLM)."
            ) from e
        self.device, self.batch_size = device, batch_size
        self.path, self.spec = p, f"hf-clip:{path}"
        self._processor = None

    @property
    def dim(self) -> int:
        return int(self.model.config.projection_dim)

    @torch.inference_mode()
    def encode_image(self, images) -> torch.Tensor:
        """CLIP-preprocessed pixels (B, 3, 224, 224), or image paths / PIL images / a folder."""
        if not isinstance(images, torch.Tensor):
            if self._processor is None:
                from transformers import CLIPImageProcessor

                self._processor = CLIPImageProcessor.from_pretrained(str(self.path), local_files_only=True)
            items = [open_rgb(Path(it)) if isinstance(it, (str, Path)) else it for it in image_items(images)]
            images = self._processor(images=items, return_tensors="pt")["pixel_values"]
        return torch.cat([projected_features(self.model.get_image_features(pixel_values=b.to(self.device))).float().cpu()
                          for b in images.split(self.batch_size)])

    @torch.inference_mode()
    def encode_text(self, texts: Sequence[str]) -> torch.Tensor:
        out = []
        for s in range(0, len(texts), self.batch_size):
            tok = self.tokenizer(list(texts[s:s + self.batch_size]), padding=True, truncation=True, return_tensors="pt").to(self.device)
            out.append(projected_features(self.model.get_text_features(**tok)).float().cpu())
        return torch.cat(out)


class OpenCLIP:
    """An open_clip model (``architecture``, e.g. ViT-B-32) with weights from a local file."""

    def __init__(self, architecture: str, weights: str, device: str = "cpu", batch_size: int = 256):
        try:
            import open_clip
        except ImportError as e:
            raise ImportError("open-clip VLMs need the open_clip package (`pip install open_clip_torch`) and a local "
                              "weights file; 'hf-clip:<dir>' or 'suite:<ckpt>' work without it.") from e
        if not Path(weights).expanduser().is_file():
            raise MissingInputError(f"No open_clip weights at {weights!r}: download the {architecture} checkpoint on a "
                                    "machine with internet and pass its path ('open-clip:<architecture>:<file>').")
        self.model, _, self.transform = open_clip.create_model_and_transforms(architecture, pretrained=str(weights),
                                                                              device=device)
        self.model.eval()
        self.tokenizer = open_clip.get_tokenizer(architecture)
        self.device, self.batch_size = device, batch_size
        self.spec = f"open-clip:{architecture}:{weights}"

    @property
    def dim(self) -> int:
        """Width of the joint space (that of one encoded text)."""
        return int(self.encode_text(["a photo"]).shape[-1])

    @torch.inference_mode()
    def encode_image(self, images) -> torch.Tensor:
        if not isinstance(images, torch.Tensor):
            images = _load_pixels(image_items(images), self.transform)
        return torch.cat([self.model.encode_image(b.to(self.device)).float().cpu() for b in images.split(self.batch_size)])

    @torch.inference_mode()
    def encode_text(self, texts: Sequence[str]) -> torch.Tensor:
        texts = list(texts)
        return torch.cat([self.model.encode_text(self.tokenizer(texts[s:s + self.batch_size]).to(self.device)).float().cpu()
                          for s in range(0, len(texts), self.batch_size)])


def load_vlm(spec: str, device: str = "cpu", **kwargs):
    """A VLM from its spec string (see the module docstring); a bare ``.ckpt`` path means ``suite:``."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"Empty VLM spec: {SPEC_HELP}.")
    kind, _, rest = spec.partition(":")
    if kind == "suite":
        return SuiteVLM(rest, device=device, **kwargs)
    if kind == "hf-clip":
        return HFCLIP(rest, device=device, **kwargs)
    if kind == "open-clip":
        arch, _, weights = rest.partition(":")
        return OpenCLIP(arch, weights, device=device, **kwargs)
    if spec.endswith(".ckpt"):
        return SuiteVLM(spec, device=device, **kwargs)
    raise ValueError(f"Unknown VLM spec {spec!r}: {SPEC_HELP}.")


def vlm_fingerprint(spec: str) -> dict:
    """What identifies a VLM's outputs for caching: the spec plus the size and mtime of its files."""
    kind, _, rest = spec.partition(":")
    target = rest if kind in ("suite", "hf-clip") else rest.partition(":")[2] if kind == "open-clip" else spec
    p = Path(target).expanduser()
    if not p.exists():
        hint = {"hf-clip": "download a CLIP on a machine with internet (`huggingface-cli download "
                           "openai/clip-vit-base-patch32 --local-dir DIR`) and pass 'hf-clip:DIR'",
                "suite": "train one (`make baseline` writes outputs/vgbert/baseline_tiny/checkpoints/last.ckpt)"}
        raise MissingInputError(f"VLM {spec!r}: {p} does not exist; {hint.get(kind, SPEC_HELP)}.")
    files = sorted(p.rglob("*")) if p.is_dir() else [p]
    return {"spec": spec, "files": [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file()]}


def cosine_scores(queries: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """(Q, d) x (N, d) -> (Q, N) cosine similarities."""
    return F.normalize(queries.float(), dim=-1) @ F.normalize(items.float(), dim=-1).T

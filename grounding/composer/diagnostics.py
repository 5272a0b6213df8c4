"""Does a cross-encoder of this package learn before it is measured? Two checks on a tiny generated world.

* :func:`init_diagnostics` — at initialisation, does caption content reach COMPOSER's root? Every caption composed
  with one fixed image: are root vectors of captions of the same image closer than those of different images (the
  gap in units of the different-image cosines' standard deviation), and how far does swapping every noun of a
  caption move its root score, against swapping its image?
* :func:`fit_small` — can a model fit a small training set? A plain training loop of ``steps`` batches over the
  DataModule's training loader with the module's own losses, then text→image / image→text recall of the training
  captions against the training images, scored by the module's own evaluation (``score_caption_batch``).

Both run on any :class:`grounding.composer.data.ComposerDataModule`; :func:`fit_world` makes the usual one, a world
with ``n_images`` training images (and 2 val, 2 test). ``python -m grounding.composer fit-check`` runs both over
seeds with composer_world.yaml's network (:data:`WORLD_FIT_NET`) and any of its switches (docs/composer.md).
"""

from __future__ import annotations

import copy
from itertools import islice
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from data_modules import FlickrDataModule
from data_modules.options import CaptionLoaderOptions, ImageTransform
from data_modules.synthetic import generate_world
from grounding.lightning import scale_group_lrs
from grounding.retrieval_metrics import retrieval_metrics

from .data import ComposerDataModule, CRGParsing, collate_visual
from .model import Composer, ComposerSizes, CompositionOptions

# composer_world.yaml's network with dropout off (the fit is measured without it), its switches that make content reach
# the root included: the network of docs/composer.md's fit and init measurements and of tests/test_composer_learns.py
WORLD_FIT_COMPOSITION = CompositionOptions(readout="mean", modulator_skip=True, child_skip=True)
WORLD_FIT_NET = dict(text_encoder="minilm", backbone="efficientnet_lite0", image_size=128,
                     sizes=ComposerSizes(pt_layers=6, ct_layers=3, dim=128, heads=4, co_dim=128, co_heads=4, norm_first=True,
                                         dropout=0.0),
                     composition=WORLD_FIT_COMPOSITION)


def fit_world(out: str | Path, n_images: int = 16, seed: int = 0, image_size: int = 128, batch_size: int = 16,
              text_encoder: str = "minilm", hard_negatives: str = "batch", captions_per_epoch: str = "one"):
    """A :class:`ComposerDataModule` over a generated world whose ``n_images`` images are all training images."""
    # 2 val and 2 test images beside the n training ones (a caption reader needs every split); only train is used
    total = n_images + 4
    generate_world(out, n_images=total, seed=seed, image_size=image_size,
                   split_fractions=(n_images / total, 2 / total, 2 / total))
    captions = FlickrDataModule(root=str(Path(out) / "flickr"))
    dm = ComposerDataModule(captions, parsing=CRGParsing(backend="spacy"), batch_size=batch_size, eval_batch_size=n_images,
                            caption_batch_size=n_images * 5, transform=ImageTransform(image_size, image_size),
                            text_encoder=text_encoder, seed=seed, hard_negatives=hard_negatives,
                            loader=CaptionLoaderOptions(drop_last=True, captions_per_epoch=captions_per_epoch))
    dm.setup("fit")
    return dm


def _train_images(dm, n_images: int | None = None) -> dict:
    images = dm.train_dataset
    n = len(images) if n_images is None else min(n_images, len(images))
    return collate_visual([dm.train_image(i) for i in range(n)])


def _train_captions(dm, n_images: int | None = None) -> dict:
    split = dm.graphs["train"]
    captions = np.arange(split.graph.n_captions)
    if n_images is not None:
        captions = captions[split.graph.caption_image < n_images]
    return split.batch(captions)


@torch.no_grad()
def train_recall(module, dm, n_images: int | None = None) -> dict[str, float]:
    """Retrieval metrics (``grounding.retrieval_metrics``) of the training captions of the first ``n_images`` training
    images (all: None) against those images, scored by the module's own evaluation."""
    was = module.training
    module.eval()
    visual = {k: v.to(module.device) for k, v in _train_images(dm, n_images).items()}
    regions, mask = module.regions(visual)
    captions = _train_captions(dm, n_images)
    sentence = module.score_caption_batch(captions, regions, mask, "test")[0]
    module.train(was)
    return retrieval_metrics(sentence.float().cpu(), captions["caption_image_index"])


def fit_small(module, dm, steps: int = 30, lr: float = 3e-4, seed: int = 0, precision: str = "32-true") -> dict:
    """Train ``module`` (a COMPOSER or baseline training module) for ``steps`` batches with Adam at ``lr`` (no
    schedule; the module's parameter groups, so ``new_layer_lr_scale`` applies), then score the training set.
    ``precision``: ``32-true`` or ``bf16-mixed`` (the forward passes under bfloat16 autocast, as Lightning's).
    Returns ``{"loss": [...], "match": [...], **train recall}``."""
    if precision not in ("32-true", "bf16-mixed"):
        raise ValueError(f"precision must be 32-true or bf16-mixed; got {precision!r}")

    def autocast():
        return torch.autocast(module.device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed")

    torch.manual_seed(seed)
    optimizer = scale_group_lrs(torch.optim.Adam(module.trainable_parameters(), lr=lr))
    module.train()
    history = {"loss": [], "match": []}

    def batches():
        epoch = 0
        while True:
            loader = dm.train_dataloader()
            loader.sampler.set_epoch(epoch)
            yield from loader
            epoch += 1

    for step, batch in enumerate(islice(batches(), steps)):
        module.steps_taken = step  # the aux-loss ramp's clock without a Trainer
        with autocast():
            losses = module.compute_losses(batch)
        optimizer.zero_grad()
        losses["loss"].backward()
        optimizer.step()
        history["loss"].append(float(losses["loss"].detach()))
        history["match"].append(float(losses["match"].detach()))
    with autocast():
        recall = train_recall(module, dm)
    return {**history, **recall}


@torch.no_grad()
def init_diagnostics(net: Composer, dm, image: int = 0) -> dict[str, float]:
    """Content at COMPOSER's root, on the DataModule's training captions (eval mode, no dropout).

    ``caption_gap_sigma``: every caption composed with training image ``image``; mean cosine of root vectors of
    two captions of the same image minus that of two captions of different images, over the standard deviation of
    the latter. ``noun_swap`` / ``image_swap``: mean |Δ s(x, y)| of the root score when every primitive (noun) of a
    caption is replaced by another primitive of the batch (a cyclic shift of the distinct primitives), and when its
    image is replaced by the next training image; ``noun_to_image`` their ratio.
    """
    was = net.training
    net.eval()
    visual = _train_images(dm)
    regions, mask = net.embed_regions(visual.get("images"), visual.get("region_features"), visual.get("region_boxes"),
                                      visual.get("region_mask"))
    batch = _train_captions(dm)
    n_cap = len(batch["captions"])
    caption = torch.arange(n_cap)

    def roots(b, pair_image):
        """(root vectors, root scores) of every caption composed with ``pair_image``."""
        table, ptr = net.compose(b, regions, mask, pair_image, caption)
        root = ptr[:-1] + b["caption_root"]
        return table[root], net.node_scores(table, ptr, regions, mask, pair_image)[root].float()

    fixed = torch.full((n_cap,), image, dtype=torch.long)
    v = F.normalize(roots(batch, fixed)[0].float(), dim=-1)
    cos = v @ v.T
    owner = batch["caption_image_index"]
    same = owner[:, None] == owner[None, :]
    off = ~torch.eye(n_cap, dtype=torch.bool)
    different = cos[~same]
    gap = (cos[same & off].mean() - different.mean()) / different.std().clamp(min=1e-12)

    score = roots(batch, owner)[1]
    other_image = (owner + 1) % len(regions)
    image_swap = (roots(batch, other_image)[1] - score).abs().mean()
    swapped = dict(batch)
    swapped["primitive_ids"] = batch["primitive_ids"].roll(1, 0)
    swapped["primitive_mask"] = batch["primitive_mask"].roll(1, 0)
    swapped["host"] = copy.copy(batch["host"])  # the host's copy of the rows' lengths rolls with them
    swapped["host"].primitive_length = np.roll(batch["host"].primitive_length, 1)
    noun_swap = (roots(swapped, owner)[1] - score).abs().mean()
    net.train(was)
    return {"caption_gap_sigma": float(gap), "noun_swap": float(noun_swap), "image_swap": float(image_swap),
            "noun_to_image": float(noun_swap / image_swap.clamp(min=1e-12))}



# ``fit-check --record NAME``: a row per seed, what the command prints (init diagnostics: the first seed's row)
FIT_CHECK_LABELS = {"seed": "seed", "t2i_r1": "train text→image R@1", "t2i_r1_sd": "sd", "loss_first": "loss (first step)",
                    "loss_last": "loss (last step)", "caption_gap_sigma": "same-image gap (σ)", "noun_swap": "noun swap",
                    "image_swap": "image swap", "noun_to_image": "noun swap / image swap"}
INIT_KEYS = ("caption_gap_sigma", "noun_swap", "image_swap", "noun_to_image")


def fit_check_rows(seeds: list[int], fits: list[dict], init: dict[str, float], steps: int) -> list[dict]:
    """The record of ``fit-check``: per seed its :func:`fit_small` result (train recall, ``rsum``, the first and last
    step's ``loss`` and ``match``, not the histories) and, on the first seed's row, ``init`` (:func:`init_diagnostics`);
    with several seeds a last row ``seed: "mean"``: the mean train text→image R@1 and its sd (ddof 1), as printed."""
    rows = []
    for i, (seed, fit) in enumerate(zip(seeds, fits)):
        loss, match = fit.get("loss") or [], fit.get("match") or []
        recall = {k: v for k, v in fit.items() if k not in ("loss", "match")}
        rows.append({"seed": int(seed), "steps": steps, **recall,
                     "loss_first": loss[0] if loss else None, "loss_last": loss[-1] if loss else None,
                     "match_first": match[0] if match else None, "match_last": match[-1] if match else None,
                     **{k: init.get(k) if i == 0 else None for k in INIT_KEYS}})
    if len(rows) > 1:
        r1 = [r["t2i_r1"] for r in rows]
        rows.append({"seed": "mean", "steps": steps, "t2i_r1": float(np.mean(r1)), "t2i_r1_sd": float(np.std(r1, ddof=1))})
    return rows

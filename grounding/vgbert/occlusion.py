"""App. A.1.2's occlusion experiment on stage-0 classifiers (paper Figs. 1-2), and the visual self-attention's maps.

    python -m grounding.vgbert.occlusion --ckpt STAGE0.ckpt [--baseline-ckpt NO_ATTENTION.ckpt] \\
        --images data/world/object_crops/val --out reports/vgbert/occlusion_tiny [--limit 64] [--window 32 --stride 8]

``--images`` is a split folder of class folders (``val/<class>/*.jpg``) named as the checkpoint's classes. For each
image (``--limit`` of them, a seeded choice), in the paper's terms:

* **Fig. 1** (``occlusion_heatmaps.png``): a ``--window`` x ``--window`` grey square (32 px) is centred at every
  ``--stride``-th pixel (8) of the input crop, one trial each; the heat map is the probability of the correct
  class as a function of the square's centre, per model (the attention model and, with ``--baseline-ckpt``, the
  model without self-attention, ``use_attention: false``: the paper's VGG16).
* **Fig. 2** (``occlusion_histogram.png``, with a baseline): over all trials, the percentage in which the
  attention model gives the correct class a higher (dark) or lower (light) probability than the baseline, by the
  size of the difference.
* **Accuracy vs occluded fraction** (``occlusion_fraction.png``): the crop cut into ``--grid`` x ``--grid`` cells
  (7: 32-px cells at 224), a seeded random ``fraction`` of them grey (``--draws`` draws per image): top-1 accuracy
  and the mean probability of the correct class against the fraction.
* **Attention maps** (``attention_maps.png``): the self-attention weights (mean over heads) from the centre
  location, and those each location receives (mean over all queries), over the image.

``occlusion.json`` holds every number. Grey is RGB (0.5, 0.5, 0.5) after the model's normalisation. Each file is
written under a temporary name and renamed into place.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import yaml

from data_modules.image_folder import list_class_images
from data_modules.images import build_transform, open_rgb
from grounding.checkpoints import read_checkpoint, require_checkpoint_file
from grounding.encoders import backbone_normalisation
from grounding.errors import UserInputError, user_errors_exit
from grounding.nets import build_net
from grounding.utils.io import atomic_path, atomic_write_json
from grounding.vgbert.visual_pretrain import VisualPretrain

GREY = 0.5


class OcclusionError(UserInputError, ValueError):
    """A bad argument of the occlusion command (the message names it and the fix)."""


# ------------------------------------------------------------------------------------------------- masks
def window_centres(size: int, stride: int) -> torch.Tensor:
    """Centres of the occluding square along one side: stride/2, 3 stride/2, ... (every ``stride``-th pixel)."""
    return torch.arange(stride // 2, size, stride)


def window_masks(size: int, window: int, stride: int) -> torch.Tensor:
    """(n*n, size, size) bool: trial t = (row i, column j) covers the ``window`` x ``window`` square centred at
    (centres[i], centres[j]), i.e. pixels [c - window//2, c - window//2 + window), cut at the border."""
    pixels = torch.arange(size)
    start = window_centres(size, stride) - window // 2
    inside = (pixels[None, :] >= start[:, None]) & (pixels[None, :] < start[:, None] + window)  # (n, size)
    return (inside[:, None, :, None] & inside[None, :, None, :]).flatten(0, 1)


def cell_masks(n_masks: int, grid: int, size: int, fraction: float, generator: torch.Generator) -> torch.Tensor:
    """(n_masks, size, size) bool: in each, round(fraction * grid^2) of the grid's cells, drawn at random, are set."""
    k = round(fraction * grid * grid)
    ranks = torch.rand(n_masks, grid * grid, generator=generator).argsort(-1).argsort(-1)
    cells = (ranks < k).reshape(n_masks, 1, grid, grid).float()
    return torch.nn.functional.interpolate(cells, size=(size, size), mode="nearest")[:, 0].bool()


def occlude(image: torch.Tensor, masks: torch.Tensor, grey: torch.Tensor) -> torch.Tensor:
    """``image`` (3, H, W) repeated per mask (T, H, W), grey (3,) where the mask is set: (T, 3, H, W)."""
    return torch.where(masks[:, None], grey[None, :, None, None], image[None])


# ------------------------------------------------------------------------------------------------- models
def load_classifier(path: str | Path, device: str) -> VisualPretrain:
    """A stage-0 checkpoint's module in eval mode (its CNN from the checkpoint: no ImageNet file is read)."""
    require_checkpoint_file(path, "--ckpt", "give a stage-0 checkpoint (make stage0 writes "
                            "outputs/vgbert/stage0_tiny/checkpoints/last.ckpt)")
    ckpt = read_checkpoint(path, "stage-0")
    hparams = ckpt["hyper_parameters"]
    spec = hparams.get("net") or {}
    if not str(spec.get("class_path", "")).endswith("VisualStreamClassifier") or not hparams.get("class_names"):
        raise OcclusionError(f"{path} is not a stage-0 checkpoint (VisualPretrain with class names): give one that "
                             "`python -m grounding fit --config experiments/vgbert/stage0_tiny.yaml` wrote.")
    net = build_net(spec, backbone_weights=None)
    module = VisualPretrain(net, class_names=hparams["class_names"], feature_cache=False)
    module.load_state_dict(ckpt["state_dict"])
    return module.eval().to(device)


@torch.no_grad()
def occluded_probability(model, image: torch.Tensor, label: int, masks: torch.Tensor, grey: torch.Tensor,
                         batch_size: int) -> torch.Tensor:
    """P(label) under ``model`` for each occluded copy of ``image`` (one per mask), built and scored in batches."""
    return torch.cat([model(occlude(image, masks[i:i + batch_size], grey)).softmax(-1)[:, label].cpu()
                      for i in range(0, masks.shape[0], batch_size)])


@torch.no_grad()
def predicted(model, images: torch.Tensor, batch_size: int) -> torch.Tensor:
    """(N, C) class probabilities, in batches."""
    return torch.cat([model(images[i:i + batch_size]).softmax(-1).cpu() for i in range(0, images.shape[0], batch_size)])


def run_resize_size(ckpt: Path, image_size: int) -> int:
    """The DataModule's resize_size of the run that wrote ``ckpt`` (its folder's config.yaml: ``transform.resize_size``,
    or ``resize_size`` in a run recorded before the group), else ImageNet's ratio."""
    config = ckpt.resolve().parent.parent / "config.yaml"
    try:
        data = yaml.safe_load(config.read_text(encoding="utf-8"))["data"]["init_args"]
        return int((data.get("transform") or {}).get("resize_size") or data["resize_size"])
    except (OSError, KeyError, TypeError, ValueError, AttributeError, yaml.YAMLError):
        return image_size * 256 // 224


# ------------------------------------------------------------------------------------------------- analysis
def occlusion_analysis(ckpt: str | Path, images: str | Path, out: str | Path, baseline_ckpt: str | Path | None = None,
                       limit: int = 64, window: int = 32, stride: int = 8, grid: int | None = None,
                       fractions: Sequence[float] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
                       draws: int = 4, examples: int = 4, resize_size: int | None = None, batch_size: int = 64,
                       seed: int = 0, device: str = "cpu") -> dict:
    """Figs. 1-2 of App. A.1, accuracy against the occluded fraction and the attention maps (module docstring)."""
    folder = Path(images)
    if not folder.is_dir():
        raise OcclusionError(f"--images {folder} is not a folder: give a split folder of class folders "
                             "(data/world/object_crops/val, ImageNet's val/).")
    models = {"attention": load_classifier(ckpt, device)}
    if baseline_ckpt is not None:
        models["no attention"] = load_classifier(baseline_ckpt, device)
    first = models["attention"]
    classes = list(first.hparams.class_names)
    arch = first.model.init_args
    for m in models.values():
        other = m.model.init_args
        if list(m.hparams.class_names) != classes or (other["backbone"], other["image_size"]) != (arch["backbone"], arch["image_size"]):
            raise OcclusionError("--baseline-ckpt was trained on other classes, backbone or image size than --ckpt; "
                                 "train both on the same data with the same backbone.")
    if not first.model.use_attention:
        raise OcclusionError(f"--ckpt {ckpt} has no self-attention (use_attention: false); give the attention model "
                             "as --ckpt and this one as --baseline-ckpt.")
    if baseline_ckpt is not None and models["no attention"].model.use_attention:
        raise OcclusionError(f"--baseline-ckpt {baseline_ckpt} has self-attention: the baseline of App. A.1 is a "
                             "stage-0 model trained with use_attention: false (experiments/vgbert/stage0_*.yaml).")
    listing = list_class_images(folder)
    unknown = sorted(set(listing) - set(classes))
    if unknown or not any(listing.values()):
        raise OcclusionError(f"--images {folder}: " + (f"class folders {unknown[:5]} are not the checkpoint's classes"
                             if unknown else "no images in class folders") + "; give the val/ folder of its data.")
    paths = [p for files in listing.values() for p in files]
    labels = torch.tensor([classes.index(cls) for cls, files in listing.items() for _ in files])
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(len(paths), generator=generator)[:limit].sort().values
    paths, labels = [paths[i] for i in chosen.tolist()], labels[chosen]

    size = int(arch["image_size"])
    mean, std = backbone_normalisation(arch["backbone"])
    resize_size = resize_size or run_resize_size(Path(ckpt), size)
    transform = build_transform(size, resize_size, mean, std)
    pixels = torch.stack([transform(open_rgb(p)) for p in paths])  # (N, 3, H, W)
    grey = (GREY - torch.tensor(mean)) / torch.tensor(std)
    grid = grid or max(1, size // window)
    n = len(paths)

    # Fig. 1: P(correct class) for every window position (trials of one image batched)
    masks = window_masks(size, window, stride)
    side = len(window_centres(size, stride))
    masks, on_device = masks.to(device), pixels.to(device)
    heat = {name: torch.stack([occluded_probability(m.model, on_device[i], int(labels[i]), masks, grey.to(device),
                                                    batch_size).reshape(side, side) for i in range(n)])
            for name, m in models.items()}
    clean = {name: predicted(m.model, on_device, batch_size) for name, m in models.items()}
    # accuracy against the occluded fraction of grid cells
    curve = {name: [] for name in models}
    for fraction in fractions:
        cells = cell_masks(n * draws, grid, size, float(fraction), generator)
        batch = torch.where(cells[:, None], grey[None, :, None, None], pixels.repeat_interleave(draws, 0))
        target = labels.repeat_interleave(draws)
        for name, m in models.items():
            probs = predicted(m.model, batch.to(device), batch_size)
            curve[name].append({"fraction": float(fraction), "top1": float((probs.argmax(-1) == target).float().mean()),
                                "p_correct": float(probs.gather(1, target[:, None]).mean())})
    with torch.no_grad():
        attention = torch.cat([first.model.attention_weights(on_device[i:i + batch_size]).mean(1).cpu()
                               for i in range(0, n, batch_size)])  # (N, h*w, h*w), mean over heads

    record = {"ckpt": str(ckpt), "baseline_ckpt": str(baseline_ckpt) if baseline_ckpt else None, "images": str(folder),
              "n_images": n, "window": window, "stride": stride, "trials_per_image": side * side, "grid": grid,
              "draws": draws, "image_size": size, "resize_size": resize_size, "seed": seed, "models": {}}
    for name in models:
        record["models"][name] = {
            "top1": float((clean[name].argmax(-1) == labels).float().mean()),
            "p_correct": float(clean[name].gather(1, labels[:, None]).mean()),
            "p_correct_occluded_mean": float(heat[name].mean()), "fraction_curve": curve[name]}
    if baseline_ckpt is not None:
        record["comparison"] = trial_histogram(heat["attention"], heat["no attention"])

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    picks = torch.linspace(0, n - 1, min(examples, n)).round().long().unique().tolist()
    titles = [f"{classes[labels[i]]}\n{paths[i].name}" for i in picks]
    shown = [denormalise(pixels[i], mean, std) for i in picks]
    files = [plot_heatmaps(out / "occlusion_heatmaps.png", shown, titles, {k: v[picks] for k, v in heat.items()}),
             plot_fraction_curve(out / "occlusion_fraction.png", curve, n, draws, grid),
             plot_attention(out / "attention_maps.png", shown, titles, attention[picks], first.model.visual.grid_size)]
    if baseline_ckpt is not None:
        files.append(plot_histogram(out / "occlusion_histogram.png", record["comparison"]))
    record["files"] = [str(f) for f in files]
    atomic_write_json(out / "occlusion.json", record, indent=1)
    return record


def trial_histogram(p_attention: torch.Tensor, p_baseline: torch.Tensor, bins: int = 10) -> dict:
    """Fig. 2: the percentage of all trials in which attention gives the correct class a higher / lower probability
    than the baseline, by |difference| in ``bins`` equal bins over [0, 1] (ties: neither)."""
    diff = (p_attention - p_baseline).flatten()
    which = torch.clamp((diff.abs() * bins).long(), max=bins - 1)
    total = diff.numel()
    better = torch.bincount(which[diff > 0], minlength=bins).float() * 100 / total
    worse = torch.bincount(which[diff < 0], minlength=bins).float() * 100 / total
    return {"bins": [i / bins for i in range(bins + 1)], "better_percent": better.tolist(), "worse_percent": worse.tolist(),
            "trials": total, "better_total_percent": float(better.sum()), "worse_total_percent": float(worse.sum())}


def denormalise(image: torch.Tensor, mean, std) -> np.ndarray:
    return (image * torch.tensor(std)[:, None, None] + torch.tensor(mean)[:, None, None]).clamp(0, 1).permute(1, 2, 0).numpy()


# ------------------------------------------------------------------------------------------------- figures
def _pyplot():
    import matplotlib  # here, not at the top: selecting the Agg backend must precede pyplot's import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    _pyplot().close(fig)
    return path


def plot_heatmaps(path: Path, images: list, titles: list[str], heat: dict[str, torch.Tensor]) -> Path:
    """Fig. 1: per example, the input and the probability of the correct class against the occluder's centre."""
    plt = _pyplot()
    cols = 1 + len(heat)
    fig, axes = plt.subplots(len(images), cols, figsize=(2.3 * cols + 0.6, 2.3 * len(images)), squeeze=False)
    for r, (image, title) in enumerate(zip(images, titles)):
        axes[r][0].imshow(image)
        axes[r][0].set_ylabel(title, fontsize=7)
        for c, (name, maps) in enumerate(heat.items(), start=1):
            shown = axes[r][c].imshow(maps[r].numpy(), vmin=0, vmax=1, cmap="jet")
            if r == 0:
                axes[r][c].set_title(f"P(correct), {name}", fontsize=8)
        for ax in axes[r]:
            ax.set_xticks([])
            ax.set_yticks([])
    axes[0][0].set_title("input", fontsize=8)
    fig.colorbar(shown, ax=axes.ravel().tolist(), shrink=0.6)
    return _save(fig, path)


def plot_histogram(path: Path, comparison: dict) -> Path:
    """Fig. 2: % of trials where attention is better (dark grey) or worse (light grey), by |difference|."""
    plt = _pyplot()
    bins = comparison["bins"]
    centres = np.array([(a + b) / 2 for a, b in zip(bins[:-1], bins[1:])])
    width = (bins[1] - bins[0]) * 0.4
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    ax.bar(centres - width / 2, comparison["better_percent"], width, color="0.3",
           label=f"attention better ({comparison['better_total_percent']:.1f} %)")
    ax.bar(centres + width / 2, comparison["worse_percent"], width, color="0.75",
           label=f"attention worse ({comparison['worse_total_percent']:.1f} %)")
    ax.set_xlabel("|difference in P(correct class)|")
    ax.set_ylabel("% of occlusion trials")
    ax.set_title(f"{comparison['trials']} occlusion trials", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def plot_fraction_curve(path: Path, curve: dict[str, list[dict]], n: int, draws: int, grid: int) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for name, points in curve.items():
        x = [p["fraction"] for p in points]
        ax.plot(x, [p["top1"] for p in points], marker="o", label=f"{name}: top-1")
        ax.plot(x, [p["p_correct"] for p in points], marker=".", linestyle="--", label=f"{name}: mean P(correct)")
    ax.set_xlabel(f"fraction of the {grid}x{grid} cells occluded (grey)")
    ax.set_ylim(0, 1)
    ax.set_title(f"{n} images x {draws} draws", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def plot_attention(path: Path, images: list, titles: list[str], attention: torch.Tensor, grid: tuple[int, int]) -> Path:
    """Per example: the attention from the centre location and the attention each location receives, over the image."""
    plt = _pyplot()
    h, w = grid
    centre = (h // 2) * w + w // 2
    maps = {"from the centre (+)": attention[:, centre], "received (mean)": attention.mean(1)}
    fig, axes = plt.subplots(len(images), 1 + len(maps), figsize=(2.3 * (1 + len(maps)), 2.3 * len(images)), squeeze=False)
    for r, (image, title) in enumerate(zip(images, titles)):
        axes[r][0].imshow(image)
        axes[r][0].set_ylabel(title, fontsize=7)
        size = image.shape[:2]
        for c, (name, values) in enumerate(maps.items(), start=1):
            up = torch.nn.functional.interpolate(values[r].reshape(1, 1, h, w), size=size, mode="bilinear",
                                                 align_corners=False)[0, 0].numpy()
            axes[r][c].imshow(image)
            axes[r][c].imshow(up, cmap="jet", alpha=0.5)
            if c == 1:
                cy, cx = (h // 2 + 0.5) * size[0] / h, (w // 2 + 0.5) * size[1] / w
                axes[r][c].plot([cx], [cy], marker="+", color="white", markersize=10)
            if r == 0:
                axes[r][c].set_title(f"self-attention {name}", fontsize=8)
        for ax in axes[r]:
            ax.set_xticks([])
            ax.set_yticks([])
    axes[0][0].set_title("input", fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


# ------------------------------------------------------------------------------------------------- command
def main(argv: Sequence[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m grounding.vgbert.occlusion", allow_abbrev=False,
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="a stage-0 checkpoint with self-attention (VisualPretrain)")
    p.add_argument("--baseline-ckpt", help="a stage-0 checkpoint trained with use_attention: false (Figs. 1-2's VGG16)")
    p.add_argument("--images", required=True, help="a split folder of class folders (data/world/object_crops/val)")
    p.add_argument("--out", required=True, help="folder for the PNGs and occlusion.json")
    p.add_argument("--limit", type=int, default=64, help="images analysed (a seeded choice)")
    p.add_argument("--window", type=int, default=32, help="side of the grey square, in input pixels (paper: 32)")
    p.add_argument("--stride", type=int, default=8, help="step between the square's centres (paper: 8)")
    p.add_argument("--grid", type=int, default=None, help="cells per side for the fraction curve (default image/window)")
    p.add_argument("--fractions", default="0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9", help="occluded fractions of cells")
    p.add_argument("--draws", type=int, default=4, help="random cell choices per image and fraction")
    p.add_argument("--examples", type=int, default=4, help="images shown in the heat-map and attention figures")
    p.add_argument("--resize-size", type=int, default=None, help="resize before the centre crop (default: the run's)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    with user_errors_exit(p.prog):
        try:
            fractions = [float(x) for x in a.fractions.split(",") if x.strip()]
        except ValueError:
            raise OcclusionError(f"--fractions {a.fractions!r}: give comma-separated numbers in [0, 1].") from None
        if not fractions or not all(0 <= f <= 1 for f in fractions):
            raise OcclusionError(f"--fractions {a.fractions!r}: give comma-separated numbers in [0, 1].")
        for name in ("limit", "window", "stride", "draws", "examples", "batch_size"):
            if getattr(a, name) < 1:
                raise OcclusionError(f"--{name.replace('_', '-')} must be at least 1.")
        record = occlusion_analysis(a.ckpt, a.images, a.out, a.baseline_ckpt, a.limit, a.window, a.stride, a.grid,
                                    fractions, a.draws, a.examples, a.resize_size, a.batch_size, a.seed, a.device)
    for name, m in record["models"].items():
        curve = ", ".join(f"{p['fraction']:g}: {p['top1']:.3f}" for p in m["fraction_curve"])
        print(f"{name}: top-1 {m['top1']:.3f}, mean P(correct) {m['p_correct']:.3f} unoccluded, "
              f"{m['p_correct_occluded_mean']:.3f} under the {a.window}-px square; top-1 by occluded fraction {curve}")
    if "comparison" in record:
        c = record["comparison"]
        print(f"attention better in {c['better_total_percent']:.1f} % of {c['trials']} trials, worse in "
              f"{c['worse_total_percent']:.1f} %")
    print("wrote " + ", ".join(record["files"]) + f", {Path(a.out) / 'occlusion.json'}")
    return record


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])

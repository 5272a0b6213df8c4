"""Multimodal image search with VG-BERT's search heads (§4.5, App. B.5, Fig. 7).

    python -m grounding.vgbert.image_search --ckpt search.ckpt --images DIR [--query-image IMG] [--query-text "..."]
        [--alpha 0.5] [--top-k 8] [--grid out.png --alphas 0,0.25,0.5,0.75,1] [--index FILE]

Indexes every image under DIR (batched through the frozen model and F_V; the index of unit vectors
Q_I is cached in a file written atomically and reused while the checkpoint and the image files are
unchanged), then answers an image query, a text query, or both blended as
Q_search = (1 - alpha) Q_I + alpha Q_W, ranking by cosine similarity. ``--grid`` writes a PNG with
one row of top results per alpha (the paper's Fig. 7).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import torch
from PIL import Image, UnidentifiedImageError

from data_modules.images import build_transform
from grounding.checkpoints import load_checkpoint_file
from grounding.encoders import load_tokenizer
from grounding.errors import UserInputError, user_errors_exit
from grounding.paths import cache_dir
from grounding.utils.io import atomic_path, sha1_of_file, sha1_of_json
from grounding.vgbert.search_heads import SearchHeads, multimodal_query, rank_images

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff")


class SearchError(UserInputError, ValueError):
    pass


def list_images(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    if not folder.is_dir():
        raise SearchError(f"--images {folder} is not a folder; give a folder of images (jpg/png/...).")
    paths = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    if not paths:
        raise SearchError(f"No images ({', '.join(IMAGE_SUFFIXES)}) under {folder}.")
    return paths


class Searcher:
    """A loaded :class:`SearchHeads` checkpoint with its image transform and tokenizer."""

    def __init__(self, ckpt: str | Path, device: str = "cpu", max_length: int = 32):
        ckpt = Path(ckpt)
        if not ckpt.is_file():
            raise SearchError(f"--ckpt {ckpt} not found: train the search heads first "
                              "(python -m grounding fit --config experiments/vgbert/search_tiny.yaml).")
        self.ckpt, self.ckpt_sha1 = ckpt, sha1_of_file(ckpt)
        load_checkpoint_file(ckpt, "--ckpt", mmap=True)  # plain data, or one line (Lightning's load below is the same)
        self.module = SearchHeads.load_from_checkpoint(ckpt, map_location=device, init_from=None)
        self.module.eval().to(device)
        self.device = device
        arch = self.module.hparams.stage2
        backbone = self.module.search.grounding.visual.backbone
        size = int(arch.get("image_size", 224))
        self.transform = build_transform(size, size, backbone.mean, backbone.std)
        self.tokenizer = load_tokenizer(arch.get("text_encoder", "minilm"))
        self.max_length = max_length

    def _load(self, path: Path) -> torch.Tensor:
        try:
            with Image.open(path) as im:
                return self.transform(im.convert("RGB"))
        except (OSError, UnidentifiedImageError) as e:
            raise SearchError(f"Cannot read image {path}: {e}") from e

    @torch.no_grad()
    def encode_images(self, paths: Sequence[Path], batch_size: int = 32) -> torch.Tensor:
        out = []
        for i in range(0, len(paths), batch_size):
            batch = torch.stack([self._load(p) for p in paths[i:i + batch_size]]).to(self.device)
            out.append(self.module.encode_images(batch).float().cpu())
        return torch.cat(out)

    @torch.no_grad()
    def encode_text(self, text: str) -> torch.Tensor:
        enc = self.tokenizer([text], truncation=True, max_length=self.max_length, padding=True, return_tensors="pt")
        return self.module.encode_texts(enc["input_ids"].to(self.device),
                                        enc["attention_mask"].to(self.device))[0].float().cpu()

    def index(self, folder: str | Path, index_file: str | Path | None = None, batch_size: int = 32,
              verbose: bool = True) -> tuple[list[Path], torch.Tensor]:
        """(paths, Q_I unit vectors) of every image in ``folder``, cached while nothing changed."""
        paths = [p.resolve() for p in list_images(folder)]
        key = sha1_of_json({"ckpt": self.ckpt_sha1,
                            "images": [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in paths]})
        if index_file is None:
            index_file = cache_dir() / "search" / f"{key[:20]}.pt"
        index_file = Path(index_file)
        if index_file.is_file():
            try:
                cached = torch.load(index_file, map_location="cpu", weights_only=True)
                if cached.get("key") == key:
                    if verbose:
                        print(f"Reusing index {index_file} ({len(paths)} images).")
                    return [Path(p) for p in cached["paths"]], cached["features"]
            except Exception:  # unreadable or foreign file: rebuild it
                pass
        features = self.encode_images(paths, batch_size)
        with atomic_path(index_file) as tmp:
            torch.save({"key": key, "paths": [str(p) for p in paths], "features": features}, tmp)
        if verbose:
            print(f"Indexed {len(paths)} images into {index_file}.")
        return paths, features


def search(index_features: torch.Tensor, q_image: torch.Tensor | None, q_text: torch.Tensor | None, alpha: float,
           top_k: int, exclude: int | None = None) -> tuple[list[int], list[float]]:
    query = multimodal_query(q_image, q_text, alpha)
    ex = torch.tensor([exclude]) if exclude is not None else None
    scores, ids = rank_images(index_features, query, top_k, ex)
    keep = torch.isfinite(scores)
    return ids[keep].tolist(), scores[keep].tolist()


def write_grid(out: str | Path, rows: list[tuple[float, list[Path], list[float]]], query_image: Path | None,
               query_text: str | None, thumb: int = 128) -> Path:
    """One row per alpha: the query (image and/or text) then the top results (Fig. 7)."""
    import matplotlib  # here, not at the top: selecting the Agg backend must precede pyplot's import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 1 + max((len(r[1]) for r in rows), default=0)
    fig, axes = plt.subplots(len(rows), cols, figsize=(1.6 * cols, 1.7 * len(rows)), squeeze=False)
    for r, (alpha, paths, scores) in enumerate(rows):
        for c in range(cols):
            axes[r][c].axis("off")
        ax = axes[r][0]
        if query_image is not None:
            with Image.open(query_image) as im:
                ax.imshow(im.convert("RGB").resize((thumb, thumb)))
        label = f"α = {alpha:g}" + (f"\n“{query_text}”" if query_text else "")
        ax.set_title(label, fontsize=8)
        for c, (p, s) in enumerate(zip(paths, scores), start=1):
            with Image.open(p) as im:
                axes[r][c].imshow(im.convert("RGB").resize((thumb, thumb)))
            axes[r][c].set_title(f"{p.name[:14]}\n{s:.3f}", fontsize=6)
    fig.tight_layout()
    out = Path(out)
    with atomic_path(out, suffix=".png") as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m grounding.vgbert.image_search", description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="a SearchHeads checkpoint (experiments/vgbert/search_*.yaml)")
    p.add_argument("--images", required=True, help="folder of images to search (indexed recursively)")
    p.add_argument("--query-image", help="image query Q_I")
    p.add_argument("--query-text", help="text query Q_W")
    p.add_argument("--alpha", type=float, default=0.5, help="text weight in (1-alpha) Q_I + alpha Q_W")
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--grid", help="write a PNG grid of the top results for every --alphas value")
    p.add_argument("--alphas", default="0,0.25,0.5,0.75,1")
    p.add_argument("--index", help="index cache file (default: <cache>/search/<hash>.pt)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--keep-query", action="store_true", help="let the query image itself appear in the results")
    a = p.parse_args(argv)
    try:
        if a.query_image is None and a.query_text is None and a.grid is None:
            raise SearchError("Give --query-image, --query-text or both (and optionally --grid).")
        alphas = [float(x) for x in a.alphas.split(",") if x.strip()]
        for alpha in [a.alpha, *alphas]:
            if not 0 <= alpha <= 1:
                raise SearchError(f"alpha values must lie in [0, 1]; got {alpha}.")
        # every input named before the model loads and the folder is indexed
        if not Path(a.ckpt).expanduser().is_file():
            raise SearchError(f"--ckpt {a.ckpt} not found: give a search-heads checkpoint (`make stage3` writes "
                              "outputs/vgbert/search_tiny/checkpoints/last.ckpt).")
        if not Path(a.images).expanduser().is_dir():
            raise SearchError(f"--images {a.images} is not a folder: give the folder of images to search.")
        qpath = Path(a.query_image).expanduser().resolve() if a.query_image else None
        if qpath is not None and not qpath.is_file():
            raise SearchError(f"--query-image {qpath} not found: give an image file.")
        searcher = Searcher(a.ckpt, a.device)
        paths, feats = searcher.index(a.images, a.index, a.batch_size)
        q_img = q_txt = None
        exclude = None
        if qpath is not None:
            q_img = searcher.encode_images([qpath])[0]
            if not a.keep_query and qpath in paths:
                exclude = paths.index(qpath)
        if a.query_text:
            q_txt = searcher.encode_text(a.query_text)
        if q_img is None and q_txt is None:
            raise SearchError("--grid needs a query: give --query-image and/or --query-text.")
        alpha = a.alpha if (q_img is not None and q_txt is not None) else (0.0 if q_txt is None else 1.0)
        ids, scores = search(feats, q_img, q_txt, alpha, a.top_k, exclude)
        print(f"Top {len(ids)} for alpha={alpha:g}:")
        for rank, (i, s) in enumerate(zip(ids, scores), 1):
            print(f"  {rank:2d}. {s:.4f}  {paths[i]}")
        result = {"alpha": alpha, "results": [(str(paths[i]), s) for i, s in zip(ids, scores)]}
        if a.grid:
            rows = []
            for al in alphas:
                r_ids, r_scores = search(feats, q_img, q_txt, al, a.top_k, exclude)
                rows.append((al, [paths[i] for i in r_ids], r_scores))
            grid = write_grid(a.grid, rows, Path(a.query_image) if a.query_image else None, a.query_text)
            print(f"Wrote {grid}")
            result["grid"] = {al: [str(p) for p in ps] for al, ps, _ in rows}
        return result
    except SearchError as e:
        print(f"python -m grounding.vgbert.image_search: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    with user_errors_exit("python -m grounding.vgbert.image_search"):
        main()

"""Image loading: the backbone's transform, a decoder whose errors name the file, and the image dataset whose
``load_image`` a feature cache overrides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import torch
from torch.utils.data import Dataset

from grounding.encoders import IMAGENET_MEAN, IMAGENET_STD

from .file_checks import CorruptImageError, MissingDataError


def build_transform(image_size: int = 224, resize_size: int = 256, mean: Sequence[float] = IMAGENET_MEAN,
                    std: Sequence[float] = IMAGENET_STD) -> Callable:
    """Resize the short side to ``resize_size``, centre-crop ``image_size``, normalise with the backbone's stats."""
    from torchvision import transforms

    return transforms.Compose([
        transforms.Resize(resize_size),
        transforms.CenterCrop(image_size),
        transforms.ToTensor(),
        transforms.Normalize(mean=list(mean), std=list(std)),
    ])


def open_rgb(path: Path):
    """Decode an image fully (so truncation is caught here) as RGB; errors name the path."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            img.load()
            return img.convert("RGB")
    except FileNotFoundError as e:
        raise MissingDataError(f"image {path} is missing (it is listed in the annotations).") from e
    except (OSError, SyntaxError, ValueError) as e:  # UnidentifiedImageError and truncation are OSErrors
        raise CorruptImageError(
            f"image {path} is corrupt or not an image ({type(e).__name__}: {e}). "
            "Fix: re-download or re-extract that file."
        ) from e


class ImageDataset(Dataset):
    """Images by split-level index; ``load_image`` is the one place pixels come from, so a feature
    cache can override it and return precomputed backbone features keyed by index."""

    def __init__(self, image_paths: Sequence[Path], transform: Callable):
        self.image_paths = [Path(p) for p in image_paths]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.image_paths)

    def load_image(self, index: int) -> torch.Tensor:
        return self.transform(open_rgb(self.image_paths[index]))


"""The feature-cache callback attaches cached maps of the weights the run actually uses.

A stage whose CNN comes from a checkpoint is built with other (random) weights; Lightning restores
the checkpoint after ``setup`` and prefetches the first evaluation batch before ``on_test_start``.
The cache must be keyed and filled with the restored weights, and every batch (the first included)
must be a cached map.
"""

from __future__ import annotations

import json

import torch
from lightning.pytorch import LightningDataModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, Dataset

from grounding.lightning import GroundingModule


class Pixels(Dataset):
    def __init__(self, n: int = 6):
        self.image_paths = [f"image_{i}.jpg" for i in range(n)]  # need not exist: keyed by name
        self.transform = "fixed"

    def __len__(self):
        return len(self.image_paths)

    def load_image(self, index: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(int(index))
        return torch.rand(3, 4, 4, generator=g)

    def __getitem__(self, index):
        return self.load_image(index)


class Images(LightningDataModule):
    def __init__(self):
        super().__init__()
        self.datasets = {"train": Pixels(), "test": Pixels()}

    def image_datasets(self):
        return list(self.datasets.values())

    def train_dataloader(self):
        return DataLoader(self.datasets["train"], batch_size=2)

    def test_dataloader(self):
        return DataLoader(self.datasets["test"], batch_size=2)


class Stage(GroundingModule):
    def __init__(self):
        super().__init__()
        self.feature_cache = True
        self.backbone = nn.Conv2d(3, 5, 1)
        self.backbone.name = "conv1x1"
        self.backbone.requires_grad_(False)
        self.head = nn.Linear(5, 1)
        self.seen: list[torch.Tensor] = []

    def frozen_backbone(self):
        return self.backbone

    def training_step(self, batch, batch_idx):
        return self.head(batch.float().mean((2, 3))).sum()

    def test_step(self, batch, batch_idx):
        self.seen.append(batch)


def _trainer(tmp_path, **kw):
    return Trainer(default_root_dir=str(tmp_path), accelerator="cpu", devices=1, logger=False,
                   enable_progress_bar=False, enable_model_summary=False, **kw)


def test_cache_uses_the_restored_backbone(tmp_path, monkeypatch):
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(0)
    trained = Stage()
    _trainer(tmp_path / "fit", max_epochs=1, limit_train_batches=1).fit(trained, Images())
    ckpt = tmp_path / "fit" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()

    torch.manual_seed(1)
    restored = Stage()  # other random weights until Lightning restores the checkpoint
    assert not torch.equal(restored.backbone.weight, trained.backbone.weight)
    _trainer(tmp_path / "test").test(restored, Images(), ckpt_path=str(ckpt))

    pixels = Pixels()
    with torch.no_grad():
        expected = trained.backbone(torch.stack([pixels.load_image(i) for i in range(len(pixels))]))
    assert [b.shape[1] for b in restored.seen] == [5, 5, 5]  # every batch, the prefetched first one too
    got = torch.cat(restored.seen).float()
    assert torch.allclose(got, expected.half().float())
    # The cache folders: one for the trained weights (fit and test share it), none for the random ones.
    assert len(list((tmp_path / "cache" / "features").iterdir())) == 1


def test_switched_off_stage_sees_pixels(tmp_path, monkeypatch):
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    stage = Stage()
    stage.feature_cache = False
    _trainer(tmp_path).test(stage, Images())
    assert [b.shape[1] for b in stage.seen] == [3, 3, 3]
    assert not (tmp_path / "cache").exists()


def test_one_cache_serves_every_model_on_the_same_photos(tiny_world, tmp_path, monkeypatch):
    """The cache key is the backbone (and its weights), the transform and the image list, not the model: the dual
    encoder's caption DataModule and COMPOSER's DataModule (VSE, ViLBERT-style, COMPOSER) reading the same photos at
    the same size share every split's cache folder; another resize is another folder."""
    from data_modules import FlickrDataModule
    from data_modules.options import ImageTransform
    from grounding.composer.data import ComposerDataModule, CRGParsing
    from grounding.encoders import load_visual_backbone
    from grounding.feature_cache import cache_key

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    backbone = load_visual_backbone("tiny_cnn", weights=None)

    def reader(resize_size=32):
        return FlickrDataModule(root=str(tiny_world / "flickr"), karpathy_file=None, captions_file=None,
                                text_encoder="tiny-random", transform=ImageTransform(32, resize_size))

    dual = reader()
    dual.setup()
    composer = ComposerDataModule(reader(), parsing=CRGParsing(backend="spacy"), text_encoder="tiny-random",
                                  transform=ImageTransform(32, 32))
    composer.setup()
    other = reader(resize_size=40)
    other.setup()
    keys = [[cache_key(backbone, d) for d in dm.image_datasets()] for dm in (dual, composer, other)]
    assert len(keys[0]) == 3 and keys[0] == keys[1]  # train, val, test: one folder each, shared
    assert not set(keys[0]) & set(keys[2])


class TwoSplits(Images):
    """A training split of other photos than the test split's (another cache key)."""

    def __init__(self):
        super().__init__()
        self.datasets = {"train": Pixels(8), "test": Pixels(6)}


def test_a_test_run_caches_only_the_split_it_reads(tmp_path, monkeypatch):
    """`test` reads the test photos only: the training split (here 8 other photos) is neither cached nor swapped."""
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    stage, dm = Stage(), TwoSplits()
    _trainer(tmp_path).test(stage, dm)
    assert [b.shape[1] for b in stage.seen] == [5, 5, 5]  # the test batches are cached maps
    folders = list((tmp_path / "cache" / "features").iterdir())
    assert [json.loads((f / "meta.json").read_text())["n_images"] for f in folders] == [6]
    assert not hasattr(dm.datasets["train"], "_pixel_load_image")  # never swapped to cached maps
    # a fit then reads the training split: its cache is built when its loader is first asked for
    _trainer(tmp_path / "fit", max_epochs=1, limit_train_batches=1).fit(Stage(), dm)
    assert len(list((tmp_path / "cache" / "features").iterdir())) == 2

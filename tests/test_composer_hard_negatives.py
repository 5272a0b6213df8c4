"""COMPOSER's hard-negative pool (ℓ_match's ViLBERT negatives): the top-k neighbour search, its cache, the
training collate's hard captions and a fast_dev_run of the world config with ``hard_negatives: pool``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_composer_model import TREES, tiny_net
from test_configs import offline_overrides

from data_modules.file_checks import MalformedDataError
from grounding.cli import main
from grounding.composer import ConceptGraph, extract_crg, hard_negatives
from grounding.composer.batch import TokenTables, composition_batch
from grounding.composer.concept_graph import OK
from grounding.composer.data import ComposerDataModule, CRGParsing, HardNegativePool, SplitGraph, _TrainCollate, _TrainItems
from grounding.composer.hard_negatives import (
    backbone_embeddings,
    cached_pool,
    draw_hard_captions,
    hard_draws,
    nearest_neighbours,
    pool_path,
    read_embeddings_file,
    training_pool,
)
from grounding.composer.training import ComposerTraining
from grounding.encoders import load_tokenizer
from grounding.feature_cache import CachedFeatureLoader
from grounding.paths import EXPERIMENTS_DIR


# ---------------------------------------------------------------------------------------------- top-k
def brute_force(x: np.ndarray, k: int) -> np.ndarray:
    """Each row's k most cosine-similar other rows, by Python sorting on (−cosine, index)."""
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    sim = u @ u.T
    return np.array([sorted((j for j in range(len(x)) if j != i), key=lambda j: (-sim[i, j], j))[:k] for i in range(len(x))])


def test_nearest_neighbours_hand_computed_with_ties():
    # rows 0, 1, 3 point the same way, 2 is orthogonal to them, 4 opposite: cosines 1, 0, −1 exactly
    x = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [3.0, 0.0], [-1.0, 0.0]])
    expected = [[1, 3, 2], [0, 3, 2], [0, 1, 3], [0, 1, 2], [2, 0, 1]]  # equal cosines in index order
    for chunk in (1, 2, 3, 5, 64):  # block boundaries inside and between the tied rows
        assert nearest_neighbours(x, 3, chunk=chunk).tolist() == expected
    assert nearest_neighbours(x, 2, chunk=2).tolist() == [r[:2] for r in expected]


@pytest.mark.parametrize("chunk", [1, 7, 100])
def test_nearest_neighbours_match_brute_force(chunk):
    x = np.random.default_rng(0).normal(size=(23, 5))
    got = nearest_neighbours(torch.from_numpy(x), 6, chunk=chunk).numpy()
    np.testing.assert_array_equal(got, brute_force(x, 6))
    # P above N − 1: every other image, none twice, never itself
    everyone = nearest_neighbours(torch.from_numpy(x), 100, chunk=chunk).numpy()
    assert everyone.shape == (23, 22)
    np.testing.assert_array_equal(everyone, brute_force(x, 22))


def test_nearest_neighbours_reject_bad_embeddings():
    with pytest.raises(ValueError, match="NaN"):
        nearest_neighbours(torch.tensor([[1.0, float("nan")], [0.0, 1.0]]), 1)


# ---------------------------------------------------------------------------------------------- cache
class CountingEmbed:
    def __init__(self, x):
        self.x, self.calls = x, 0

    def __call__(self):
        self.calls += 1
        return self.x


def test_pool_cache_is_reused_and_written_atomically(tmp_path, monkeypatch):
    x = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [-1.0, 0.2]])
    embed = CountingEmbed(x)
    pool = cached_pool("a" * 40, 4, 2, embed, root=tmp_path)
    assert pool.tolist() == [[1, 2], [0, 2], [3, 1], [2, 1]]
    assert embed.calls == 1
    assert [p.name for p in tmp_path.iterdir()] == [pool_path("a" * 40, tmp_path).name]  # no temporary left
    np.testing.assert_array_equal(cached_pool("a" * 40, 4, 2, embed, root=tmp_path), pool)
    assert embed.calls == 1  # read back, not recomputed
    # a write that fails half-way leaves nothing behind, not even its temporary
    def broken_savez(f, **arrays):
        f.write(b"PK half a zip")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", broken_savez)
    with pytest.raises(OSError, match="disk full"):
        cached_pool("b" * 40, 4, 2, embed, root=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [pool_path("a" * 40, tmp_path).name]
    with pytest.raises(FileNotFoundError):
        cached_pool("c" * 40, 4, 2, embed, root=tmp_path, build=False)


@pytest.mark.parametrize("damage", ["key", "truncated", "shape"])
def test_bad_pool_file_is_rebuilt(tmp_path, damage):
    x = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [-1.0, 0.2]])
    key = "d" * 40
    path = pool_path(key, tmp_path)
    good = cached_pool(key, 4, 2, CountingEmbed(x), root=tmp_path)
    if damage == "key":  # another pool's file under this name
        np.savez(path, key=np.array("e" * 40), neighbours=good)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:50])
    else:
        np.savez(path, key=np.array(key), neighbours=good[:, :1])
    embed = CountingEmbed(x)
    np.testing.assert_array_equal(cached_pool(key, 4, 2, embed, root=tmp_path), good)
    assert embed.calls == 1
    with np.load(path) as z:  # the rebuilt file is valid again
        assert str(z["key"]) == key and z["neighbours"].shape == (4, 2)


# ---------------------------------------------------------------------------------------------- sources
class FakeImages:
    def __init__(self, n):
        from pathlib import Path

        self.image_paths = [Path(f"/photos/{i}.jpg") for i in range(n)]


def test_training_pool_from_an_embeddings_file(tmp_path):
    emb = np.array([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1], [0.1, 0.9], [-1.0, 0.0]], dtype=np.float32)
    file = tmp_path / "emb.npz"
    # any order, with directories: matched by file name
    np.savez(file, names=np.array([f"dir/{i}.jpg" for i in (4, 3, 2, 1, 0)]), embeddings=emb[::-1])
    pool = training_pool(FakeImages(5), np.array([0, 1, 2, 3]), 2, embeddings_file=str(file), root=tmp_path / "cache")
    # image 4 has no decomposed caption: no row, never a neighbour
    assert pool.tolist() == [[2, 3], [3, 2], [0, 3], [1, 2], [-1, -1]]
    np.savez(file, names=np.array(["0.jpg", "1.jpg"]), embeddings=emb[:2])
    with pytest.raises(MalformedDataError, match="lacks 3 of the 5 training images"):
        read_embeddings_file(file, [f"{i}.jpg" for i in range(5)])
    file.write_text("not an npz")
    with pytest.raises(MalformedDataError, match="names.*embeddings"):
        read_embeddings_file(file, ["0.jpg"])
    with pytest.raises(ValueError, match="hard_negative_pool.embeddings"):
        training_pool(FakeImages(5), np.array([0, 1, 2]), 2, root=tmp_path / "cache")


# ---------------------------------------------------------------------------------------------- collate
def six_caption_split():
    """6 captions (the 3 test trees twice) of images 0, 0, 1, 2, 2, 3 (image 3's caption fails to parse)."""
    trees = TREES + TREES
    crgs = [extract_crg(t) for t in trees[:5]] + [None]
    texts = ["a dog running on the grass", "two cats", "a red ball next to a box"] * 2
    graph = ConceptGraph.build(crgs, [0, 0, 1, 2, 2, 3], [f"{i}.jpg" for i in range(4)])
    return SplitGraph(graph, TokenTables(graph, load_tokenizer("tiny-random"), texts), np.zeros(6, dtype=bool))


def test_draw_hard_captions_hand_computed():
    pool = np.array([[2, 1], [0, 2], [0, 1]])
    ptr, ids = np.array([0, 2, 3, 5]), np.array([10, 11, 20, 30, 31])  # image 0: 10, 11; 1: 20; 2: 30, 31
    key = np.array([0, 1, 2, 3])
    # key mod P picks the neighbour, (key div P) mod n its caption
    assert draw_hard_captions(pool, ptr, ids, np.array([0, 0, 0, 1]), key).tolist() == [30, 20, 31, 31]
    assert hard_draws(100, 5) == 84_000 and hard_draws(100, 1 << 20) == 100


def test_train_collate_appends_a_neighbours_caption():
    split = six_caption_split()
    per_image = [np.array([0, 1]), np.array([2]), np.array([3, 4]), np.array([], dtype=np.int64)]
    pool = np.array([[2, 1], [0, 2], [1, 0], [-1, -1]])
    ptr = np.array([0, 2, 3, 5, 5])
    collate = _TrainCollate(split, pool, ptr, np.concatenate(per_image))
    items = _TrainItems(FakeLoader(4), per_image)
    batch = collate([items[(0, 3)], items[(1, 1)], items[(2, 0)]])
    # positives: image 0 choice 3 -> caption 1, key 1; image 1 -> caption 2, key 1; image 2 -> caption 3, key 0
    assert batch["captions"].tolist()[:3] == [1, 2, 3]
    # hard: image 0 neighbour slot 1 = image 1 (caption 2); image 1 slot 1 = image 2, caption 0 of it = 3;
    # image 2 slot 0 = image 1 (caption 2)
    assert batch["captions"].tolist()[3:] == [2, 3, 2]
    assert batch["hard_caption"].tolist() == [3, 4, 5]
    assert len(batch["caption_node_ptr"]) == 7 and batch["images"].shape[0] == 3
    # without a pool: the B positives only, as before
    plain = _TrainCollate(split)([items[(0, 3)], items[(1, 1)], items[(2, 0)]])
    assert plain["captions"].tolist() == [1, 2, 3] and "hard_caption" not in plain


class FakeLoader:
    """A caption dataset stand-in: image i is a constant (3, 8, 8) tensor of value i."""

    def __init__(self, n):
        self.image_paths = FakeImages(n).image_paths

    def load_image(self, index):
        return torch.full((3, 8, 8), float(index))


def test_pool_losses_match_the_positives_only_ones():
    """ℓ_MVSA and ℓ_order see only the positives: appending hard captions leaves them as they were, and ℓ_match's
    fourth pair of each positive is its hard caption row."""
    split = six_caption_split()
    positives = [0, 2, 3]
    hard = composition_batch(split.graph, split.tables, positives + [5, 2, 1])  # a fallback, a repeat
    hard["hard_caption"] = torch.tensor([3, 4, 5])
    plain = composition_batch(split.graph, split.tables, positives)
    images = torch.randn(3, 3, 32, 32)
    net = tiny_net()
    pool_module = ComposerTraining(net, hard_negatives="pool", feature_cache=False).eval()
    batch_module = ComposerTraining(net, hard_negatives="batch", feature_cache=False).eval()
    torch.manual_seed(0)
    with_hard = pool_module.compute_losses({**hard, "images": images})
    torch.manual_seed(0)
    without = batch_module.compute_losses({**plain, "images": images})
    for name in ("mvsa", "order"):
        torch.testing.assert_close(with_hard[name], without[name])
    assert torch.isfinite(with_hard["match"])
    with pytest.raises(ValueError, match="hard captions"):
        pool_module.compute_losses({**plain, "images": images})


# ---------------------------------------------------------------------------------------------- the DataModule
def world_module(world, **kw) -> ComposerDataModule:
    from data_modules import FlickrDataModule

    captions = FlickrDataModule(root=str(world / "flickr"), karpathy_file=None, captions_file=None)
    dm = ComposerDataModule(captions, parsing=CRGParsing(backend="spacy"), text_encoder="tiny-random", batch_size=8,
                            transform={"image_size": 32, "resize_size": 32}, **kw)
    dm.setup("fit")
    return dm


def test_world_train_loader_hard_captions_are_neighbours(tiny_world, tmp_path, monkeypatch):
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    probe = world_module(tiny_world)
    names = [p.name for p in probe.train_dataset.image_paths]
    np.savez(tmp_path / "emb.npz", names=np.array(names), embeddings=rng.normal(size=(len(names), 8)))
    dm = world_module(tiny_world, hard_negatives="pool",
                      hard_negative_pool=HardNegativePool(pool_size=3, embeddings=str(tmp_path / "emb.npz")))
    graph = dm.graphs["train"].graph

    def epoch(e):
        loader = dm.train_dataloader()
        loader.sampler.set_epoch(e)
        return [(b["image_index"], b["captions"], b["hard_caption"]) for b in loader]

    first = epoch(0)
    pool = training_pool(dm.train_dataset, np.unique(graph.caption_image[graph.caption_status == OK]), 3,
                         embeddings_file=str(tmp_path / "emb.npz"))
    for image, captions, hard_rows in first:
        b = len(image)
        hard_image = graph.caption_image[captions[hard_rows].numpy()]
        assert hard_rows.tolist() == list(range(b, 2 * b))
        assert (hard_image != image.numpy()).all()
        assert all(h in pool[i] for i, h in zip(image.tolist(), hard_image.tolist()))
        assert (graph.caption_status[captions.numpy()] == OK).all()
    again = epoch(0)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(first, again))  # reproducible per (seed, epoch)
    other = epoch(1)
    assert any(not torch.equal(a[1], b[1]) for a, b in zip(first, other))
    # a fit resumed after epoch 1's first batch (the loader's state in its checkpoint) goes on with the second
    resumed = dm.train_dataloader()
    resumed.load_state_dict({"epoch": 1, "batches": 1})
    resumed.sampler.set_epoch(1)
    rest = [b["captions"] for b in resumed]
    assert len(rest) == len(other) - 1 and all(torch.equal(a, b[1]) for a, b in zip(rest, other[1:]))


# ---------------------------------------------------------------------------------------------- end to end
def test_world_config_fast_dev_run_with_the_pool(tiny_world, tmp_path, monkeypatch):
    """The CLI links the model's hard_negatives to the DataModule, which embeds the training images with the
    model's frozen CNN from the feature cache's maps (attached before the train loader is made)."""
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    sources = []

    def spy(backbone, dataset, *args, **kwargs):
        sources.append(type(dataset.load_image))
        return backbone_embeddings(backbone, dataset, *args, **kwargs)

    monkeypatch.setattr(hard_negatives, "backbone_embeddings", spy)
    path = EXPERIMENTS_DIR / "composer" / "composer_world.yaml"
    main(["fit", "--config", str(path), *offline_overrides(path, tiny_world, tmp_path),
          "--model.init_args.hard_negatives", "pool", "--data.init_args.hard_negative_pool.pool_size", "5"])
    pools = list((tmp_path / "cache" / "composer" / "hard_negatives").glob("*.npz"))
    assert len(pools) == 1
    with np.load(pools[0]) as z:
        assert z["neighbours"].shape[1] == 5
    assert sources == [CachedFeatureLoader]


def test_semclip_command_writes_a_pool_source(tiny_world, tmp_path, monkeypatch):
    """``python -m grounding.semclip hard-negative-embeddings``: a suite checkpoint's image embeddings, read back
    as the pool's source."""
    from semclip_helpers import tiny_baseline_ckpt

    from grounding.semclip.__main__ import main as semclip_main

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    ckpt = tiny_baseline_ckpt(tmp_path / "vlm")
    out = tmp_path / "emb.npz"
    semclip_main(["hard-negative-embeddings", "--vlm", f"suite:{ckpt}", "--images", str(tiny_world / "flickr" / "images"),
                  "--out", str(out)])
    images = sorted((tiny_world / "flickr" / "images").glob("*.jpg"))
    emb = read_embeddings_file(out, [p.name for p in images[::-1]])
    assert emb.shape[0] == len(images) and torch.isfinite(emb).all()
    ds = FakeImages(0)
    ds.image_paths = images
    pool = training_pool(ds, np.arange(len(images)), 4, embeddings_file=str(out), root=tmp_path / "pools")
    assert pool.shape == (len(images), 4) and (pool != np.arange(len(images))[:, None]).all()

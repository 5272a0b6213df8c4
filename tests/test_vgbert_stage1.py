"""VG-BERT stage 1: streams, match map (Eq. 1), contrastive loss (Eq. 2), freezing, feature cache."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from run_helpers import FakeImages

from grounding import feature_cache as fcache
from grounding.contrastive import cross_modal_contrastive_loss
from grounding.retrieval_training import collect_eval_outputs
from grounding.vgbert.dual_encoder import DualEncoder
from grounding.vgbert.match_map import chunked_match_scores, einsum_match_scores, match_map, match_map_scores, pair_loop_scores
from grounding.vgbert.pretrain import MatchMapGrounding
from grounding.vgbert.streams import LanguageStream, VisualStream, word_mask

TINY = dict(text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None, visual_heads=4,
            trainable_layers=2, image_size=64)


# ------------------------------------------------------------------------------ match map (Eq. 1)
def test_match_map_hand_computed_with_padding():
    # 1 image with 2 locations, 2 captions; caption 1 has a padded third token that would win the max.
    v = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])  # (1, N=2, d=2)
    words = torch.tensor([[[1.0, 1.0], [3.0, 0.0], [0.0, 0.0]],
                          [[0.0, 1.0], [1.0, 0.0], [9.0, 9.0]]])  # (2, T=3, 2)
    mask = torch.tensor([[True, True, False], [True, True, False]])
    # caption 0: word (1,1) -> max(1, 2) = 2; word (3,0) -> max(3, 0) = 3; S = 5
    # caption 1: word (0,1) -> max(0, 2) = 2; word (1,0) -> max(1, 0) = 1; S = 3 (padding 9+9 ignored)
    s = match_map_scores(v, words, mask, "sum")
    assert torch.allclose(s, torch.tensor([[5.0, 3.0]]))
    assert torch.allclose(match_map_scores(v, words, mask, "mean"), torch.tensor([[2.5, 1.5]]))
    # The paired 3D match map M_ijk of image 0 and caption 0, laid out as (h=1, w=2).
    m = match_map(v.reshape(1, 1, 2, 2), words[:1])
    assert torch.allclose(m[0, 0], torch.tensor([[1.0, 3.0, 0.0], [2.0, 0.0, 0.0]]))


def test_word_mask_excludes_padding_and_special_tokens():
    ids = torch.tensor([[101, 7, 8, 102, 0]])
    att = torch.tensor([[1, 1, 1, 1, 0]])
    assert word_mask(ids, att).tolist() == [[True, True, True, True, False]]
    assert word_mask(ids, att, (101, 102)).tolist() == [[False, True, True, False, False]]


def test_chunked_scores_equal_unchunked_and_pair_loop():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(7, 5, 8, generator=g)
    w = torch.randn(11, 6, 8, generator=g)
    mask = torch.rand(11, 6, generator=g) > 0.3
    mask[:, 0] = True
    full = match_map_scores(v, w, mask)
    assert torch.allclose(full, pair_loop_scores(v, w, mask), atol=1e-5)
    assert torch.allclose(full, chunked_match_scores(v, w, mask, image_chunk=3, text_chunk=4), atol=1e-5)
    # Training-time chunking (checkpointed) gives the same values and the same gradients.
    v1, w1 = v.clone().requires_grad_(), w.clone().requires_grad_()
    v2, w2 = v.clone().requires_grad_(), w.clone().requires_grad_()
    s1 = match_map_scores(v1, w1, mask)
    s2 = match_map_scores(v2, w2, mask, max_elements=2 * 11 * 5 * 6)  # 2 images per chunk
    assert torch.allclose(s1, s2, atol=1e-5)
    (s1 * torch.arange(77.0).reshape(7, 11)).sum().backward()
    (s2 * torch.arange(77.0).reshape(7, 11)).sum().backward()
    assert torch.allclose(v1.grad, v2.grad, atol=1e-4) and torch.allclose(w1.grad, w2.grad, atol=1e-4)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_sparse_match_map_backward_passes_gradcheck(reduction):
    # float64, masked words, images in chunks of 2: the sparse backward is the derivative of the forward
    g = torch.Generator().manual_seed(1)
    v = torch.randn(5, 7, 6, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(4, 3, 6, dtype=torch.float64, generator=g, requires_grad=True)
    mask = torch.rand(4, 3, generator=g) > 0.3
    mask[:, 0] = True
    assert torch.autograd.gradcheck(lambda a, b: match_map_scores(a, b, mask, reduction, max_elements=2 * 4 * 7 * 3),
                                    (v, w))


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("ties", [False, True])
def test_sparse_match_map_equals_dense_einsum(reduction, ties):
    # Integer features make many locations tie for a word's maximum: the gradient is split evenly among them,
    # exactly as autograd's amax does in the dense einsum version.
    g = torch.Generator().manual_seed(2)
    if ties:
        v = torch.randint(-2, 3, (6, 9, 4), generator=g).double()
        w = torch.randint(-2, 3, (7, 5, 4), generator=g).double()
    else:
        v, w = torch.randn(6, 9, 4, generator=g).double(), torch.randn(7, 5, 4, generator=g).double()
    mask = torch.rand(7, 5, generator=g) > 0.3
    weights = torch.randn(6, 7, generator=g, dtype=torch.float64)
    grads = []
    for fn in (lambda a, b: match_map_scores(a, b, mask, reduction, max_elements=3 * 7 * 9 * 5),
               lambda a, b: einsum_match_scores(a, b, mask, reduction)):
        a, b = v.clone().requires_grad_(), w.clone().requires_grad_()
        s = fn(a, b)
        (s * weights).sum().backward()
        grads.append((s.detach(), a.grad, b.grad))
    (s1, gv1, gw1), (s2, gv2, gw2) = grads
    assert torch.allclose(s1, s2, atol=1e-12)
    assert torch.allclose(gv1, gv2, atol=1e-12) and torch.allclose(gw1, gw2, atol=1e-12)
    if ties:  # the case is not vacuous: some counted word ties over locations in some pair
        m = torch.einsum("ind,jtd->ijnt", v, w)
        assert ((m == m.amax(2, keepdim=True)).sum(2) > 1).any()


def test_sparse_match_map_one_side_trainable():
    g = torch.Generator().manual_seed(3)
    v = torch.randn(3, 4, 5, generator=g, requires_grad=True)
    w = torch.randn(2, 3, 5, generator=g)
    mask = torch.ones(2, 3, dtype=torch.bool)
    match_map_scores(v, w, mask).sum().backward()
    a = v.detach().clone().requires_grad_()
    einsum_match_scores(a, w, mask).sum().backward()
    assert torch.allclose(v.grad, a.grad, atol=1e-6)


def test_eval_outputs_read_in_split_order_without_concatenating():
    g = torch.Generator().manual_seed(4)
    # three batches arrive out of order, with different caption lengths
    image_index = [torch.tensor([4, 1]), torch.tensor([0, 3]), torch.tensor([2])]
    store = [dict(img=torch.randn(len(ix), 3, 2, generator=g), image_index=ix,
                  txt=torch.randn(2 * len(ix), t, 2, generator=g), mask=torch.ones(2 * len(ix), t, dtype=torch.bool),
                  caption_image_index=ix.repeat_interleave(2)) for ix, t in zip(image_index, (3, 5, 2))]
    expect_img = torch.cat([s["img"] for s in store])[torch.argsort(torch.cat(image_index))]
    expect_txt = [s["txt"] for s in store]
    img, ix, txt, mask, cap = collect_eval_outputs(store)
    assert ix.tolist() == [0, 1, 2, 3, 4] and img.shape == (5, 3, 2) and torch.equal(img[:], expect_img)
    assert torch.equal(img[1:4], expect_img[1:4]) and torch.equal(img[3:], expect_img[3:])
    assert all(a is s["img"] for a, s in zip(img.pieces, store))  # the batches themselves, not copies
    assert txt.shape == (10, 5, 2) and torch.equal(txt[:4][:, :3], expect_txt[0]) and torch.equal(txt[4:8], expect_txt[1])
    assert not txt[:4][:, 3:].any() and mask[:].sum(1).tolist() == [3] * 4 + [5] * 4 + [2] * 2
    assert torch.equal(txt[3:6][1:], txt[:][4:6])
    assert cap.tolist() == [4, 4, 1, 1, 0, 0, 3, 3, 2, 2]
    # the block scorer reads them by slices: same scores as from concatenated tensors
    dense = chunked_match_scores(img[:], txt[:], mask[:], "mean")
    assert torch.allclose(chunked_match_scores(img, txt, mask, "mean", image_chunk=2, text_chunk=3), dense)


# ------------------------------------------------------------------------------ loss (Eq. 2)
def test_contrastive_loss_hand_computed_2x2():
    s = torch.tensor([[1.0, 0.0], [0.5, 2.0]])
    tau = 0.5
    out = cross_modal_contrastive_loss(s, tau)
    e = math.exp
    # Loss_l: rows (image anchors); Loss_v: columns (caption anchors)
    loss_l = -0.5 * (math.log(e(2) / (e(2) + e(0))) + math.log(e(4) / (e(1) + e(4))))
    loss_v = -0.5 * (math.log(e(2) / (e(2) + e(1))) + math.log(e(4) / (e(0) + e(4))))
    assert out["loss_l"].item() == pytest.approx(loss_l, rel=1e-6)
    assert out["loss_v"].item() == pytest.approx(loss_v, rel=1e-6)
    assert out["loss"].item() == pytest.approx(loss_l + loss_v, rel=1e-6)
    assert cross_modal_contrastive_loss(s, tau, use_loss_v=False)["loss"].item() == pytest.approx(loss_l, rel=1e-6)
    assert cross_modal_contrastive_loss(s, tau, use_loss_l=False)["loss"].item() == pytest.approx(loss_v, rel=1e-6)
    assert cross_modal_contrastive_loss(s, tau, combine="mean")["loss"].item() == pytest.approx((loss_l + loss_v) / 2)
    with pytest.raises(ValueError, match="At least one"):
        cross_modal_contrastive_loss(s, tau, use_loss_l=False, use_loss_v=False)


# ------------------------------------------------------------------------------ streams
def test_language_stream_freezes_all_but_top_k_and_query_key():
    stream = LanguageStream("tiny-random", trainable_layers=1, freeze_query_key=True)
    trainable = {n for n, p in stream.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("bert.encoder.layer.1.") for n in trainable)
    assert not any(".query." in n or ".key." in n for n in trainable)
    assert "bert.encoder.layer.1.attention.self.value.weight" in trainable
    qk = LanguageStream("tiny-random", trainable_layers=2, freeze_query_key=False)
    names = {n for n, p in qk.named_parameters() if p.requires_grad}
    assert "bert.encoder.layer.0.attention.self.query.weight" in names
    assert not any(n.startswith("bert.embeddings") for n in names)
    assert not any(p.requires_grad for p in LanguageStream("tiny-random", trainable_layers=0).parameters())
    with pytest.warns(UserWarning, match="exceeds"):
        assert LanguageStream("tiny-random", trainable_layers=8).trainable_layers == 2


def test_visual_stream_images_and_features_and_heads_error():
    torch.manual_seed(0)
    vs = VisualStream(32, "tiny_cnn", None, num_heads=4, image_size=64).eval()
    assert not any(p.requires_grad for p in vs.backbone.parameters())
    images = torch.randn(2, 3, 64, 64)
    from_images = vs(images=images)
    assert from_images.shape == (2, 4, 4, 32)
    assert torch.allclose(vs(features=vs.backbone_features(images)), from_images, atol=1e-6)
    assert vs(features=torch.randn(1, 64, 6, 5)).shape == (1, 6, 5, 32)  # positional encoding interpolated
    with pytest.raises(ValueError, match="does not divide"):
        VisualStream(32, "tiny_cnn", None, num_heads=12)
    with pytest.raises(ValueError, match="expects feature maps"):
        vs(features=torch.randn(1, 512, 4, 4))


# ------------------------------------------------------------------------------ LightningModules
def _train_batch(b=4, t=7):
    ids = torch.randint(1000, 2000, (b, t))
    ids[:, 0], ids[:, -1] = 101, 102
    return {"images": torch.randn(b, 3, 64, 64), "input_ids": ids, "attention_mask": torch.ones(b, t, dtype=torch.long),
            "image_index": torch.arange(b), "captions": ["x"] * b}


def _eval_batch():
    ids = torch.randint(1000, 2000, (7, 6))
    return {"images": torch.randn(3, 3, 64, 64), "image_index": torch.tensor([2, 0, 1]), "input_ids": ids,
            "attention_mask": torch.ones(7, 6, dtype=torch.long), "caption_image_index": torch.tensor([2, 2, 0, 0, 0, 1, 1])}


@pytest.mark.parametrize("cls_name", ["GroundingPretrain", "DualEncoderBaseline"])
def test_modules_train_and_evaluate_on_synthetic_batches(cls_name):
    import grounding.vgbert as vgbert

    torch.manual_seed(0)
    net = {"GroundingPretrain": vgbert.MatchMapGrounding, "DualEncoderBaseline": DualEncoder}[cls_name]
    module = getattr(vgbert, cls_name)(net(**TINY))
    assert module.monitor == "val/rsum" and module.monitor_mode == "max"
    assert module.hparams.net["init_args"]["text_encoder"] == "tiny-random"
    logged = {}
    module.log = lambda k, v, **kw: logged.__setitem__(k, float(torch.as_tensor(v).detach()))
    loss = module.training_step(_train_batch(), 0)
    loss.backward()
    assert torch.isfinite(loss) and {"train/loss", "train/loss_l", "train/loss_v"} <= set(logged)
    assert module.model.visual.embedder.weight.grad is not None
    assert module.model.language.bert.encoder.layer[1].attention.self.value.weight.grad is not None
    module.eval()
    with torch.no_grad():
        module.validation_step(_eval_batch(), 0)
    module.on_validation_epoch_end()
    assert 0 <= logged["val/rsum"] <= 600 and logged["val/i2t_medr"] >= 1


def test_pretrain_rejects_bad_configuration():
    from grounding.vgbert import GroundingPretrain

    with pytest.raises(ValueError, match="word_reduction"):
        GroundingPretrain(MatchMapGrounding(**TINY), word_reduction="max")
    with pytest.raises(ValueError, match="enable at least one"):
        GroundingPretrain(MatchMapGrounding(**TINY), use_loss_l=False, use_loss_v=False)
    with pytest.raises(ValueError, match="loss_terms"):
        GroundingPretrain(MatchMapGrounding(**TINY), loss_terms="lv")
    only_v = GroundingPretrain(MatchMapGrounding(**TINY), loss_terms="v")
    assert (only_v.hparams.use_loss_l, only_v.hparams.use_loss_v) == (False, True)


def test_sweep_grid_expands_to_cli_overrides():
    from grounding.sweep import build_command, expand_grid

    sweep = {"program": "grounding", "method": "grid",
             "parameters": {"model.init_args.trainable_layers": {"values": [4, 8]},
                            "model.init_args.freeze_query_key": {"values": [True, False]},
                            "model.init_args.dropout": {"value": 0.3}},
             "command": ["${env}", "${interpreter}", "-m", "grounding", "fit", "--config", "a.yaml", "${args}"]}
    grid = expand_grid(sweep)
    assert len(grid) == 4
    cmd = build_command(sweep, grid[1], config="b.yaml", extra=["trainer.max_epochs=1"])
    assert cmd[1:7] == ["-m", "grounding", "fit", "--config", "b.yaml", "--model.init_args.trainable_layers=4"]
    assert "--model.init_args.freeze_query_key=false" in cmd and cmd[-1] == "--trainer.max_epochs=1"
    with pytest.raises(ValueError, match="grid"):
        expand_grid({**sweep, "method": "bayes"})


# ------------------------------------------------------------------------------ feature cache
class _FailingBackbone(torch.nn.Module):
    name = "failing"

    def __init__(self, inner, fail_after):
        super().__init__()
        self.inner, self.calls, self.fail_after = inner, 0, fail_after

    def forward(self, x):
        self.calls += 1
        if self.calls > self.fail_after:
            raise RuntimeError("simulated crash mid-write")
        return self.inner(x)


def test_feature_cache_atomic_and_reused(tmp_path):
    from grounding.encoders import load_visual_backbone

    torch.manual_seed(0)
    backbone = load_visual_backbone("tiny_cnn", weights=None)
    ds = FakeImages(tmp_path)
    root = tmp_path / "cache"
    failing = _FailingBackbone(backbone, fail_after=1)
    with pytest.raises(RuntimeError, match="simulated"):
        fcache.build_or_load(failing, ds, root, batch_size=2)
    assert not any(root.glob("failing-*")), "a crashed build must leave no cache folder"
    assert not any(p.name.startswith(".") and "tmp" in p.name for p in root.iterdir())
    with pytest.raises(FileNotFoundError):
        fcache.build_or_load(failing, ds, root, batch_size=2, build=False)

    loader = fcache.build_or_load(backbone, ds, root, batch_size=2)
    expected = backbone(torch.stack([ds.load_image(i) for i in range(5)]))
    assert loader.array.dtype == np.float16 and loader.array.shape == tuple(expected.shape)
    assert torch.allclose(loader(3).float(), expected[3], atol=1e-2, rtol=1e-2)
    assert torch.allclose(loader.lookup(torch.tensor([4, 0])).float(), expected[[4, 0]], atol=1e-2, rtol=1e-2)
    mtime = (loader.path / "features.npy").stat().st_mtime_ns
    # Reuse: same backbone/images -> same folder, not rewritten; attaching swaps pixels for features.
    fcache.attach(ds, loader)
    again = fcache.build_or_load(backbone, ds, root, batch_size=2)
    assert again.path == loader.path and (again.path / "features.npy").stat().st_mtime_ns == mtime
    assert ds.load_image(1).shape == expected.shape[1:]
    fcache.detach(ds)
    assert ds.load_image(1).shape == (3, 32, 32)
    # Other weights -> another key.
    other = load_visual_backbone("tiny_cnn", weights=None)
    assert fcache.build_or_load(other, ds, root, batch_size=2).path != loader.path
    # A folder with inconsistent metadata is refused with a clear error.
    (loader.path / "meta.json").write_text('{"complete": true, "shape": [1]}')
    with pytest.raises(ValueError, match="inconsistent"):
        fcache.open_cache(loader.path)


# ------------------------------------------------------------------------------ end to end
def test_fit_on_tiny_world_uses_feature_cache(tiny_world, tmp_path, monkeypatch):
    import lightning as L

    from data_modules import CocoCaptionsDataModule
    from grounding.vgbert import GroundingPretrain

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    L.seed_everything(0)
    dm = CocoCaptionsDataModule(root=str(tiny_world / "coco"), text_encoder="tiny-random", batch_size=8,
                                transform={"image_size": 64, "resize_size": 64})
    module = GroundingPretrain(MatchMapGrounding(**TINY))
    trainer = L.Trainer(max_epochs=1, limit_train_batches=2, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=tmp_path)
    trainer.fit(module, dm)
    metrics = trainer.callback_metrics
    assert 0 <= float(metrics["val/rsum"]) <= 600 and float(metrics["val/t2i_medr"]) >= 1
    caches = sorted((tmp_path / "cache" / "features").iterdir())
    distinct_image_lists = {tuple(ds.image_paths) for ds in dm.datasets.values()}  # equal lists share a cache
    assert len(caches) == len(distinct_image_lists) and all((c / "meta.json").is_file() for c in caches)
    # Batches now carry the cached (C, h, w) maps of the frozen tiny CNN instead of pixels.
    assert dm.datasets["train"].load_image(0).shape == (64, 4, 4)
    # The checkpoint rebuilds the injected network from its recorded spec, weights included.
    reloaded = GroundingPretrain.load_from_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert reloaded.hparams.net["init_args"]["text_encoder"] == "tiny-random"
    assert isinstance(reloaded.model, MatchMapGrounding)
    trained = module.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in reloaded.state_dict().items())


def test_language_stream_trains_with_dropout():
    import torch

    from grounding.vgbert import LanguageStream

    stream = LanguageStream("tiny-random", trainable_layers=1, hidden_dropout=0.5)
    assert stream.bert.training and all(m.training for m in stream.bert.modules())
    ids = torch.tensor([[101, 2417, 3608, 102]])
    mask = torch.ones_like(ids)
    torch.manual_seed(0)
    a, b = stream(ids, mask), stream(ids, mask)
    assert not torch.allclose(a, b)  # dropout is active in training mode


# ------------------------------------------------------------------------------ the paper config's official choices
def _official_match_scores(image_outputs, language_outputs, nwords):
    """The authors' stage-1 similarity (yizhen-zhang/VG-Bert, re-stated from Eq. 1 and its reduction): per
    caption, the best location of every token among its first nwords (which include [CLS] and [SEP]), averaged."""
    maps = torch.einsum("ind,jtd->ijnt", image_outputs, language_outputs).amax(dim=2)  # (I, J, T)
    return torch.stack([maps[:, j, :max(1, int(n))].mean(1) for j, n in enumerate(nwords)], dim=1)


def test_mean_over_every_token_equals_the_official_formula():
    torch.manual_seed(0)
    v, w = torch.randn(5, 6, 8), torch.randn(4, 7, 8)
    nwords = torch.tensor([7, 3, 5, 1])  # unpadded tokens, [CLS]/[SEP] counted
    attention = torch.arange(7)[None] < nwords[:, None]
    ours = match_map_scores(v, w, attention, "mean")
    assert torch.allclose(ours, _official_match_scores(v, w, nwords), atol=1e-6)
    # the sum is the same maxima added up: mean x length
    assert torch.allclose(match_map_scores(v, w, attention, "sum"), ours * nwords[None].float(), atol=1e-5)
    # count_special_tokens=True: the word mask is the attention mask (the official nwords)
    net = MatchMapGrounding(**TINY, count_special_tokens=True)
    ids = torch.tensor([[101, 7, 8, 102, 0]])
    assert net.encode_texts(ids, torch.tensor([[1, 1, 1, 1, 0]]))[1].tolist() == [[True, True, True, True, False]]


def test_attention_dropout_follows_dropout_unless_given():
    cfg = MatchMapGrounding(**TINY, dropout=0.3).language.bert.config
    assert cfg.hidden_dropout_prob == cfg.attention_probs_dropout_prob == 0.3  # the official code's one rate
    assert MatchMapGrounding(**TINY, dropout=0.3, attention_dropout=0.0).language.bert.config.attention_probs_dropout_prob == 0.0
    assert DualEncoder(**TINY, dropout=0.2).language.bert.config.attention_probs_dropout_prob == 0.2


def test_stage1_paper_config_follows_the_paper_data_and_the_official_code():
    from grounding.cli import resolved_config
    from grounding.paths import EXPERIMENTS_DIR

    paper = resolved_config(EXPERIMENTS_DIR / "vgbert" / "stage1_paper.yaml")
    net = paper["model"]["init_args"]["net"]["init_args"]
    assert paper["model"]["init_args"]["word_reduction"] == "mean" and net["count_special_tokens"] is True
    assert net["dropout"] == 0.3 and net["attention_dropout"] is None
    assert paper["data"]["init_args"]["layout"] == "official"  # train2017 / val2017 (§3.3)
    karpathy = resolved_config(EXPERIMENTS_DIR / "vgbert" / "stage1_paper_karpathy.yaml")
    assert karpathy["data"]["init_args"]["layout"] == "karpathy"
    tiny = resolved_config(EXPERIMENTS_DIR / "vgbert" / "stage1_tiny.yaml")  # keeps its documented switch
    assert tiny["model"]["init_args"]["word_reduction"] == "sum"


def test_visual_attention_dropout_layout_official_and_recorded():
    # Official SpatialSelfAttention: dropout on the two residual branches only; None keeps nn.TransformerEncoderLayer's
    # layout (also on the attention probabilities and inside the FFN), the suite's recorded runs.
    official = VisualStream(32, "tiny_cnn", None, 4, dropout=0.3, image_size=64, attention_dropout=0.0, ffn_dropout=0.0)
    layer = official.attention
    assert (layer.self_attn.dropout, layer.dropout.p, layer.dropout1.p, layer.dropout2.p) == (0.0, 0.0, 0.3, 0.3)
    recorded = VisualStream(32, "tiny_cnn", None, 4, dropout=0.3, image_size=64).attention
    assert (recorded.self_attn.dropout, recorded.dropout.p, recorded.dropout1.p, recorded.dropout2.p) == (0.3,) * 4
    # with the residual dropout off, the official layout is deterministic in training mode
    quiet = VisualStream(32, "tiny_cnn", None, 4, dropout=0.0, image_size=64, attention_dropout=0.0, ffn_dropout=0.0)
    quiet.train()
    x = torch.randn(2, quiet.in_channels, 2, 2)
    assert torch.equal(quiet(features=x), quiet(features=x))


def test_dual_encoder_with_unlocked_backbone_groups_trains_the_tail_from_cached_trunk_maps():
    """``backbone_unlocked``: the feature cache stores the frozen trunk (another name, so another folder), the stage
    reads the trunk's maps, the tail's weights are among the optimised parameters and get gradients."""
    from grounding.vgbert import DualEncoderBaseline

    torch.manual_seed(0)
    module = DualEncoderBaseline(DualEncoder(**TINY, backbone_unlocked=1))
    trunk = module.frozen_backbone()
    assert trunk.name == "tiny_cnn-unlocked1" and not any(p.requires_grad for p in trunk.parameters())
    tail = list(module.model.visual.backbone_tail.parameters())
    assert {id(p) for p in tail} <= {id(p) for p in module.trainable_parameters()}
    batch = _train_batch()
    pixels = batch["images"]
    batch["images"] = trunk(pixels)  # what the cache feeds
    module.log = lambda *a, **k: None
    module.training_step(batch, 0).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in tail)
    module.eval()
    with torch.no_grad():
        assert torch.allclose(module.model.encode_images(pixels), module.model.encode_images(trunk(pixels)), atol=1e-6)

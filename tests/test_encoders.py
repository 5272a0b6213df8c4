"""Text and visual encoder loaders: shapes, freezing and clear errors for missing weights."""

from __future__ import annotations

import pytest
import torch

from grounding.encoders import MissingWeightsError, load_text_encoder, load_tokenizer, load_visual_backbone


def test_offline_text_encoder_is_minilm_bert():
    model = load_text_encoder("minilm")
    tok = load_tokenizer("minilm")
    assert type(model).__name__ == "BertModel"
    assert (model.config.hidden_size, model.config.num_hidden_layers, tok.vocab_size) == (384, 6, 30522)
    batch = tok(["a red ball", "a small striped box"], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model(**batch).last_hidden_state
    assert out.shape[:2] == batch["input_ids"].shape and out.shape[-1] == 384


def test_tiny_random_text_encoder_shares_the_bert_vocabulary():
    model = load_text_encoder("tiny-random", hidden_dropout_prob=0.3)
    assert model.config.vocab_size == 30522 and model.config.hidden_size == 32
    assert model.config.hidden_dropout_prob == 0.3


def test_missing_hub_model_fails_with_instructions(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(MissingWeightsError, match="save_pretrained|HF_HUB_OFFLINE"):
        load_text_encoder("bert-base-uncased-not-cached-here")


def test_missing_local_directory_fails_clearly(tmp_path):
    with pytest.raises(MissingWeightsError, match=str(tmp_path)):
        load_text_encoder(str(tmp_path))


@pytest.mark.parametrize("name, channels, size", [("tiny_cnn", 64, 14), ("efficientnet_lite0", 1280, 7)])
def test_backbones_give_spatial_maps(name, channels, size):
    backbone = load_visual_backbone(name)
    feats = backbone(torch.randn(2, 3, 224, 224))
    assert feats.shape == (2, channels, size, size) == (2, backbone.out_channels, 224 // backbone.stride, 224 // backbone.stride)


def test_vgg16_architecture_is_conv5_3_at_stride_16():
    backbone = load_visual_backbone("vgg16", weights=None)
    assert backbone(torch.randn(1, 3, 224, 224)).shape == (1, 512, 14, 14)


def test_vgg16_without_weights_file_explains_how_to_provide_it(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    with pytest.raises(MissingWeightsError, match="vgg16-397923af.pth"):
        load_visual_backbone("vgg16")
    with pytest.raises(MissingWeightsError, match="not found"):
        load_visual_backbone("vgg16", weights=str(tmp_path / "nope.pth"))


def test_vgg16_loads_a_local_weights_file(tmp_path):
    from torchvision.models import vgg16

    torch.save(vgg16(weights=None).state_dict(), tmp_path / "w.pth")
    backbone = load_visual_backbone("vgg16", weights=str(tmp_path / "w.pth"))
    assert backbone.out_channels == 512


def test_frozen_backbone_has_no_grad_and_stays_in_eval_mode():
    backbone = load_visual_backbone("tiny_cnn")
    backbone.train()
    assert not backbone.body.training
    assert not any(p.requires_grad for p in backbone.parameters())
    x = torch.randn(1, 3, 64, 64)
    assert not backbone(x).requires_grad
    # BatchNorm running statistics must not move in a frozen backbone.
    before = [b.clone() for b in backbone.buffers()]
    backbone(torch.randn(4, 3, 64, 64) * 5)
    assert all(torch.equal(a, b) for a, b in zip(before, backbone.buffers()))


def test_pretrained_efficientnet_weights_are_loaded_not_random():
    a, b = load_visual_backbone("efficientnet_lite0"), load_visual_backbone("efficientnet_lite0")
    for (_, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(pa, pb)


def test_unknown_backbone_is_rejected():
    with pytest.raises(ValueError, match="Unknown visual backbone"):
        load_visual_backbone("resnet9000")


@pytest.mark.parametrize("name,unlocked", [("tiny_cnn", 1), ("tiny_cnn", 2), ("efficientnet_lite0", 2),
                                           ("efficientnet_lite0", 6)])
def test_split_backbone_is_the_whole_backbone_in_two_parts(name, unlocked):
    """Trunk then tail gives the whole backbone's map (eval; the tail's stochastic depth is a training-time draw); the
    trunk is frozen under its own name (another feature-cache folder), the tail trains, its BatchNorm statistics stay."""
    from grounding.encoders import BackboneTail, split_backbone
    from grounding.utils.io import state_dict_sha1

    torch.manual_seed(0)
    weights = "default" if name == "efficientnet_lite0" else None
    whole = load_visual_backbone(name, weights=weights)
    x = torch.randn(2, 3, 64, 64)
    expected = whole(x)
    trunk, tail = split_backbone(whole, unlocked)
    assert isinstance(tail, BackboneTail) and trunk.name == f"{name}-unlocked{unlocked}"
    maps = trunk(x)
    assert maps.shape[1] == trunk.out_channels and not maps.requires_grad
    assert torch.allclose(tail.eval()(maps), expected, atol=1e-5)
    assert not any(p.requires_grad for p in trunk.parameters()) and all(p.requires_grad for p in tail.parameters())
    assert state_dict_sha1(trunk) != state_dict_sha1(load_visual_backbone(name, weights=weights))
    tail.train()
    before = [b.clone() for b in tail.buffers()]
    tail(maps * 3).sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(before, tail.buffers()))
    assert all(p.grad is not None for p in tail.parameters())


def test_split_backbone_refuses_what_it_cannot_split():
    from grounding.encoders import split_backbone
    from grounding.errors import UserInputError

    whole = load_visual_backbone("tiny_cnn", weights=None)
    assert split_backbone(whole, 0) == (whole, None)
    with pytest.raises(UserInputError, match="backbone_unlocked: 4 is not between 0 and 3"):
        split_backbone(whole, 4)


def test_visual_stream_with_a_strided_tail_reads_pixels_and_trunk_maps_alike():
    """A tail that downsamples (tiny_cnn's last 2 groups, stride 2 each) gives the whole backbone's grid; the stream
    reads pixels or the trunk's maps (what the cache stores) to the same tokens, and the tail gets gradients."""
    from grounding.vgbert.streams import VisualStream

    torch.manual_seed(0)
    stream = VisualStream(width=32, backbone="tiny_cnn", backbone_weights=None, num_heads=2, dropout=0.0,
                          image_size=64, backbone_unlocked=2).eval()
    x = torch.randn(2, 3, 64, 64)
    tokens = stream(images=x)
    assert tokens.shape == (2, 4, 4, 32) and stream.in_channels == 32
    assert torch.allclose(stream(features=stream.backbone_features(x)), tokens)
    tokens.sum().backward()
    assert all(p.grad is not None for p in stream.backbone_tail.parameters())
    assert all(p.grad is None for p in stream.backbone.parameters())

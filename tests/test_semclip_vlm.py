"""SemCLIP VLM adapters: suite checkpoints (dual encoder, search heads) round trip through load_vlm."""

from __future__ import annotations

import pytest
import torch
from semclip_helpers import TINY_VLM, save_module, tiny_baseline_ckpt


def _pixels(vlm, paths):
    from data_modules.common import open_rgb

    return torch.stack([vlm.transform(open_rgb(p)) for p in paths])


def test_dual_encoder_checkpoint_round_trip(tiny_world, tmp_path, monkeypatch):
    from data_modules.common import tokenize
    from grounding.semclip.alignment import VLM
    from grounding.semclip.vlm import SuiteVLM, list_images, load_vlm

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    ckpt = tiny_baseline_ckpt(tmp_path / "run")
    vlm = load_vlm(f"suite:{ckpt}")
    assert isinstance(vlm, SuiteVLM) and isinstance(vlm, VLM) and vlm.kind == "DualEncoderBaseline"
    # transform settings from the run's config.yaml, architecture from the hyperparameters
    assert vlm.mean == (0.5, 0.5, 0.5) and vlm.image_size == 64 and vlm.dim == vlm.net.language_head.out_features

    # the same numbers as the module the checkpoint was written from
    from grounding.vgbert.baseline import DualEncoder, DualEncoderBaseline

    torch.manual_seed(0)
    ref = DualEncoderBaseline(DualEncoder(**TINY_VLM), feature_cache=False).eval()
    texts = ["A photo of a ball", "an orb next to a car"]
    ids, mask = tokenize(vlm.tokenizer, texts, 32)
    with torch.no_grad():
        expected_t = ref.model.encode_texts(ids, mask)
    got_t = vlm.encode_text(texts)
    assert got_t.shape == (2, vlm.dim) and torch.allclose(got_t, expected_t, atol=1e-5)
    assert torch.allclose(got_t.norm(dim=-1), torch.ones(2), atol=1e-5)

    paths = list_images(tiny_world / "images")[:5]
    px = _pixels(vlm, paths)
    with torch.no_grad():
        expected_i = ref.model.encode_images(px)
    assert torch.allclose(vlm.encode_image(px), expected_i, atol=1e-5)
    # paths go through the feature cache (float16 maps): the same vectors up to that precision
    from_paths = vlm.encode_image([str(p) for p in paths])
    assert torch.allclose(from_paths, expected_i, atol=2e-2)
    assert any((tmp_path / "cache" / "features").iterdir())
    assert torch.allclose(vlm.encode_image([str(p) for p in paths]), from_paths)  # reused
    assert vlm.encode_image(tiny_world / "images").shape[0] == len(list_images(tiny_world / "images"))


def test_search_heads_checkpoint_uses_f_v_and_f_l(tiny_world, tmp_path):
    from data_modules.common import tokenize
    from grounding.semclip.vlm import load_vlm
    from grounding.vgbert.search_heads import SearchHeads

    torch.manual_seed(1)
    heads = SearchHeads(stage2=dict(TINY_VLM), feature_cache=False).eval()
    ckpt = save_module(heads, tmp_path / "search" / "checkpoints" / "last.ckpt", "grounding.vgbert.SearchHeads")
    vlm = load_vlm(str(ckpt), feature_cache=False)  # a bare .ckpt path means suite:
    assert vlm.kind == "SearchHeads" and vlm.image_size == 64
    texts = ["a red ball"]
    ids, mask = tokenize(vlm.tokenizer, texts, 32)
    with torch.no_grad():
        assert torch.allclose(vlm.encode_text(texts), heads.search.encode_texts(ids, mask), atol=1e-5)
        px = _pixels(vlm, sorted((tiny_world / "images").iterdir())[:3])
        assert torch.allclose(vlm.encode_image(px), heads.search.encode_images(px), atol=1e-5)


def test_load_vlm_errors(tmp_path):
    from grounding.checkpoints import CheckpointError
    from grounding.semclip.vlm import load_vlm, vlm_fingerprint
    from grounding.vgbert.pretrain import GroundingPretrain, MatchMapGrounding

    with pytest.raises(ValueError, match="Unknown VLM spec"):
        load_vlm("clip:ViT-B/32")
    with pytest.raises(CheckpointError, match="not found"):
        load_vlm(f"suite:{tmp_path / 'missing.ckpt'}")
    with pytest.raises(FileNotFoundError, match="No CLIP weights"):
        load_vlm(f"hf-clip:{tmp_path / 'no-clip'}")
    with pytest.raises(FileNotFoundError, match="huggingface-cli download"):
        vlm_fingerprint(f"hf-clip:{tmp_path / 'no-clip'}")
    with pytest.raises((ImportError, FileNotFoundError), match="open_clip|No open_clip weights"):
        load_vlm(f"open-clip:ViT-B-32:{tmp_path / 'absent.bin'}")
    match_map = GroundingPretrain(MatchMapGrounding(text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None,
                                                    visual_heads=2), feature_cache=False)
    ckpt = save_module(match_map, tmp_path / "m.ckpt", "grounding.vgbert.GroundingPretrain")
    with pytest.raises(CheckpointError, match="DualEncoderBaseline"):
        load_vlm(f"suite:{ckpt}")

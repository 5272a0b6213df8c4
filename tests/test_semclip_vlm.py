"""SemCLIP VLM adapters: suite checkpoints (dual encoder, search heads) round trip through load_vlm."""

from __future__ import annotations

import pytest
import torch
from semclip_helpers import TINY_VLM, save_module, tiny_baseline_ckpt


def _pixels(vlm, paths):
    from data_modules.images import open_rgb

    return torch.stack([vlm.transform(open_rgb(p)) for p in paths])


def test_dual_encoder_checkpoint_round_trip(tiny_world, tmp_path, monkeypatch):
    from data_modules.collate import tokenize
    from grounding.semclip.alignment import VLM
    from grounding.semclip.vlm import SuiteVLM, list_images, load_vlm

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    ckpt = tiny_baseline_ckpt(tmp_path / "run")
    vlm = load_vlm(f"suite:{ckpt}")
    assert isinstance(vlm, SuiteVLM) and isinstance(vlm, VLM) and vlm.kind == "DualEncoderBaseline"
    # transform settings from the run's config.yaml, architecture from the hyperparameters
    assert vlm.mean == (0.5, 0.5, 0.5) and vlm.image_size == 64 and vlm.dim == vlm.net.language_head.out_features

    # the same numbers as the module the checkpoint was written from
    from grounding.vgbert.dual_encoder import DualEncoder, DualEncoderBaseline

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
    from data_modules.collate import tokenize
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


def test_vse_checkpoint_pools_its_regions(tiny_world, tmp_path, monkeypatch):
    """COMPOSER's VSE as a VLM: the same vectors as VSE's own encode_images over its grid regions (pixels, and
    cached maps up to float16) and encode_texts."""
    from data_modules.collate import tokenize
    from grounding.composer.vse_vilbert import VSE, VSETraining
    from grounding.semclip.vlm import load_vlm

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(2)
    module = VSETraining(VSE(text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None, image_size=64,
                             dim=24), feature_cache=False).eval()
    # a run recorded before the DataModules' transform group: its fields flat in config.yaml, read the same
    ckpt = save_module(module, tmp_path / "vse" / "checkpoints" / "last.ckpt", "grounding.composer.vse_vilbert.VSETraining",
                       {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "image_size": 64, "resize_size": 64})
    vlm = load_vlm(f"suite:{ckpt}")
    assert vlm.kind == "VSETraining" and vlm.dim == 24 and vlm.image_size == 64
    texts = ["a red ball", "a car near a tree"]
    ids, mask = tokenize(vlm.tokenizer, texts, 32)
    paths = sorted((tiny_world / "images").iterdir())[:3]
    px = _pixels(vlm, paths)
    with torch.no_grad():
        assert torch.allclose(vlm.encode_text(texts), module.net.encode_texts(ids, mask), atol=1e-5)
        expected = module.net.encode_images(*module.net.embed_regions(px))
    assert torch.allclose(vlm.encode_image(px), expected, atol=1e-5)
    assert torch.allclose(vlm.encode_image([str(p) for p in paths]), expected, atol=2e-2)  # the feature cache


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


def _tiny_hf_clip(folder):
    """A randomly initialised CLIP built from a config (no hub): a character-level BPE vocabulary, 2-layer
    towers, 16-d joint space, 32 px images; saved as a local CLIP folder."""
    import json
    import string

    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

    folder.mkdir(parents=True)
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in string.ascii_lowercase + ".,'0123456789":
        vocab.setdefault(c, len(vocab))
        vocab.setdefault(c + "</w>", len(vocab))
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt")).save_pretrained(folder)
    torch.manual_seed(0)
    towers = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    CLIPModel(CLIPConfig(text_config=dict(vocab_size=len(vocab), max_position_embeddings=77, bos_token_id=0,
                                          eos_token_id=1, pad_token_id=1, **towers),
                         vision_config=dict(image_size=32, patch_size=16, **towers), projection_dim=16)).save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


def test_hf_clip_adapter_encodes_texts_and_images_with_the_installed_transformers(tmp_path):
    """The adapter returns the projected features whatever get_*_features returns (a tensor, or from
    transformers 5 on an output object), equal to the model's own projection heads."""
    from PIL import Image

    from grounding.semclip.vlm import load_vlm

    folder = _tiny_hf_clip(tmp_path / "clip")
    vlm = load_vlm(f"hf-clip:{folder}")
    texts = vlm.encode_text(["a car", "a photo of a tree"])
    assert texts.shape == (2, 16) == (2, vlm.dim) and texts.dtype == torch.float32
    tok = vlm.tokenizer(["a car", "a photo of a tree"], padding=True, return_tensors="pt")
    with torch.no_grad():
        pooled = vlm.model.text_model(**tok).pooler_output
        assert torch.allclose(texts, vlm.model.text_projection(pooled), atol=1e-5)
    photo = tmp_path / "photo.png"
    Image.new("RGB", (48, 40), (200, 30, 30)).save(photo)
    images = vlm.encode_image([photo, Image.new("RGB", (32, 32), (0, 90, 200))])
    assert images.shape == (2, 16)
    pixels = vlm._processor(images=[Image.open(photo).convert("RGB")], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        direct = vlm.model.visual_projection(vlm.model.vision_model(pixel_values=pixels).pooler_output)
    assert torch.allclose(images[:1], direct, atol=1e-5)


def test_open_clip_adapter_on_a_tiny_model_built_from_a_config(tmp_path):
    """open-clip:<architecture>:<weights> with a 2-layer model registered from a config and its random weights
    saved locally: the adapter's features equal the model's own encode_text / encode_image."""
    import json

    open_clip = pytest.importorskip("open_clip")
    from PIL import Image

    from grounding.semclip.vlm import load_vlm

    config = {"embed_dim": 16, "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 16,
                                              "head_width": 16},
              "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2}}
    (tmp_path / "TinyCLIP-suite-test.json").write_text(json.dumps(config))
    open_clip.add_model_config(str(tmp_path / "TinyCLIP-suite-test.json"))
    torch.manual_seed(0)
    model = open_clip.create_model("TinyCLIP-suite-test", pretrained=None).eval()
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    vlm = load_vlm(f"open-clip:TinyCLIP-suite-test:{tmp_path / 'weights.pt'}")
    assert vlm.dim == 16
    tokenizer = open_clip.get_tokenizer("TinyCLIP-suite-test")
    with torch.no_grad():
        assert torch.allclose(vlm.encode_text(["a car", "a tree"]), model.encode_text(tokenizer(["a car", "a tree"])),
                              atol=1e-5)
        photo = Image.new("RGB", (40, 36), (20, 160, 60))
        assert torch.allclose(vlm.encode_image([photo]), model.encode_image(vlm.transform(photo)[None]), atol=1e-5)

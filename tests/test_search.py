"""VG-BERT multimodal search (§4.5, App. B.5): heads, alpha blending, training wiring and the CLI."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from grounding.nets import constructor_args
from grounding.vgbert.search_heads import SearchHead, multimodal_query, rank_images

TINY_STAGE2 = dict(text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None, visual_heads=2,
                   image_size=64)


def test_search_head_is_mlp_mean_pooled_and_normalised():
    torch.manual_seed(0)
    head = SearchHead(8)
    x = torch.randn(3, 5, 8)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    out = head(x, mask)
    lin1, lin2 = head.mlp[0], head.mlp[2]
    for n in range(3):  # Eq. 16 by hand: mean over the K words of (ReLU(x W1 + b1) W2 + b2), then Eq. 17
        y = lin2(torch.relu(lin1(x[n][mask[n]]))).mean(0)
        assert torch.allclose(out[n], y / y.norm(), atol=1e-6)
    assert torch.allclose(out.norm(dim=-1), torch.ones(3), atol=1e-6)
    assert torch.allclose(head(x), F.normalize(lin2(torch.relu(lin1(x))).mean(1), dim=-1), atol=1e-6)  # Eq. 15


def test_search_head_dropout_official_layout():
    head = SearchHead(8, dropout=0.5)  # the official heads: Linear - ReLU - Dropout() - Linear
    assert [type(m).__name__ for m in head.mlp] == ["Linear", "ReLU", "Dropout", "Linear"] and head.mlp[2].p == 0.5
    assert [type(m).__name__ for m in SearchHead(8).mlp] == ["Linear", "ReLU", "Linear"]  # earlier checkpoints' keys
    x = torch.randn(2, 3, 8)
    assert torch.equal(head.eval()(x), F.normalize(head.mlp[3](torch.relu(head.mlp[0](x))).mean(1), dim=-1))


def test_search_paper_config_uses_the_official_transfer_settings():
    from grounding.cli import resolved_config
    from grounding.paths import EXPERIMENTS_DIR

    paper = resolved_config(EXPERIMENTS_DIR / "vgbert" / "search_paper.yaml")
    model = paper["model"]["init_args"]
    assert model["head_dropout"] == 0.5 and model["optimizer"]["init_args"]["lr"] == 5.0e-5
    assert paper["data"]["init_args"]["batch_size"] == 300 and paper["trainer"]["max_epochs"] == 150
    sched = model["lr_scheduler"]["init_args"]
    assert (sched["step_size"], sched["gamma"]) == (30, 0.5)
    assert model["init_from"].endswith("stage2_paper/checkpoints/best.ckpt")


def test_alpha_blending():
    q_i, q_w = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    assert torch.equal(multimodal_query(q_i, q_w, 0.0), q_i)
    assert torch.equal(multimodal_query(q_i, q_w, 1.0), q_w)
    assert torch.allclose(multimodal_query(q_i, q_w, 0.25), torch.tensor([0.75, 0.25]))
    assert torch.equal(multimodal_query(None, q_w, 0.3), q_w) and torch.equal(multimodal_query(q_i, None, 0.3), q_i)
    with pytest.raises(ValueError):
        multimodal_query(q_i, q_w, 1.5)
    with pytest.raises(ValueError):
        multimodal_query(None, None, 0.5)
    # Ranking by cosine moves from the image's neighbour to the word's as alpha grows.
    index = F.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), dim=-1)
    firsts = [int(rank_images(index, multimodal_query(q_i, q_w, a), 1)[1][0]) for a in (0.0, 0.5, 1.0)]
    assert firsts == [0, 2, 1]
    scores, ids = rank_images(index, q_i, 3, exclude=torch.tensor([0]))
    assert ids[0] != 0 and scores[-1] == float("-inf")


def _trainer(tmp_path, **kw):
    import lightning as L

    args = dict(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                accelerator="cpu", default_root_dir=str(tmp_path), limit_train_batches=2, limit_val_batches=1)
    args.update(kw)
    return L.Trainer(**args)


OFFICIAL_STAGE2 = dict(shared_object_transform=True, relation_dropout=0.1, classifier_hidden=16, classifier_dropout=0.1,
                       cross_attention_dropout=0.0, query_key_bias=False, count_special_tokens=True,
                       query_pooling="mean", visual_attention_dropout=0.0, visual_ffn_dropout=0.0)


@pytest.mark.parametrize("location", [dict(), dict(key_position="keys_values", spatial_centroid=True), OFFICIAL_STAGE2],
                         ids=["paper", "location-switches", "official-switches"])
def test_search_heads_from_stage2_checkpoint(tmp_path, location):
    from grounding.checkpoints import CheckpointError
    from grounding.vgbert.finetune import RelationalFinetune
    from grounding.vgbert.relational import VGBertRelational, sinusoidal_grid_encoding
    from grounding.vgbert.search_heads import SearchHeads

    torch.manual_seed(0)
    stage2 = RelationalFinetune(VGBertRelational(2, 3, **constructor_args(VGBertRelational, {**TINY_STAGE2, **location})), ["on", "near"],
                                ["ball", "box", "car"], feature_cache=False)
    path = tmp_path / "stage2.ckpt"
    torch.save({"state_dict": stage2.state_dict(), "hyper_parameters": dict(stage2.hparams)}, path)
    heads = SearchHeads(init_from=str(path), feature_cache=False)
    assert heads.hparams.stage2["relation_labels"] == ["on", "near"]
    heads.load_stage2(path)
    mine, theirs = heads.search.grounding.state_dict(), stage2.model.state_dict()
    assert set(mine) == set(theirs) and all(torch.equal(mine[k], theirs[k]) for k in theirs)
    # Key_V of the search index is the stage-2 model's own key path (with its location code when on).
    attention = stage2.model.relational.attention
    assert heads.search.grounding.relational.attention.key_position == attention.key_position
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        visual = stage2.model.eval().encode_images(images)
        b, h, w, d = visual.shape
        flat = visual.reshape(b, h * w, d)
        if location.get("key_position"):
            flat = flat + sinusoidal_grid_encoding(h, w, d)
        torch.testing.assert_close(heads.search.eval().image_keys(images), attention.key(flat))
    # Everything but F_V / F_L is frozen.
    trainable = {n.split(".")[1] for n, p in heads.named_parameters() if p.requires_grad}
    assert trainable == {"image_head", "text_head"}
    with pytest.raises(CheckpointError, match="contradicts"):
        SearchHeads(init_from=str(path), stage2={"text_encoder": "minilm"})
    with pytest.raises(CheckpointError, match="not found"):
        SearchHeads(init_from=str(tmp_path / "missing.ckpt"))


def test_search_heads_train_and_cli(tiny_world, tmp_path, monkeypatch, capsys):
    from data_modules import CocoCaptionsDataModule
    from grounding.vgbert import search as search_cli
    from grounding.vgbert.search_heads import SearchHeads

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(0)
    dm = CocoCaptionsDataModule(root=str(tiny_world / "coco"), text_encoder="tiny-random",
                                transform={"image_size": 64, "resize_size": 64}, batch_size=8)
    model = SearchHeads(stage2=dict(TINY_STAGE2), feature_cache=False)
    frozen_before = {k: v.clone() for k, v in model.search.grounding.state_dict().items()}
    trainer = _trainer(tmp_path)
    trainer.fit(model, dm)
    assert "val/rsum" in trainer.callback_metrics
    after = model.search.grounding.state_dict()
    assert all(torch.equal(frozen_before[k], after[k]) for k in after)  # the stage-2 model did not move
    ckpt = tmp_path / "search.ckpt"
    trainer.save_checkpoint(ckpt)

    images = tiny_world / "images"
    query = sorted(images.glob("*.jpg"))[0]
    grid = tmp_path / "grid.png"
    index_file = tmp_path / "index.pt"
    result = search_cli.main(["--ckpt", str(ckpt), "--images", str(images), "--query-image", str(query),
                              "--query-text", "a red ball", "--alpha", "0.5", "--top-k", "4", "--grid", str(grid),
                              "--alphas", "0,0.5,1", "--index", str(index_file), "--device", "cpu"])
    assert grid.is_file() and grid.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(result["results"]) == 4 and str(query.resolve()) not in [p for p, _ in result["results"]]
    assert set(result["grid"]) == {0.0, 0.5, 1.0}
    assert "Indexed 48 images" in capsys.readouterr().out
    # The index is reused while checkpoint and images are unchanged, and matches a fresh encoding.
    searcher = search_cli.Searcher(ckpt)
    paths, feats = searcher.index(images, index_file)
    assert "Reusing index" in capsys.readouterr().out
    assert torch.allclose(feats[:3], searcher.encode_images(paths[:3]), atol=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporaries left
    with pytest.raises(SystemExit) as exit_info:
        search_cli.main(["--ckpt", str(ckpt), "--images", str(tmp_path / "nope"), "--query-text", "x"])
    assert exit_info.value.code == 2 and "not a folder" in capsys.readouterr().err

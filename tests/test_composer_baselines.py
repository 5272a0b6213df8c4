"""COMPOSER's VSE baseline (§5.2): the VSE++ hinge loss by hand, the network's pooling, a training step and the
evaluation against grounding.retrieval_metrics on hand-made Concept & Relation Graphs."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from test_composer_model import tiny_graph, tiny_net

from grounding.composer.batch import composition_batch, same_height_partners
from grounding.composer.data import SplitGraph
from grounding.composer.evaluation import phrase_hits
from grounding.composer.model import AttentionBlock, CoAttentionBlock, Composer, ComposerSizes, region_features
from grounding.composer.vse_vilbert import VSE, ViLBERT, ViLBERTLosses, ViLBERTSizes, ViLBERTTraining, VSETraining
from grounding.contrastive import vse_hinge_loss
from grounding.encoders import load_text_encoder, load_tokenizer
from grounding.retrieval_metrics import retrieval_metrics

# rows: images, columns: captions; the diagonal holds the positives
S = torch.tensor([[0.9, 0.5, 0.1],
                  [0.3, 0.6, 0.65],
                  [0.85, 0.3, 0.4]])


def tiny_vse(**kw):
    torch.manual_seed(0)
    args = dict(text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None, image_layers=2, dropout=0.0)
    return VSE(**{**args, **kw}).eval()


def test_vse_hinge_loss_hand_computed():
    # α = 0.2. Caption negatives of image i: [α − S_ii + S_ic]₊ -> row 0: 0, 0; row 1: 0, .25; row 2: .65, .1.
    # Image negatives of caption i: [α − S_ii + S_ji]₊ -> column 0: 0, .15; column 1: .1, 0; column 2: 0, .45.
    hardest = vse_hinge_loss(S, 0.2)  # max per row / column: (0 + .25 + .65) + (.15 + .1 + .45)
    summed = vse_hinge_loss(S, 0.2, hardest=False)  # (.25 + .65 + .1) + (.15 + .1 + .45)
    assert hardest.item() == pytest.approx(1.6)
    assert summed.item() == pytest.approx(1.7)
    assert vse_hinge_loss(torch.eye(3), 0.2).item() == 0.0  # every positive beats every negative by 1 > α
    with pytest.raises(ValueError, match="square"):
        vse_hinge_loss(S[:2], 0.2)


def test_vse_shapes_and_masked_means_ignore_padding():
    net = tiny_vse()
    tok = load_tokenizer("tiny-random")
    enc = tok(["a dog", "two red cats on grass"], padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"].bool()
    text = net.encode_texts(ids, mask)
    assert text.shape == (2, net.dim) and torch.allclose(text.norm(dim=-1), torch.ones(2))
    # more padding (with arbitrary ids) changes nothing
    padded_ids = torch.cat([ids, torch.full((2, 3), 7)], 1)
    padded_mask = torch.cat([mask, torch.zeros(2, 3, dtype=torch.bool)], 1)
    assert torch.allclose(net.encode_texts(padded_ids, padded_mask), text, atol=1e-6)
    regions, region_mask = net.embed_regions(torch.randn(3, 3, 32, 32))
    assert regions.shape[0] == 3 and regions.shape[2] == net.dim and region_mask.all()
    images = net.encode_images(regions, region_mask)
    garbage = torch.cat([regions, 100 * torch.randn(3, 2, net.dim)], 1)
    garbage_mask = torch.cat([region_mask, torch.zeros(3, 2, dtype=torch.bool)], 1)
    assert torch.allclose(net.encode_images(garbage, garbage_mask), images, atol=1e-6)
    assert torch.allclose(net(regions, region_mask, ids, mask), images @ text.T)
    assert net(regions, region_mask, ids, mask).shape == (3, 2)


def test_vse_files_regions_and_bad_source():
    net = tiny_vse(region_source="files", region_dim=6)
    assert net.backbone is None
    features, boxes = torch.randn(2, 4, 6), torch.rand(2, 4, 4)
    regions, mask = net.embed_regions(None, features, boxes, torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool))
    assert regions.shape == (2, 4, net.dim) and mask.sum().item() == 6
    with pytest.raises(ValueError, match="region_dim"):
        tiny_vse(region_source="files")
    with pytest.raises(ValueError, match="region_source"):
        tiny_vse(region_source="pixels")


def test_batch_carries_whole_captions_and_phrase_texts():
    graph, tables, texts = tiny_graph(failed=True)
    b = composition_batch(graph, tables, [3, 1], phrase_seed=0)
    tok = load_tokenizer("tiny-random")
    for row, cap in enumerate([3, 1]):
        assert b["caption_ids"][row][b["caption_mask"][row]].tolist() == tok(texts[cap])["input_ids"]
    concepts = b["node_concept"][b["phrase_node"]]
    for row, c in enumerate(concepts.tolist()):
        assert b["phrase_ids"][row][b["phrase_mask"][row]].tolist() == tok(graph.concept_text[c])["input_ids"]


def _train_batch(graph, tables, captions):
    torch.manual_seed(1)
    b = composition_batch(graph, tables, captions)
    b["images"], b["image_index"] = torch.randn(len(captions), 3, 32, 32), torch.arange(len(captions))
    return b


def test_training_step_backpropagates_into_both_towers():
    graph, tables, _ = tiny_graph()
    module = VSETraining(tiny_vse().train(), margin=1.0)  # α = 1: every negative violates at initialisation
    losses = module.compute_losses(_train_batch(graph, tables, [0, 1, 2]))
    assert losses["loss"] > 0
    losses["loss"].backward()
    net = module.net
    for part in (net.text_encoder, net.region_proj, net.image_mlp):
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in part.parameters())
    assert all(p.grad is None for p in net.backbone.parameters())  # the frozen backbone


def _run_test_loop(module, monkeypatch):
    """The module's test loop over 3 random images and the tiny graph's 3 captions; returns what it logged."""
    graph, tables, _ = tiny_graph()
    split = SplitGraph(graph, tables, np.zeros(graph.n_captions, dtype=bool))
    logged = {}
    monkeypatch.setattr(module, "log", lambda key, value, **kw: logged.__setitem__(key, value))
    images = {"images": torch.randn(3, 3, 32, 32), "image_index": torch.arange(3)}
    captions = split.batch([0, 1, 2], phrase_seed=0)
    with torch.no_grad():
        module.test_step(images, 0, dataloader_idx=0)
        module.test_step(captions, 0, dataloader_idx=1)
        module.on_test_epoch_end()
    return logged, images, captions


def test_evaluation_equals_retrieval_metrics(monkeypatch):
    module = VSETraining(tiny_vse())
    logged, images, captions = _run_test_loop(module, monkeypatch)
    with torch.no_grad():
        regions, mask = module.net.embed_regions(images["images"])
        sim = module.net(regions, mask, captions["caption_ids"], captions["caption_mask"])
        phrases = module.net.encode_images(regions, mask) @ module.net.encode_texts(captions["phrase_ids"],
                                                                                   captions["phrase_mask"]).T
    expected = retrieval_metrics(sim, captions["caption_image_index"])
    for key, value in expected.items():
        assert logged[f"test/{key}"] == pytest.approx(value)
    hits = phrase_hits(phrases.argmax(0), captions["phrase_denotation_ptr"], captions["phrase_denotation"])
    assert logged["test/phrase_r1"] == pytest.approx(100.0 * hits.float().mean().item())


def test_sum_negatives_warm_up_before_the_hardest():
    graph, tables, _ = tiny_graph()
    batch = _train_batch(graph, tables, [0, 1, 2])
    net = tiny_vse()
    with torch.no_grad():
        regions, mask = net.embed_regions(batch["images"])
        sim = net(regions, mask, batch["caption_ids"], batch["caption_mask"])
        warm = VSETraining(net, margin=1.0, sum_negatives_epochs=1).compute_losses(batch)["loss"]  # epoch 0 < 1
        hard = VSETraining(net, margin=1.0).compute_losses(batch)["loss"]
    assert warm.item() == pytest.approx(vse_hinge_loss(sim, 1.0, hardest=False).item(), rel=1e-5)
    assert hard.item() == pytest.approx(vse_hinge_loss(sim, 1.0).item(), rel=1e-5)


# ------------------------------------------------------------------------------------------ ViLBERT-style
TINY_VILBERT_SIZES = dict(text_layers=3, image_layers=2, coattention_layers=2, image_dim=16, image_heads=2,
                          image_ffn_dim=32, co_dim=16, co_heads=2, dropout=0.0)


def tiny_vilbert(**kw):
    """A tiny ViLBERT; ``kw``: its other arguments, or fields of its ``sizes`` (:class:`ViLBERTSizes`)."""
    torch.manual_seed(0)
    fields = {f.name for f in dataclasses.fields(ViLBERTSizes)}
    sizes = ViLBERTSizes(**{**TINY_VILBERT_SIZES, **{k: v for k, v in kw.items() if k in fields}})
    args = {k: v for k, v in kw.items() if k not in fields}
    return ViLBERT(text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None, sizes=sizes, **args).eval()


def test_bert_layer_as_attention_block_is_the_same_function():
    bert = load_text_encoder("tiny-random").eval()
    enc = load_tokenizer("tiny-random")(["a dog running", "two red cats on the grass"], padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    full = bert(input_ids=ids, attention_mask=mask).last_hidden_state
    h = bert.embeddings(input_ids=ids)
    for layer in bert.encoder.layer:
        h = AttentionBlock.from_bert_layer(layer, bert.config).eval()(h, None, mask.bool())
    assert torch.allclose(h[mask.bool()], full[mask.bool()], atol=1e-5)


def test_vilbert_text_stream_keeps_the_pretrained_layers_and_the_schedule():
    net = tiny_vilbert()
    assert len(net.text_encoder.encoder.layer) == 1 and len(net.text_layers) == 2  # 3 layers: 1 below, 2 co-attended
    assert len(net.co_attention) == 2 and len(net.image_layers) == 2
    # COMPOSER's co-attention block, not a second implementation
    assert all(isinstance(c, CoAttentionBlock) for c in net.co_attention)
    # without co-attention the text stream would be the 3-layer encoder: check the pieces compose to it
    torch.manual_seed(0)
    reference = load_text_encoder("tiny-random", num_hidden_layers=3).eval()
    ids = torch.tensor([[2, 40, 41, 3]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    h = net.encode_texts(ids, mask)
    for layer in net.text_layers:
        h = layer(h, None, mask)
    assert torch.allclose(h, reference(input_ids=ids).last_hidden_state, atol=1e-5)
    with pytest.raises(ValueError, match="coattention_layers"):
        tiny_vilbert(coattention_layers=4)
    with pytest.raises(ValueError, match="image_layers"):
        tiny_vilbert(image_layers=0)


def test_vilbert_runs_its_layers_in_vilberts_order():
    """ViLBERT's encoder loop (t_biattention_id = the top K text layers, v_biattention_id = image layers 0..K-1):
    before co-attention block i, the image layers [v_prev, i) and text layers [t_prev, T-K+i); after the last
    block, the remaining layers of both streams. The segments between blocks must hold the same layers."""
    t, k, v = 4, 2, 3
    net = tiny_vilbert(text_layers=t, coattention_layers=k, image_layers=v)
    calls = []
    hooks = [m.register_forward_hook(lambda *_, key=key: calls.append(key)) for key, m in
             [(("text", i), layer) for i, layer in enumerate(net.text_encoder.encoder.layer)]
             + [(("text", t - k + i), layer) for i, layer in enumerate(net.text_layers)]
             + [(("image", i), layer) for i, layer in enumerate(net.image_layers)]
             + [(("co", i), block) for i, block in enumerate(net.co_attention)]]
    regions, region_mask = net.embed_regions(torch.randn(1, 3, 32, 32))
    net(regions, region_mask, torch.tensor([[2, 40, 41, 3]]), torch.ones(1, 4, dtype=torch.bool), torch.tensor([0]),
        torch.tensor([0]))
    for h in hooks:
        h.remove()
    expected, t_start, v_start = [], 0, 0
    for i, (v_end, t_end) in enumerate(zip(range(k), range(t - k, t))):  # ViLBERT's BertEncoder.forward
        expected += [("image", j) for j in range(v_start, v_end)] + [("text", j) for j in range(t_start, t_end)]
        expected.append(("co", i))
        v_start, t_start = v_end, t_end
    expected += [("image", j) for j in range(v_start, v)] + [("text", j) for j in range(t_start, t)]

    def segments(seq):  # the layers between co-attention blocks (the two streams' order within one is free)
        out, cur = [], set()
        for key in seq:
            if key[0] == "co":
                out += [cur, key]
                cur = set()
            else:
                cur.add(key)
        return out + [cur]

    assert segments(calls) == segments(expected)


def test_composer_loads_checkpoints_from_before_the_coattention_block():
    net = tiny_net()
    old = {}
    for key, value in net.state_dict().items():  # the names the Composition Transformer used to write
        if key.startswith("composition.co_attention."):
            index, direction, rest = key[len("composition.co_attention."):].split(".", 2)
            key = f"composition.{direction}.{index}.{rest}"
        old[key] = value.clone()
    assert any(k.startswith("composition.text_from_image.") for k in old)
    fresh = tiny_net()
    torch.nn.init.normal_(fresh.composition.co_attention[0].text_from_image.query.weight)
    fresh.load_state_dict(old, strict=True)
    for (k, a), (_, b) in zip(net.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), k


def test_text_encoders_train_with_dropout():
    """from_pretrained returns eval mode and Lightning keeps it: every text encoder is switched to train mode."""
    composer = Composer(text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None,
                        sizes=ComposerSizes(pt_layers=2, heads=2, co_dim=16, co_heads=2, ct_layers=1))
    for net in (composer, VSE(text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None),
                ViLBERT(text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None,
                        sizes=ViLBERTSizes(text_layers=2, image_layers=1, coattention_layers=1, image_dim=16,
                                           image_heads=2, co_dim=16, co_heads=2))):
        encoder = getattr(net, "predicate_transformer", None) or net.text_encoder
        assert all(m.training for m in encoder.modules())


def test_vilbert_scores_pairs_and_v_cls():
    net = tiny_vilbert()
    tok = load_tokenizer("tiny-random")
    enc = tok(["a dog", "two red cats on grass"], padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"].bool()
    regions, region_mask = net.embed_regions(torch.randn(3, 3, 32, 32))
    assert regions.shape[:2] == region_mask.shape and region_mask.all()
    n = regions.shape[1] - 1  # [V-CLS] first: the mean region feature at the whole-image box
    features, _, _ = region_features("grid", net.backbone, torch.float32, torch.zeros(1, 3, 32, 32))
    assert features.shape[1] == n
    s = net(regions, region_mask, ids, mask, torch.tensor([0, 1, 2, 0]), torch.tensor([0, 0, 1, 1]))
    assert s.shape == (4,)
    # a pair's score depends on its own image and text only: scoring it alone gives the same number
    alone = net(regions[1:2], region_mask[1:2], ids[0:1], mask[0:1], torch.tensor([0]), torch.tensor([0]))
    assert torch.allclose(alone, s[1:2], atol=1e-5)
    # padding regions (masked) change nothing
    padded = torch.cat([regions, 50 * torch.randn(3, 2, regions.shape[2])], 1)
    padded_mask = torch.cat([region_mask, torch.zeros(3, 2, dtype=torch.bool)], 1)
    assert torch.allclose(net(padded, padded_mask, ids, mask, torch.tensor([0, 1, 2, 0]), torch.tensor([0, 0, 1, 1])),
                          s, atol=1e-5)


def test_vilbert_packed_text_encoder_gives_the_same_scores_and_gradients():
    tok = load_tokenizer("tiny-random")
    enc = tok(["a dog", "two red cats on the green grass"], padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"].bool()
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    out = {}
    for packed in (False, True):
        net = tiny_vilbert(packed_tokens=packed, text_pooling="mean")  # eval: no dropout
        regions, region_mask = net.embed_regions(images)
        s = net(regions, region_mask, ids, mask, torch.tensor([0, 1, 2, 0]), torch.tensor([0, 0, 1, 1]))
        s.sum().backward()
        out[packed] = s.detach(), {n: p.grad for n, p in net.named_parameters() if p.grad is not None}
    torch.testing.assert_close(out[True][0], out[False][0], atol=1e-5, rtol=1e-5)
    assert out[True][1].keys() == out[False][1].keys()
    for name, grad in out[False][1].items():
        torch.testing.assert_close(out[True][1][name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_vilbert_length_groups_give_the_same_scores_and_gradients():
    """ViLBERT.cross in length groups, each cut past its longest text, scores 40 pairs as one padded group does,
    with the same gradients, whichever side the padding is on; a wrong grouping (rows mixed up) would not."""
    tok = copy.deepcopy(load_tokenizer("tiny-random"))  # a copy: the cached tokenizer is shared by every later test
    words = "a small brown dog runs across the wide green field after two red balls".split()
    texts = [" ".join(words[:1 + i % len(words)]) for i in range(10)]
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    pair_image, pair_text = torch.arange(40) % 4, torch.arange(40) // 4
    for side in ("right", "left"):
        tok.padding_side = side
        enc = tok(texts, padding=True, return_tensors="pt")
        ids, mask = enc["input_ids"], enc["attention_mask"].bool()
        out = {}
        for groups in (1, 2):  # 40 pairs: 2 groups of 20 (a group holds at least 16)
            net = tiny_vilbert(length_groups=groups, text_pooling="mean")
            regions, region_mask = net.embed_regions(images)
            text = net.encode_texts(ids, mask)
            s = net.cross(text[pair_text], mask[pair_text], regions[pair_image], region_mask[pair_image])
            (s * torch.linspace(1, 2, 40)).sum().backward()
            out[groups] = s.detach(), {n: p.grad for n, p in net.named_parameters() if p.grad is not None}
        torch.testing.assert_close(out[2][0], out[1][0], atol=1e-5, rtol=1e-5)
        assert out[2][0].std() > 1e-3  # the pairs' scores differ: a permuted grouping would show
        for name, grad in out[1][1].items():
            torch.testing.assert_close(out[2][1][name], grad, atol=1e-5, rtol=1e-4, msg=name)
    with pytest.raises(ValueError, match="length_groups"):
        tiny_vilbert(length_groups=0)


def test_vilbert_four_way_loss_and_mvsa_backpropagate():
    graph, tables, _ = tiny_graph()
    batch = _train_batch(graph, tables, [0, 1, 2])
    plain = ViLBERTTraining(tiny_vilbert().train())
    torch.manual_seed(0)
    losses = plain.compute_losses(batch)
    assert set(losses) >= {"match", "loss", "accuracy"} and "mvsa" not in losses
    assert losses["loss"].item() == pytest.approx(losses["match"].item())
    # α = 5: every concept violates
    module = ViLBERTTraining(tiny_vilbert().train(), losses=ViLBERTLosses(mvsa_loss="hinge", mvsa_margin=5.0))
    torch.manual_seed(0)
    losses = module.compute_losses(batch)
    assert losses["mvsa"] > 0 and losses["loss"].item() == pytest.approx(losses["match"].item() + losses["mvsa"].item())
    losses["loss"].backward()
    net = module.net
    for part in (net.text_encoder, net.text_layers, net.image_layers, net.co_attention, net.regions, net.theta):
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in part.parameters())
    assert all(p.grad is None for p in net.backbone.parameters())


def test_vilbert_mvsa_scores_each_concept_text_hand_checked(monkeypatch):
    """ℓ_MVSA = mean over positives of Σ_c [α − s(x,c) + s(x,c⁻)]₊ + [α − s(x,c) + s(x⁻,c)]₊ over the non-root concepts,
    each s computed by the cross-encoder on the concept's own word pieces."""
    graph, tables, _ = tiny_graph()
    batch = _train_batch(graph, tables, [0, 1, 2])
    module = ViLBERTTraining(tiny_vilbert(), losses=ViLBERTLosses(mvsa_loss="hinge", mvsa_margin=0.8))
    regions, region_mask = module.regions(batch)
    random_caption, random_image = np.array([1, 2, 0]), np.array([2, 0, 1])
    got = module.concept_alignment_loss(batch, regions, region_mask, random_caption, random_image)
    ptr, net = batch["caption_node_ptr"], module.net
    partner = same_height_partners(ptr.numpy(), batch["node_height"].numpy(), random_caption)

    def s(image, node):  # the cross-encoder on one concept text
        row = int(batch["node_concept_row"][node])
        ids, mask = batch["concept_ids"][row:row + 1], batch["concept_mask"][row:row + 1]
        return net(regions[image:image + 1], region_mask[image:image + 1], ids, mask, torch.tensor([0]), torch.tensor([0]))[0]

    total = 0.0
    for i in range(3):
        for k in range(int(ptr[i + 1] - ptr[i])):
            node = int(ptr[i]) + k
            if k == int(batch["caption_root"][i]):
                continue
            neg = int(ptr[random_caption[i]]) + int(partner[node])
            total += (torch.relu(0.8 - s(i, node) + s(i, neg)) + torch.relu(0.8 - s(i, node) + s(int(random_image[i]), node))).item()
    assert got.item() == pytest.approx(total / 3, rel=1e-4)


def test_vilbert_evaluation_equals_retrieval_metrics(monkeypatch):
    module = ViLBERTTraining(tiny_vilbert(), eval_pair_chunk=4)  # chunks that split an image's captions
    logged, images, captions = _run_test_loop(module, monkeypatch)
    with torch.no_grad():
        regions, mask = module.net.embed_regions(images["images"])
        pi, pc = torch.arange(3).repeat_interleave(3), torch.arange(3).repeat(3)
        sim = module.net(regions, mask, captions["caption_ids"], captions["caption_mask"], pi, pc).view(3, 3)
    expected = retrieval_metrics(sim, captions["caption_image_index"])
    for key, value in expected.items():
        assert logged[f"test/{key}"] == pytest.approx(value)
    assert torch.allclose(module.scored["test"].scores, sim, atol=1e-6)
    assert "test/phrase_r1" in logged


def test_vilbert_reranks_a_first_stage_top_k(monkeypatch):
    """With a first stage (another model's test scores) and rerank_top_k 2 of 3 images, only 2 x 3 pairs are
    cross-encoded; with the cross-encoder's own scores as that first stage the text->image ranking is the
    exhaustive one, and the first stage's R@2 (the rerank's ceiling) is logged."""
    exhaustive = ViLBERTTraining(tiny_vilbert())
    logged_all, images, captions = _run_test_loop(exhaustive, monkeypatch)
    sim = exhaustive.scored["test"].scores
    module = ViLBERTTraining(tiny_vilbert(), rerank_top_k=2, first_stage_scores="given")
    monkeypatch.setattr(module, "external_first_stage", lambda image_index: sim[image_index])
    pairs = []
    cross = module.net.cross
    monkeypatch.setattr(module.net, "cross", lambda t, *a: pairs.append(len(t)) or cross(t, *a))
    logged, _, _ = _run_test_loop(module, monkeypatch)
    assert sum(pairs) == 2 * 3
    for key in ("t2i_r1", "t2i_r5", "t2i_medr"):
        assert logged[f"test/{key}"] == pytest.approx(logged_all[f"test/{key}"])
    assert logged["test/first_stage/t2i_r2"] == pytest.approx(retrieval_metrics(sim, captions["caption_image_index"],
                                                                                ks=(2,))["t2i_r2"])
    assert "test/phrase_r1" not in logged  # phrase queries are not reranked

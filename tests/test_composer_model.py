"""COMPOSER's network, batching, losses and evaluation on hand-made Concept & Relation Graphs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from grounding.composer import ConceptGraph, extract_crg
from grounding.composer.batch import PLACEHOLDER_TYPES, TokenTables, composition_batch, pair_schedule, same_height_partners
from grounding.composer.data import held_out_pair_mask
from grounding.composer.evaluation import composer_metrics, phrase_hits, score_captions
from grounding.composer.model import Composer, Modulator, compose_node_by_node, grid_regions
from grounding.composer.objectives import match_nll, mvsa_loss, order_loss
from grounding.composer.training import ComposerTraining
from grounding.encoders import load_tokenizer
from grounding.nets import constructor_args

TREES = [
    # "a dog running on the grass": NP( NP(a dog) VP(running PP(on NP(the grass))) )
    "(NP (NP (DT a) (NN dog)) (VP (VBG running) (PP (IN on) (NP (DT the) (NN grass)))))",
    # "two cats": one application over one primitive
    "(NP (CD two) (NNS cats))",
    # "a red ball next to a box": NP( NP(a red ball) ADVP(next PP(to NP(a box))) )
    "(NP (NP (DT a) (JJ red) (NN ball)) (ADVP (RB next) (PP (TO to) (NP (DT a) (NN box)))))",
]


def tiny_graph(failed: bool = False):
    crgs = [extract_crg(t) for t in TREES] + ([None] if failed else [])
    texts = ["a dog running on the grass", "two cats", "a red ball next to a box"] + (["blah"] if failed else [])
    graph = ConceptGraph.build(crgs, list(range(len(crgs))), [f"{i}.jpg" for i in range(len(crgs))])
    return graph, TokenTables(graph, load_tokenizer("tiny-random"), texts), texts


def tiny_net(**kw):
    torch.manual_seed(0)
    args = dict(text_encoder="tiny-random", pt_layers=2, backbone="tiny_cnn", backbone_weights=None, heads=2, co_dim=16,
                co_heads=2, ct_layers=3, dropout=0.0)
    return Composer(**constructor_args(Composer, {**args, **kw})).eval()


# ---------------------------------------------------------------------------------------------- batch
def test_batch_nodes_heights_arguments_and_root():
    graph, tables, _ = tiny_graph()
    b = composition_batch(graph, tables, [0, 1])
    ptr = b["caption_node_ptr"].tolist()
    concept = [graph.concept_text[int(c)] for c in b["node_concept"]]
    # caption 0: primitives dog, grass; then "a dog" (1), "the grass" (1), "on the grass"? no: PP is not a concept:
    # applications bottom-up: a dog, the grass, then the root over both
    assert concept[ptr[0]:ptr[1]] == ["dog", "grass", "a dog", "the grass", "a dog running on the grass"]
    assert b["node_height"][ptr[0]:ptr[1]].tolist() == [0, 0, 1, 1, 2]
    assert concept[ptr[1]:ptr[2]] == ["cats", "two cats"]
    assert b["caption_root"].tolist() == [4, 1]
    # the root's template binds "a dog" (local 2) and "the grass" (local 3), in template order
    templates = [graph.predicate_template[int(graph.app_predicate[a])] for a in graph.caption_apps]
    root_app = int(torch.nonzero(b["app_local"] == 4)[0])
    assert b["app_args"][root_app].tolist() == [2, 3]
    assert "[NP] running on [NP]" in templates
    # the placeholders are new word pieces after the vocabulary, at their template positions
    pred = int(b["app_pred"][root_app])
    pos = b["placeholder_pos"][pred].tolist()
    ids = b["template_ids"][pred]
    assert all(int(ids[p]) == tables.placeholder_base + PLACEHOLDER_TYPES.index("NP") for p in pos)


def test_caption_without_crg_is_one_fallback_primitive():
    graph, tables, texts = tiny_graph(failed=True)
    b = composition_batch(graph, tables, [3, 1])
    assert b["caption_node_ptr"].tolist()[:2] == [0, 1]
    assert b["caption_root"].tolist() == [0, 1]
    ids = b["primitive_ids"][int(b["prim_unique"][0])]
    assert ids[ids > 0].tolist() == load_tokenizer("tiny-random")("blah", add_special_tokens=False)["input_ids"]


def test_phrase_queries_are_non_sentence_concepts_with_denotations():
    graph, tables, _ = tiny_graph()
    b1 = composition_batch(graph, tables, [0, 2], phrase_seed=0)
    b2 = composition_batch(graph, tables, [2], phrase_seed=0)  # same draw whatever the batching
    roots = set((b1["caption_node_ptr"][:-1] + b1["caption_root"]).tolist())
    assert not roots & set(b1["phrase_node"].tolist())
    assert (b1["node_concept"][b1["phrase_node"]] >= 0).all()
    second = b1["node_concept"][b1["phrase_node"]][b1["phrase_node"] >= int(b1["caption_node_ptr"][1])]
    assert second.tolist() == b2["node_concept"][b2["phrase_node"]].tolist()
    dog = graph.concept("a dog")
    q = int(torch.nonzero(b1["node_concept"][b1["phrase_node"]] == dog)[0])
    den = b1["phrase_denotation"][b1["phrase_denotation_ptr"][q]:b1["phrase_denotation_ptr"][q + 1]]
    assert den.tolist() == [0]


# ---------------------------------------------------------------------------------------------- modules
def test_film_modulator_hand_computed():
    m = Modulator(dim=2, hidden=2, kind="film", identity_init=False)
    double = nn.Linear(2, 2, bias=False)
    double.weight.data = 2 * torch.eye(2)
    m.scale, m.shift, m.proj = nn.Identity(), double, nn.Identity()
    e, c = torch.tensor([[1.0, -2.0]]), torch.tensor([[3.0, 0.5]])
    # a = e, b = 2e: a ⊙ c + b = [1*3 + 2, -2*0.5 - 4]
    assert m(e, c).tolist() == [[5.0, -5.0]]
    # identity_init: a = 1 + MLP_a(e) = 1 + e, b = 2e: [2*3 + 2, -1*0.5 - 4]
    m = Modulator(dim=2, hidden=2, kind="film")
    m.scale, m.shift, m.proj = nn.Identity(), double, nn.Identity()
    assert m(e, c).tolist() == [[8.0, -4.5]]
    # skip: z + proj(z), proj doubling z = [8, -4.5] -> 3z
    m = Modulator(dim=2, hidden=2, kind="film", skip=True)
    m.scale, m.shift, m.proj = nn.Identity(), double, double
    assert m(e, c).tolist() == [[24.0, -13.5]]
    assert Modulator(2, 2, "replace")(e, c).tolist() == c.tolist()
    with pytest.raises(ValueError, match="modulator"):
        Modulator(2, 2, "concat")


def test_film_identity_init_passes_the_child_whole_and_old_checkpoints_keep_their_parametrisation():
    torch.manual_seed(0)
    e, c = torch.randn(5, 8), torch.randn(5, 8)
    m = Modulator(dim=8, hidden=8, kind="film", skip=True)
    assert torch.equal(m(e, c), c)  # a = 1, b = 0, proj's residual branch zero: the child itself
    plain = Modulator(dim=8, hidden=8, kind="film", identity_init=False)
    state = {k: v for k, v in plain.state_dict().items() if k != "scale_offset"}  # written before the buffer existed
    loaded = Modulator(dim=8, hidden=8, kind="film")
    loaded.load_state_dict(state)
    assert loaded.scale_offset.item() == 0.0
    assert torch.allclose(loaded(e, c), plain(e, c))


def test_placeholders_start_distinct_at_the_vocabulary_norm():
    net = tiny_net()
    emb = net.predicate_transformer.get_input_embeddings().weight.detach()
    rows = emb[net.placeholder_base:]
    cos = torch.nn.functional.normalize(rows, dim=1) @ torch.nn.functional.normalize(rows, dim=1).T
    assert cos.fill_diagonal_(0).abs().max() < 0.9
    assert torch.allclose(rows.norm(dim=1), emb[:net.placeholder_base].norm(dim=1).mean().expand(len(rows)), rtol=1e-4)
    same = tiny_net(placeholder_init="mean").predicate_transformer.get_input_embeddings().weight.detach()
    base = net.placeholder_base
    assert torch.allclose(same[base:], same[base:base + 1].expand(len(rows), -1), atol=0.05)  # transformers' mean rows


def test_last_coattention_block_has_no_image_direction_and_old_weights_load():
    net = tiny_net(ct_layers=5)
    blocks = net.composition.co_attention
    assert blocks[0].image_from_text is not None and blocks[-1].image_from_text is None
    state = net.composition.state_dict()
    extra = {f"co_attention.1.image_from_text.{k}": v for k, v in blocks[0].image_from_text.state_dict().items()}
    net.composition.load_state_dict({**state, **extra})  # a checkpoint with the computed-and-discarded branch


def test_every_composition_parameter_gets_a_gradient():
    graph, tables, _ = tiny_graph()
    for kw in ({}, {"readout": "mean", "modulator_skip": True, "child_skip": True, "score_head": "image_gated",
                    "composition_scale": 0.3}):
        net = tiny_net(**kw).train()
        b = composition_batch(graph, tables, [0, 1, 2])
        regions, mask = net.embed_regions(torch.randn(3, 3, 32, 32))
        pairs = torch.arange(3)
        table, ptr = net.compose(b, regions, mask, pairs, pairs)
        net.node_scores(table, ptr, regions, mask, pairs).sum().backward()
        missing = [n for n, p in net.named_parameters() if p.requires_grad and p.grad is None
                   and not n.startswith(("predicate_transformer.pooler", "backbone"))]
        assert not missing, missing


def test_image_gated_score_is_theta_of_the_concept_times_its_images_gate():
    """``score_head: image_gated``: s = θᵀ(v ⊙ ReLU(W·mean of the pair image's region tokens)), row by row against a
    hand-written reference; ``linear`` is θᵀv whatever the image; a gated score without its gate is refused."""
    graph, tables, _ = tiny_graph()
    b = composition_batch(graph, tables, [0, 1, 2])
    pair_image, pair_caption = torch.tensor([2, 0, 1, 1]), torch.tensor([0, 0, 2, 1])
    for head in ("linear", "image_gated"):
        net = tiny_net(score_head=head)
        regions, mask = net.embed_regions(torch.randn(3, 3, 32, 32))
        mask = mask.clone()
        mask[1, -2:] = False  # the gate's mean is over the image's real regions only
        with torch.no_grad():
            table, ptr = net.compose(b, regions, mask, pair_image, pair_caption)
            s = net.node_scores(table, ptr, regions, mask, pair_image)
        expected = []
        for p, image in enumerate(pair_image.tolist()):
            v = table[ptr[p]:ptr[p + 1]]
            if head == "image_gated":
                pooled = regions[image][mask[image]].mean(0)
                gate = torch.relu(pooled @ net.image_gate[0].weight.T + net.image_gate[0].bias)
                v = v * gate
            expected.append(v @ net.theta.weight[0] + net.theta.bias[0])
        torch.testing.assert_close(s, torch.cat(expected), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="image_gated"):
        net.score(table)
    with pytest.raises(ValueError, match="score_head"):
        tiny_net(score_head="bilinear")


def test_grid_regions_cover_the_image():
    feats, boxes, mask = grid_regions(torch.arange(2 * 3 * 2 * 2, dtype=torch.float).reshape(2, 3, 2, 2))
    assert feats.shape == (2, 4, 3) and mask.all()
    assert boxes[0].tolist() == [[0, 0, 0.5, 0.5], [0.5, 0, 1, 0.5], [0, 0.5, 0.5, 1], [0.5, 0.5, 1, 1]]
    assert feats[0, 1].tolist() == [1.0, 5.0, 9.0]  # cell (row 0, col 1) of every channel


@pytest.mark.parametrize("modulator", ["film", "replace", "mlp"])
@pytest.mark.parametrize("cross", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("learns", [False, True])
def test_level_batched_recursion_equals_node_by_node(modulator, cross, norm_first, learns):
    graph, tables, _ = tiny_graph(failed=True)
    switches = (dict(readout="mean", modulator_skip=True, child_skip=True, primitive_queries="encoder",
                     score_head="image_gated", composition_scale=0.3) if learns else {})
    net = tiny_net(modulator=modulator, primitive_cross_attention=cross, norm_first=norm_first, **switches)
    if learns:  # the zero-initialised residual branches made non-zero, so the skips are exercised
        with torch.no_grad():
            for p in net.modulator.parameters():
                p.add_(0.1 * torch.randn_like(p))
    b = composition_batch(graph, tables, [0, 1, 2, 3])
    regions, mask = net.embed_regions(torch.randn(3, 3, 32, 32))
    pair_image, pair_caption = torch.tensor([0, 1, 2, 2, 0, 1, 0]), torch.tensor([0, 1, 2, 0, 2, 3, 1])
    with torch.no_grad():
        table, ptr = net.compose(b, regions, mask, pair_image, pair_caption)
        reference = compose_node_by_node(net, b, regions, mask, pair_image, pair_caption)
    torch.testing.assert_close(table, reference, atol=1e-5, rtol=1e-5)
    s = net(b, regions, mask, pair_image, pair_caption)
    root = ptr[:-1] + b["caption_root"][pair_caption]
    torch.testing.assert_close(s, net.node_scores(reference, ptr, regions, mask, pair_image)[root])


@pytest.mark.parametrize("ct_layers", [3, 5])
def test_image_stream_once_is_the_same_function(ct_layers):
    """``image_stream_once``: the CT's text-independent image layers once per image, the same table (eval mode)."""
    graph, tables, _ = tiny_graph(failed=True)
    net = tiny_net(ct_layers=ct_layers, readout="mean", child_skip=True)
    b = composition_batch(graph, tables, [0, 1, 2, 3])
    regions, mask = net.embed_regions(torch.randn(3, 3, 32, 32))
    pair_image, pair_caption = torch.tensor([0, 1, 2, 2, 0, 1, 0]), torch.tensor([0, 1, 2, 0, 2, 3, 1])
    with torch.no_grad():
        per_row, _ = net.compose(b, regions, mask, pair_image, pair_caption)
        net.image_stream_once = True
        once, _ = net.compose(b, regions, mask, pair_image, pair_caption)
    torch.testing.assert_close(once, per_row, atol=1e-5, rtol=1e-5)


def test_open_pairs_compose_the_caption_the_device_chose():
    """A pair whose caption is chosen on the device (the batch-mode hard negative) is padded to the longest candidate:
    its rows of the chosen caption equal a fixed pair's, and the gradients of both layouts agree."""
    graph, tables, _ = tiny_graph(failed=True)
    net = tiny_net(readout="mean", child_skip=True, modulator_skip=True)
    with torch.no_grad():
        for p in net.modulator.parameters():
            p.add_(0.1 * torch.randn_like(p))
    b = composition_batch(graph, tables, [0, 1, 2, 3])
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    pair_image = np.array([0, 1, 2, 2, 0, 1])
    chosen = np.array([2, 0, 3])  # the last three pairs' captions, "chosen on the device"
    fixed_caption = np.concatenate([[0, 1, 2], chosen])
    open_caption = np.concatenate([[0, 1, 2], [-1, -1, -1]])
    out = {}
    for name, caption in (("fixed", fixed_caption), ("open", open_caption)):
        net.zero_grad()
        regions, mask = net.embed_regions(images)
        schedule = pair_schedule(b["host"], caption, pair_image)
        device_caption = torch.from_numpy(fixed_caption)  # the device's choice fills the open pairs
        table, ptr = net.compose(b, regions, mask, None, device_caption, schedule=schedule)
        n_node = np.diff(b["host"].node_ptr)[fixed_caption]
        rows = torch.cat([torch.arange(int(ptr[p]), int(ptr[p]) + int(n)) for p, n in enumerate(n_node)])
        kept = table[rows]
        kept.square().sum().backward()
        out[name] = kept.detach(), {k: p.grad.clone() for k, p in net.named_parameters() if p.grad is not None}
    assert out["open"][0].shape == out["fixed"][0].shape
    torch.testing.assert_close(out["open"][0], out["fixed"][0], atol=1e-5, rtol=1e-5)
    assert out["open"][1].keys() == out["fixed"][1].keys()
    for k in out["fixed"][1]:
        torch.testing.assert_close(out["open"][1][k], out["fixed"][1][k], atol=1e-4, rtol=1e-4, msg=k)


def test_packed_predicate_transformer_gives_the_same_concepts_and_gradients():
    """``packed_tokens``: the PT on real word pieces only (templates and, with ``primitive_queries: encoder``, the
    primitives), the same concept table and the same gradients as the padded PT."""
    graph, tables, _ = tiny_graph(failed=True)
    b = composition_batch(graph, tables, [0, 1, 2, 3])
    assert not b["template_mask"].all()  # there is padding to skip
    images = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    pair_image, pair_caption = torch.tensor([0, 1, 2, 2, 0, 1, 0]), torch.tensor([0, 1, 2, 0, 2, 3, 1])
    out = {}
    for packed in (False, True):
        net = tiny_net(packed_tokens=packed, readout="mean", child_skip=True, primitive_queries="encoder")  # eval: no dropout
        regions, mask = net.embed_regions(images)
        table, _ = net.compose(b, regions, mask, pair_image, pair_caption)
        net.score(table).sum().backward()
        out[packed] = table.detach(), {n: p.grad for n, p in net.named_parameters() if p.grad is not None}
    torch.testing.assert_close(out[True][0], out[False][0], atol=1e-5, rtol=1e-5)
    assert out[True][1].keys() == out[False][1].keys()
    for name, grad in out[False][1].items():
        torch.testing.assert_close(out[True][1][name], grad, atol=1e-5, rtol=1e-4, msg=name)
    with pytest.raises(ValueError, match="packed_tokens"):
        tiny_net(packed_tokens="yes")


def test_text_is_composed_with_the_image():
    graph, tables, _ = tiny_graph()
    net = tiny_net()
    b = composition_batch(graph, tables, [0])
    regions, mask = net.embed_regions(torch.randn(2, 3, 32, 32))
    with torch.no_grad():
        s = net(b, regions, mask, torch.tensor([0, 1]), torch.tensor([0, 0]))
    assert not torch.isclose(s[0], s[1])


def test_placeholders_extend_the_vocabulary():
    net = tiny_net()
    emb = net.predicate_transformer.embeddings.word_embeddings
    assert emb.num_embeddings == net.placeholder_base + len(PLACEHOLDER_TYPES)
    assert net.placeholder_base == len(load_tokenizer("tiny-random"))


def test_ct_layers_must_be_odd():
    with pytest.raises(ValueError, match="odd"):
        tiny_net(ct_layers=4)


# ---------------------------------------------------------------------------------------------- losses
def test_match_nll_is_four_way_softmax():
    scores = torch.tensor([[2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    expected = (-(2 - np.log(np.exp(2) + 3)) + np.log(4)) / 2
    assert match_nll(scores).item() == pytest.approx(expected, rel=1e-6)


def test_mvsa_and_order_hinges_hand_computed():
    pos, neg_c, neg_x = torch.tensor([1.0, 0.5]), torch.tensor([0.0, 0.4]), torch.tensor([0.5, -1.0])
    # [0.8-1+0]+ + [0.8-1+0.5]+ = 0 + 0.3 ; [0.8-0.5+0.4]+ + [0.8-0.5-1]+ = 0.7 + 0 ; sum 1.0 over 2 positives
    assert mvsa_loss(pos, neg_c, neg_x, torch.tensor([0, 1]), 2, margin=0.8).item() == pytest.approx(0.5)
    nll = mvsa_loss(pos, neg_c, neg_x, torch.tensor([0, 1]), 2, kind="nll").item()
    ref = -torch.log_softmax(torch.stack([pos, neg_c, neg_x], 1), 1)[:, 0].sum().item() / 2
    assert nll == pytest.approx(ref)
    # parents 1.0 and 0.1 over children 0.9 and 0.5: [0.2-1+0.9]+ + [0.2-0.1+0.5]+ = 0.1 + 0.6
    owner = torch.tensor([0, 0])
    assert order_loss(torch.tensor([1.0, 0.1]), torch.tensor([0.9, 0.5]), owner, 1, margin=0.2).item() == pytest.approx(0.7)
    # mean within a caption: caption 0's edges average to 0.35, caption 1 has none
    assert order_loss(torch.tensor([1.0, 0.1]), torch.tensor([0.9, 0.5]), owner, 2, margin=0.2,
                      reduction="mean").item() == pytest.approx(0.35 / 2)
    # hinge terms 0.3 (positive 0) and 0.7 (positive 1): per-caption means are the same, over 2 positives
    assert mvsa_loss(pos, neg_c, neg_x, torch.tensor([0, 0]), 1, reduction="mean").item() == pytest.approx(0.5)


def test_same_height_partners():
    # caption 0: heights [0,0,1,1,2]; caption 1: [0,1]; caption 0's partner is 1 and 1's is 0
    node_ptr = np.array([0, 5, 7])
    heights = np.array([0, 0, 1, 1, 2, 0, 1])
    partner = same_height_partners(node_ptr, heights, np.array([1, 0]))
    # caption 0 -> caption 1: primitives -> its primitive (local 0, cycling), height 1 -> local 1, height 2 -> its root (1)
    assert partner[:5].tolist() == [0, 0, 1, 1, 1]
    # caption 1 -> caption 0: its primitive -> caption 0's first primitive, its height-1 node -> the first of height 1
    assert partner[5:].tolist() == [0, 2]


def test_four_way_negatives_and_the_hard_one():
    graph, tables, _ = tiny_graph()
    module = ComposerTraining(tiny_net())
    regions = torch.tensor([[[1.0, 0.0]], [[0.9, 0.1]], [[0.0, 1.0]], [[-1.0, 0.0]]])
    mask = torch.ones(4, 1, dtype=torch.bool)
    torch.manual_seed(0)
    for _ in range(5):
        neg = module.negatives(regions, mask)
        random_caption, random_image, hard = neg.random_caption, neg.random_image, neg.hard_device.numpy()
        assert neg.hard is None  # chosen on the device (hard_negatives: batch)
        rows = np.arange(4)
        assert (random_caption != rows).all() and (random_image != rows).all() and (hard != rows).all()
        assert (hard != random_caption).all()
    # image 0's nearest other image is 1 unless 1 is already its random caption
    assert int(hard[0]) == (1 if int(random_caption[0]) != 1 else 2)
    with pytest.raises(ValueError, match="at least 3"):
        module.negatives(regions[:2], mask[:2])


def test_training_losses_are_finite_and_backpropagate():
    graph, tables, _ = tiny_graph()
    module = ComposerTraining(tiny_net(), feature_cache=False)
    b = composition_batch(graph, tables, [0, 1, 2])
    b["images"] = torch.randn(3, 3, 32, 32)
    losses = module.compute_losses(b)
    assert set(losses) >= {"match", "mvsa", "order", "loss"}
    losses["loss"].backward()
    # FiLM's identity start: MLP_a's last layer is zero, so it (not yet the layer below) gets the first gradient
    assert module.net.theta.weight.grad is not None and module.net.modulator.scale[-1].weight.grad.abs().sum() > 0


# ---------------------------------------------------------------------------------------------- evaluation
def test_rerank_over_all_images_equals_exhaustive():
    graph, tables, _ = tiny_graph()
    net = tiny_net()
    b = composition_batch(graph, tables, [0, 1, 2], phrase_seed=0)
    regions, mask = net.embed_regions(torch.randn(4, 3, 32, 32))
    full, phrases = score_captions(net, b, regions, mask, image_chunk=3)
    assert torch.isfinite(full).all() and torch.isfinite(phrases).all()
    top, _ = score_captions(net, b, regions, mask, image_chunk=2, rerank_top_k=4)
    torch.testing.assert_close(top, full)
    # K = 1: each caption's first-stage best image keeps its full score and ranks first
    one, _ = score_captions(net, b, regions, mask, rerank_top_k=1)
    best = one.argmax(0)
    torch.testing.assert_close(one[best, torch.arange(3)], full[best, torch.arange(3)])


def test_reranked_evaluation_logs_its_first_stage_recall_at_k():
    from grounding.composer.evaluation import primitive_first_stage

    graph, tables, _ = tiny_graph()
    module = ComposerTraining(tiny_net(), rerank_top_k=2, feature_cache=False).eval()
    logged = {}
    module.log = lambda name, value, **kw: logged.__setitem__(name, value)
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        module._eval_step({"images": images, "image_index": torch.arange(3)}, 0, "test")
        batch = {**composition_batch(graph, tables, [0, 1, 2]), "caption_image_index": torch.tensor([0, 1, 2]),
                 "compositional": torch.zeros(3, dtype=torch.bool)}
        module._eval_step(batch, 1, "test")
        module._eval_epoch_end("test")
        regions, mask = module.regions({"images": images})
        first = primitive_first_stage(module.net, batch, regions, mask)  # (images, captions)
    in_top2 = (first.topk(2, dim=0).indices == torch.arange(3)).any(0).float().mean().item() * 100
    assert logged["test/first_stage/t2i_r2"] == pytest.approx(in_top2)
    assert "test/rsum" in logged
    module.rerank_top_k = None
    logged.clear()
    with torch.no_grad():
        module._eval_step({"images": images, "image_index": torch.arange(3)}, 0, "test")
        module._eval_step(batch, 1, "test")
        module._eval_epoch_end("test")
    assert not any(k.startswith("test/first_stage") for k in logged)  # exhaustive: no first stage


def test_phrase_hits_and_compositional_recalls():
    hits = phrase_hits(torch.tensor([2, 0]), torch.tensor([0, 2, 3]), torch.tensor([1, 2, 1]))
    assert hits.tolist() == [True, False]
    sentence = torch.tensor([[0.9, 0.1, 0.2], [0.1, 0.8, 0.9]])  # 2 images x 3 captions
    m = composer_metrics(sentence, torch.tensor([0, 1, 0]), torch.tensor([False, False, True]), phrase_r1=50.0)
    assert m["compositional/t2i_r1"] == 0.0 and m["in_distribution/t2i_r1"] == 100.0
    assert m["phrase_r1"] == 50.0 and m["t2i_r1"] == pytest.approx(200 / 3)


def test_held_out_pair_mask(tmp_path):
    meta = {"held_out_pairs": [["white", "box"]], "vocabulary": {"objects": [
        {"name": "box", "plural": "boxes", "synonyms": [{"word": "crate", "plural": "crates"}]}]}}
    path = tmp_path / "world.json"
    path.write_text(json.dumps(meta))
    texts = ["A white crate on the sand", "a white ball next to a box", "Two white boxes.", "a whiteboard box"]
    # the attribute must describe the object: "white ball ... box" does not name the pair
    assert held_out_pair_mask(texts, path).tolist() == [True, False, True, False]


def test_unknown_placeholder_labels_share_the_x_placeholder():
    # "(NP (NP (DT a) (NN dog)) (VP (NN bites)))": a one-word VP over a noun is an argument labelled VP
    crg = extract_crg("(NP (NP (DT a) (NN dog)) (VP (NN bites)))")
    graph = ConceptGraph.build([crg], [0], ["0.jpg"])
    tables = TokenTables(graph, load_tokenizer("tiny-random"), ["a dog bites"])
    assert "[NP] [VP]" in graph.predicate_template.tolist()
    x = tables.placeholder_base + PLACEHOLDER_TYPES.index("X")
    assert x in tables.template_ids.tolist()

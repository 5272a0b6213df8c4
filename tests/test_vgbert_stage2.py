"""VG-BERT stage 2 (relational grounding, §3.2 / App. A.3): maths on hand-checked cases + a tiny run."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from data_modules.options import ImageTransform
from grounding.nets import constructor_args, flat_args, option_groups
from grounding.vgbert.relational import (
    BilinearRelation,
    CrossModalAttention,
    ObjectClassifier,
    bilinear_scores,
    group_slots,
    object_pair_loss,
    pair_relation_mask,
    relation_loss,
    relational_losses,
)


# ------------------------------------------------------------------------------ bilinear relations
def test_bilinear_score_hand_checked():
    rel = BilinearRelation(width=4, num_relations=2, dim=2)
    with torch.no_grad():
        rel.relation_weight.copy_(torch.tensor([[[1.0, 0.0], [0.0, 2.0]], [[0.0, 3.0], [0.0, 0.0]]]))
    r_s, r_o = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 1.0]])
    # R_0 = diag(1, 2)/sqrt(5): r_s R_0 r_o^T = (1*1*3 + 2*2*1)/sqrt(5); R_1 = [[0,1],[0,0]]: 1*1*1 = 1.
    s = rel(r_s, r_o)
    assert torch.allclose(s, torch.tensor([[7 / math.sqrt(5), 1.0]]))
    assert torch.allclose(bilinear_scores(r_s, r_o, rel.relation_operator), s)


def test_relation_operator_frobenius_normalised_and_scale_free():
    rel = BilinearRelation(width=8, num_relations=5, dim=32)
    norms = torch.linalg.matrix_norm(rel.relation_operator, ord="fro")
    assert torch.allclose(norms, torch.ones(5), atol=1e-6)
    before = rel.relation_operator.detach().clone()
    with torch.no_grad():
        rel.relation_weight.mul_(torch.arange(1.0, 6.0).view(5, 1, 1))
    assert torch.allclose(rel.relation_operator, before, atol=1e-6)
    # Gradients flow to the raw weight through the normalisation.
    rel(torch.randn(3, 32), torch.randn(3, 32)).sum().backward()
    assert rel.relation_weight.grad is not None and rel.relation_weight.grad.abs().sum() > 0


def test_object_classifier_two_fc_layers():
    head = ObjectClassifier(16, 55)
    assert [type(m).__name__ for m in head] == ["Linear", "ReLU", "Linear"]
    assert head(torch.randn(7, 16)).shape == (7, 55)


# ------------------------------------------------------------------------------ losses
def test_relation_loss_hand_computed():
    scores = torch.tensor([[1.0, 2.0, 0.0], [0.5, 0.0, 3.0]])
    pred = torch.tensor([0, 2])
    expected = (-math.log(math.e / (math.e + math.e ** 2 + 1)) - math.log(math.e ** 3 / (math.e ** 0.5 + 1 + math.e ** 3))) / 2
    assert relation_loss(scores, pred, 1.0).item() == pytest.approx(expected, rel=1e-6)
    # Temperature divides the scores.
    assert relation_loss(scores, pred, 0.5).item() == pytest.approx(F.cross_entropy(scores / 0.5, pred).item(), rel=1e-6)
    # A pair also annotated with relation 1 does not count relation 1 as a negative.
    holds = torch.tensor([[True, True, False], [False, False, True]])
    expected_masked = (-math.log(math.e / (math.e + 1)) - math.log(math.e ** 3 / (math.e ** 0.5 + 1 + math.e ** 3))) / 2
    assert relation_loss(scores, pred, 1.0, holds).item() == pytest.approx(expected_masked, rel=1e-6)


def test_object_pair_loss_hand_computed():
    # Triplets 0 and 1 share predicate 0; triplet 2 has predicate 1. S[m, p] = score of pair m under R_p.
    S = torch.tensor([[1.0, 0.2], [0.5, -1.0], [2.0, 0.7]])
    pred = torch.tensor([0, 0, 1])
    e = math.exp
    a0 = -math.log(e(1.0) / (e(1.0) + e(2.0)))  # pair 1 holds relation 0 too: not a negative of pair 0
    a1 = -math.log(e(0.5) / (e(0.5) + e(2.0)))
    a2 = -math.log(e(0.7) / (e(0.2) + e(-1.0) + e(0.7)))  # pairs 0 and 1 are in a different relation
    assert object_pair_loss(S, pred, 1.0).item() == pytest.approx((a0 + a1 + a2) / 3, rel=1e-6)


def _object_pair_loss_loop(S, pred, subject, object, tau):
    """Reference: Eq. 5 written triplet by triplet (negatives: pairs not holding the anchor's relation)."""
    n = len(pred)
    total = 0.0
    for i in range(n):
        holds = [any(subject[j] == subject[k] and object[j] == object[k] and pred[k] == pred[i] for k in range(n))
                 for j in range(n)]
        den = sum(math.exp(S[j, pred[i]] / tau) for j in range(n) if j == i or not holds[j])
        total += -math.log(math.exp(S[i, pred[i]] / tau) / den)
    return total / n


def test_object_pair_loss_matches_loop_reference_with_shared_pairs():
    g = torch.Generator().manual_seed(0)
    n, p = 12, 4
    S = torch.randn(n, p, generator=g, dtype=torch.float64)
    pred = torch.randint(0, p, (n,), generator=g)
    subject = torch.randint(0, 3, (n,), generator=g)
    object = torch.randint(3, 5, (n,), generator=g)  # few objects: pairs repeat with other predicates
    holds = pair_relation_mask(subject, object, pred, p)
    got = object_pair_loss(S, pred, 0.7, holds).item()
    ref = _object_pair_loss_loop(S, pred.tolist(), subject.tolist(), object.tolist(), 0.7)
    assert got == pytest.approx(ref, rel=1e-9)


def test_pair_relation_mask():
    subject, object = torch.tensor([0, 0, 2, 0]), torch.tensor([1, 1, 3, 3])
    pred = torch.tensor([0, 2, 0, 1])
    holds = pair_relation_mask(subject, object, pred, 3)
    assert holds.tolist() == [[True, False, True], [True, False, True], [True, False, False], [False, True, False]]
    own = pair_relation_mask(subject, object, pred, 3, same_pair=False)
    assert own.tolist() == F.one_hot(pred, 3).bool().tolist()


def test_relational_losses_switches_and_ignore_labels():
    scores = torch.randn(4, 3, requires_grad=True)
    logits = torch.randn(5, 6, requires_grad=True)
    subj, obj = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 4])
    pred = torch.tensor([0, 1, -1, 2])
    labels = torch.tensor([1, -1, 2, 3, 0])
    out = relational_losses(scores, logits, subj, obj, pred, labels)
    keep = pred >= 0
    assert out["loss_rel"].item() == pytest.approx(F.cross_entropy(scores[keep], pred[keep]).item(), rel=1e-6)
    assert out["loss_cls"].item() == pytest.approx(F.cross_entropy(logits[labels >= 0], labels[labels >= 0]).item(), rel=1e-6)
    assert out["loss"].item() == pytest.approx((out["loss_rel"] + out["loss_obj"] + out["loss_cls"]).item(), rel=1e-6)
    no_rel = relational_losses(scores, logits, subj, obj, pred, labels, use_loss_rel=False)
    assert no_rel["loss"].item() == pytest.approx((out["loss_obj"] + out["loss_cls"]).item(), rel=1e-6)
    no_aux = relational_losses(scores, logits, subj, obj, pred, labels, use_object_loss=False)
    no_aux["loss"].backward()
    assert logits.grad is None or logits.grad.abs().sum() == 0  # the classifier gets no signal (Table 5 row 2)
    empty = relational_losses(scores, logits, subj, obj, torch.full((4,), -1), torch.full((5,), -1))
    assert empty["loss"].item() == 0.0 and empty["loss"].requires_grad


# ------------------------------------------------------------------------------ cross-modal attention
def test_group_slots():
    slot, m = group_slots(torch.tensor([2, 0, 2, 1, 2, 0]), 3)
    assert slot.tolist() == [0, 0, 1, 0, 2, 1] and m == 3


def _mha_reference(att: CrossModalAttention, visual, words, mask, idx):
    """torch.nn.MultiheadAttention with the same projections and an identity output map (Eq. 3: concat)."""
    d = att.width
    mha = torch.nn.MultiheadAttention(d, att.num_heads, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([att.query.weight, att.key.weight, att.value.weight]))
        mha.in_proj_bias.copy_(torch.cat([att.query.bias, att.key.bias, att.value.bias]))
        mha.out_proj.weight.copy_(torch.eye(d))
        mha.out_proj.bias.zero_()
    flat = visual.flatten(1, 2)
    out = []
    for n in range(len(idx)):  # reference only: a loop over objects
        o, w = mha(words[n:n + 1], flat[idx[n]][None], flat[idx[n]][None])
        out.append(o[0][mask[n]].mean(0))
    return torch.stack(out)


def test_cross_attention_matches_multihead_reference_and_masks():
    torch.manual_seed(0)
    att = CrossModalAttention(32, num_heads=8).eval()
    visual = torch.randn(3, 4, 5, 32)
    words = torch.randn(6, 7, 32)
    mask = torch.ones(6, 7, dtype=torch.bool)
    mask[:, 0] = False  # [CLS]
    mask[[0, 1, 2], 4:] = False
    mask[[3, 4, 5], 6:] = False
    idx = torch.tensor([0, 2, 0, 1, 2, 2])
    out = att(visual, words, mask, idx)
    assert out["grounded"].shape == (6, 32) and out["tokens"].shape == (6, 7, 32)
    assert torch.allclose(out["grounded"], _mha_reference(att, visual, words, mask, idx), atol=1e-5)
    # The explicit-attention path gives the same result plus a normalised attention map over 20 locations.
    full = att(visual, words, mask, idx, return_attention=True)
    assert torch.allclose(full["grounded"], out["grounded"], atol=1e-5)
    assert full["attention"].shape == (6, 20) and torch.allclose(full["attention"].sum(-1), torch.ones(6), atol=1e-5)
    # Masked tokens and other images do not matter.
    words2 = words.clone()
    words2[~mask] = 100.0
    visual2 = visual.clone()
    visual2[1] = -visual2[1]  # only object 3 lives in image 1
    out2 = att(visual2, words2, mask, idx)
    same = idx != 1
    assert torch.allclose(out2["grounded"][same], out["grounded"][same], atol=1e-5)
    assert not torch.allclose(out2["grounded"][~same], out["grounded"][~same], atol=1e-3)
    # Mean pooling: one query per object.
    mean = CrossModalAttention(32, 8, query_pooling="mean").eval()
    assert mean(visual, words, mask, idx)["grounded"].shape == (6, 32)
    with pytest.raises(ValueError, match="num_heads"):
        CrossModalAttention(30, 8)


# ------------------------------------------------------------------------------ LightningModule
def _tiny_module(relation_labels=("on", "near"), object_classes=("a", "b", "c"), **kw):
    import inspect

    from grounding.vgbert.finetune import RelationalFinetune
    from grounding.vgbert.relational import VGBertRelational

    arch = dict(text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None, visual_heads=2, image_size=64)
    net_keys = set(inspect.signature(VGBertRelational.__init__).parameters)
    net_keys |= {f.name for group in option_groups(VGBertRelational).values() for f in dataclasses.fields(group)}
    arch.update({k: kw.pop(k) for k in list(kw) if k in net_keys})
    net = VGBertRelational(len(relation_labels), len(object_classes), **constructor_args(VGBertRelational, arch))
    return RelationalFinetune(net, list(relation_labels), list(object_classes), **{"feature_cache": False, **kw})


def _vg_datamodule(world, batch_size=8):
    from data_modules import VisualGenomeDataModule

    return VisualGenomeDataModule(root=str(world / "visual_genome"), text_encoder="tiny-random",
                                  transform=ImageTransform(image_size=64, resize_size=64), batch_size=batch_size)


def _trainer(tmp_path, **kw):
    import lightning as L

    args = dict(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                accelerator="cpu", default_root_dir=str(tmp_path), enable_model_summary=False)
    args.update(kw)
    return L.Trainer(**args)


def test_finetune_fit_test_and_metrics(tiny_world, tmp_path):
    torch.manual_seed(0)
    dm = _vg_datamodule(tiny_world)
    model = _tiny_module(dm.relation_labels, dm.object_classes)
    trainer = _trainer(tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=2, limit_test_batches=2)
    trainer.fit(model, dm)
    assert model.hparams.relation_labels == dm.relation_labels and len(model.hparams.object_classes) > 1
    res = trainer.test(model, dm, verbose=False)[0]
    for key in ("test/relation_top1", "test/relation_top10", "test/object_top1", "test/loss"):
        assert key in res and 0.0 <= res[key] <= (1.0 if "top" in key else 1e9)
    assert RelationalFinetune_monitor() == ("val/relation_top1", "max")
    # Only the top layers, the visual attention and the new modules train; the CNN stays frozen.
    assert not any(p.requires_grad for p in model.model.visual.backbone.parameters())
    assert all(p.requires_grad for p in model.model.relational.parameters())
    preds = model.predict_step(next(iter(dm.test_dataloader())), 0)
    assert preds["triplets"] and len(preds["triplets"][0]["predicted"]) == min(5, len(dm.relation_labels))


def RelationalFinetune_monitor():
    from grounding.vgbert.finetune import RelationalFinetune

    return RelationalFinetune.monitor, RelationalFinetune.monitor_mode


def test_init_from_stage1_checkpoint(tmp_path):
    from grounding.checkpoints import CheckpointError
    from grounding.vgbert.pretrain import GroundingPretrain, MatchMapGrounding

    torch.manual_seed(1)
    stage1 = GroundingPretrain(MatchMapGrounding(text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None,
                                                 visual_heads=2, image_size=64), feature_cache=False)
    path = tmp_path / "stage1.ckpt"
    torch.save({"state_dict": stage1.state_dict(), "hyper_parameters": dict(stage1.hparams)}, path)
    model = _tiny_module(init_from=str(path), relation_labels=["on", "near"], object_classes=["a", "b", "c"])
    model.load_stage1(path)
    for name in ("visual", "language"):
        mine = getattr(model.model, name).state_dict()
        theirs = getattr(stage1.model, name).state_dict()
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert not hasattr(model.model, "visual_head")  # stage-1 projection heads are not carried over
    # Missing stream weights: a clear error naming the checkpoint and the missing keys.
    state = {k: v for k, v in stage1.state_dict().items() if not k.startswith("model.visual.attention")}
    bad = tmp_path / "bad.ckpt"
    torch.save({"state_dict": state, "hyper_parameters": {}}, bad)
    with pytest.raises(CheckpointError, match="bad.ckpt lacks .* 'visual'"):
        model.load_stage1(bad)
    spec = stage1.hparams["net"]
    wrong = {**dict(stage1.hparams), "net": {**spec, "init_args": {**spec["init_args"], "backbone": "vgg16"}}}
    torch.save({"state_dict": stage1.state_dict(), "hyper_parameters": wrong}, bad)
    with pytest.raises(CheckpointError, match="backbone"):
        model.load_stage1(bad)
    with pytest.raises(CheckpointError, match="not found"):
        model.load_stage1(tmp_path / "nope.ckpt")


def test_table5_switches_validated():
    from grounding.vgbert.finetune import RelationalLosses

    with pytest.raises(ValueError, match="enable at least one"):
        _tiny_module(losses=RelationalLosses(use_loss_rel=False, use_loss_obj=False, use_object_loss=False))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        _tiny_module(losses=RelationalLosses(temperature=0.0))


def test_labels_must_fit_the_network():
    from grounding.vgbert.finetune import RelationalFinetune

    net = _tiny_module().model  # sized for 2 relations / 3 object classes
    with pytest.raises(ValueError, match="scores 2 relations / 3 object classes but 3 / 3 labels"):
        RelationalFinetune(net, ["on", "near", "under"], ["a", "b", "c"])
    with pytest.raises(ValueError, match="at least 2 relation labels"):
        RelationalFinetune(net, ["on"], ["a", "b", "c"])


def test_encode_words_deduplicates_exactly():
    from grounding.vgbert.relational import VGBertRelational

    torch.manual_seed(0)
    m = VGBertRelational(2, 3, text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None,
                         visual_heads=2, image_size=64).eval()
    ids = torch.tensor([[101, 2158, 102, 0], [101, 3797, 2829, 102], [101, 2158, 102, 0]])
    mask = (ids != 0).long()
    words, wmask = m.encode_words(ids, mask)
    direct = m.language(ids, mask)
    assert torch.allclose(words, direct, atol=1e-5)
    assert wmask.tolist() == [[False, True, False, False], [False, True, True, False], [False, True, False, False]]


def test_drop_loss_selects_a_table5_row():
    from grounding.vgbert.finetune import RelationalLosses

    m = _tiny_module(losses=RelationalLosses(drop_loss="aux"), relation_labels=["on", "near"], object_classes=["a", "b"])
    assert (m.losses.use_loss_rel, m.losses.use_loss_obj, m.losses.use_object_loss) == (True, True, False)
    # recorded as trained, a plain mapping: the checkpoint rebuilds the same terms
    assert m.hparams.losses == {**dataclasses.asdict(RelationalLosses(drop_loss="aux")), "use_object_loss": False}
    # a checkpoint of before the group holds its fields flat: they move into it
    flat = _tiny_module(drop_loss="rel", temperature=0.5, relation_labels=["on", "near"], object_classes=["a", "b"])
    assert (flat.losses.use_loss_rel, flat.losses.temperature) == (False, 0.5)
    with pytest.raises(ValueError, match="drop_loss"):
        _tiny_module(losses=RelationalLosses(drop_loss="everything"))


# ------------------------------------------------------------------------------ location signal (issue #3)
def _location_r2(tokens: torch.Tensor) -> float:
    """R^2 of a linear probe token -> (row, col) of its grid cell: fit on half the images, scored on the rest."""
    b, h, w, d = tokens.shape
    rows, cols = torch.meshgrid(torch.arange(h, dtype=torch.float), torch.arange(w, dtype=torch.float), indexing="ij")
    target = torch.stack([rows, cols], -1).expand(b, h, w, 2)
    x = torch.cat([tokens, torch.ones(b, h, w, 1)], -1)
    half = b // 2
    coef = torch.linalg.lstsq(x[:half].reshape(-1, d + 1), target[:half].reshape(-1, 2)).solution
    pred, t = x[half:].reshape(-1, d + 1) @ coef, target[half:].reshape(-1, 2)
    return float(1 - ((pred - t) ** 2).sum() / ((t - t.mean(0)) ** 2).sum())


@pytest.mark.parametrize("content_scale", [1.0, 50.0])
def test_visual_tokens_encode_their_location_whatever_the_backbone_scale(content_scale):
    """Spatial relations (left of / above ...) need the location in the visual tokens. The embedded
    content is layer-normalised and PE(x, y) starts on a comparable scale (std 0.5), so the
    self-attention layer's output still encodes the location; the old setup (PE std 0.02 added to
    the raw embedder output) did not, and stage-2 relation accuracy stayed at the majority class."""
    from grounding.vgbert.streams import VisualStream

    torch.manual_seed(0)
    vs = VisualStream(32, "tiny_cnn", None, num_heads=4, image_size=64).eval()
    features = content_scale * torch.rand(64, vs.in_channels, 4, 4)  # post-ReLU-like maps of any magnitude
    with torch.no_grad():
        assert _location_r2(vs(features=features)) > 0.35  # measured 0.52 / 0.49
        # The failure mode this guards against: a tiny encoding next to unnormalised content.
        vs.embed_norm = torch.nn.Identity()
        vs.position.normal_(0.0, 0.02)
        assert _location_r2(vs(features=features * 20 / content_scale)) < 0.2  # measured -0.05



# ------------------------------------------------------------------------------ spatial additions (issue #3)
def test_attention_centroid_hand_computed():
    from grounding.vgbert.relational import attention_centroid, grid_coordinates

    # 2 x 3 grid, row-major like a flattened (h, w) map: cell centres x in {-2/3, 0, 2/3}, y in {-1/2, 1/2}.
    assert torch.allclose(grid_coordinates(2, 3), torch.tensor(
        [[-2 / 3, -0.5], [0.0, -0.5], [2 / 3, -0.5], [-2 / 3, 0.5], [0.0, 0.5], [2 / 3, 0.5]]))
    attn = torch.tensor([[0, 0, 1, 0, 0, 0],           # top-right cell
                         [0.5, 0, 0, 0, 0, 0.5],       # top-left and bottom-right: the centre
                         [0, 0, 0, 0.25, 0.75, 0.0]])  # bottom row: x = 0.25 * -2/3, y = 1/2
    expected = torch.tensor([[2 / 3, -0.5], [0.0, 0.0], [-1 / 6, 0.5]])
    assert torch.allclose(attention_centroid(attn, 2, 3), expected, atol=1e-6)


def _identity_attention(width: int, key_position: str) -> CrossModalAttention:
    att = CrossModalAttention(width, num_heads=1, key_position=key_position)
    with torch.no_grad():
        for lin in (att.query, att.key, att.value):
            lin.weight.copy_(torch.eye(width))
            lin.bias.zero_()
    return att


@pytest.mark.parametrize("key_position", ["none", "keys_values"])
def test_grounded_object_encodes_its_location_with_location_aware_values(key_position):
    """An object (a distinct feature) placed in each cell of a 5x5 map in turn; its description's
    query retrieves it. With the paper's keys/values the grounded vector is the same wherever the
    object is (no location, R^2 ~ 0); with ``key_position="keys_values"`` it linearly encodes the
    cell, and the attention centroid lands on the cell in both cases."""
    d, side = 32, 5
    torch.manual_seed(0)
    feature = torch.randn(d)
    feature = 6 * d ** 0.25 * feature / feature.norm()  # dominates the empty cells' zero keys
    att = _identity_attention(d, key_position).eval()
    n = side * side
    visual = torch.zeros(n, side, side, d)
    visual.view(n, n, d)[torch.arange(n), torch.arange(n)] = feature  # image i: the object at cell i
    words = feature.expand(n, 1, d)
    with torch.no_grad():
        out = att(visual, words, torch.ones(n, 1, dtype=torch.bool), torch.arange(n), return_centroid=True)
    from grounding.vgbert.relational import grid_coordinates

    cells = grid_coordinates(side, side)
    assert torch.allclose(out["centroid"], cells, atol=0.05)  # attention lands on the object
    x = torch.cat([out["grounded"], torch.ones(n, 1)], 1)
    coef = torch.linalg.lstsq(x, cells).solution
    r2 = float(1 - ((x @ coef - cells) ** 2).sum() / ((cells - cells.mean(0)) ** 2).sum())
    if key_position == "none":
        assert r2 < 0.1
    else:
        assert r2 > 0.95


def test_spatial_centroid_learns_a_positional_relation():
    """With ``spatial`` = 2 the bilinear relation sees the objects' centroids: a few Adam steps learn
    "left of" / "right of" from them even when the grounded vectors carry no location at all."""
    torch.manual_seed(0)
    n, width = 256, 16
    grounded = torch.randn(2 * n, width)  # content only, independent of position
    centroid = torch.rand(2 * n, 2) * 2 - 1
    subject, object = torch.arange(n), torch.arange(n, 2 * n)
    label = (centroid[subject, 0] > centroid[object, 0]).long()  # 0: left of, 1: right of
    rel = BilinearRelation(width, 2, dim=8, spatial=2)
    opt = torch.optim.Adam(rel.parameters(), lr=3e-2)
    for _ in range(150):
        opt.zero_grad()
        loss = F.cross_entropy(rel(*rel.project(grounded, subject, object, centroid)), label)
        loss.backward()
        opt.step()
    with torch.no_grad():
        acc = (rel(*rel.project(grounded, subject, object, centroid)).argmax(-1) == label).float().mean()
    assert acc > 0.9
    with pytest.raises(ValueError, match="spatial descriptor"):
        rel.project(grounded, subject, object)


def test_spatial_switches_validated_and_paper_config_off():
    with pytest.raises(ValueError, match="key_position"):
        CrossModalAttention(32, 4, key_position="values")
    from grounding.cli import resolved_config
    from grounding.paths import EXPERIMENTS_DIR

    paper = resolved_config(EXPERIMENTS_DIR / "vgbert" / "stage2_paper.yaml")["model"]["init_args"]["net"]["init_args"]
    assert paper["relation"]["key_position"] == "none" and paper["relation"]["spatial_centroid"] is False
    tiny = resolved_config(EXPERIMENTS_DIR / "vgbert" / "stage2_tiny.yaml")["model"]["init_args"]["net"]["init_args"]
    assert tiny["relation"]["key_position"] == "keys_values" and tiny["relation"]["spatial_centroid"] is True


# ------------------------------------------------------------------------------ the official code's choices (issue 12, item 4)
def _official_relational_losses(scores, logits, predicate, labels, triplet_image, num_images, temperature):
    """The authors' stage-2 losses (yizhen-zhang/VG-Bert, re-stated from steps/traintest.py and
    models/ContrastiveLoss.py's relation_contrastive_loss): per image and per annotated pair, the pair's
    softmax over the batch's pairs of other relations under its own R_p (Loss_obj) and the softmax over
    relations (Loss_rel), summed and divided by the images; the object loss summed over labelled objects / B."""
    loss_pair = loss_relation = 0.0
    for b in range(num_images):
        for n in (triplet_image == b).nonzero().flatten().tolist():
            p = int(predicate[n])
            negatives = [m for m in range(len(predicate)) if int(predicate[m]) != p]
            z = torch.cat([scores[n, p:p + 1], scores[negatives, p]]) / temperature
            loss_pair = loss_pair - torch.log_softmax(z, 0)[0]
            loss_relation = loss_relation - torch.log_softmax(scores[n] / temperature, 0)[p]
    ce = sum(F.cross_entropy(logits[i:i + 1], labels[i:i + 1]) for i in range(len(labels)) if labels[i] >= 0)
    return loss_relation / num_images, loss_pair / num_images, ce / num_images


def test_per_image_normalisation_equals_the_official_losses():
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(9, 5, generator=g, dtype=torch.float64)
    logits = torch.randn(7, 4, generator=g, dtype=torch.float64)
    predicate = torch.tensor([0, 1, 1, 2, 4, 3, 0, 2, 1])
    triplet_image = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 2])  # 3 images with 4, 2 and 3 annotated pairs
    subject, object = torch.arange(9), torch.arange(9) + 9  # one predicate per pair, as the official matrix
    labels = torch.tensor([1, -1, 0, 3, 2, 2, -1])
    ours = relational_losses(scores, logits, subject, object, predicate, labels, temperature=0.5,
                             mask_same_pair=False, normalisation="image", num_images=3)
    rel, obj, cls = _official_relational_losses(scores, logits, predicate, labels, triplet_image, 3, 0.5)
    assert ours["loss_rel"].item() == pytest.approx(rel.item(), rel=1e-12)
    assert ours["loss_obj"].item() == pytest.approx(obj.item(), rel=1e-12)
    assert ours["loss_cls"].item() == pytest.approx(cls.item(), rel=1e-12)
    # Per triplet: the same terms averaged instead (9 triplets, 5 labelled objects).
    mean = relational_losses(scores, logits, subject, object, predicate, labels, temperature=0.5, mask_same_pair=False)
    assert mean["loss_rel"].item() == pytest.approx(rel.item() * 3 / 9, rel=1e-12)
    assert mean["loss_cls"].item() == pytest.approx(cls.item() * 3 / 5, rel=1e-12)
    with pytest.raises(ValueError, match="num_images"):
        relational_losses(scores, logits, subject, object, predicate, labels, normalisation="image")
    with pytest.raises(ValueError, match="normalisation"):
        relational_losses(scores, logits, subject, object, predicate, labels, normalisation="batch", num_images=3)


def test_shared_object_transform_maps_subject_and_object_into_one_space():
    torch.manual_seed(0)
    rel = BilinearRelation(width=8, num_relations=3, dim=4, shared_transform=True)
    assert not hasattr(rel, "subject_map") and isinstance(rel.object_transform, torch.nn.Linear)
    grounded = torch.randn(5, 8)
    r_s, r_o = rel.project(grounded, torch.tensor([0, 1, 2]), torch.tensor([1, 0, 4]))
    # An object has one representation whatever its role: object 1 as subject (row 1) = as object (row 0).
    assert torch.equal(r_s[1], r_o[0]) and torch.allclose(r_o[0], rel.object_transform(grounded[1]), atol=1e-6)
    # S = r_s R_p r_o^T in that one space (Eq. 3), by hand for relation 2 of triplet 2.
    expected = r_s[2] @ rel.relation_operator[2] @ r_o[2]
    assert torch.allclose(rel(r_s, r_o)[2, 2], expected, atol=1e-6)
    separate = BilinearRelation(width=8, num_relations=3, dim=4)
    assert not hasattr(separate, "object_transform") and {"subject_map", "object_map"} <= set(dict(separate.named_children()))


def test_relation_operator_dropout_in_training_only():
    torch.manual_seed(0)
    rel = BilinearRelation(width=8, num_relations=2, dim=4, operator_dropout=0.5)
    r_s, r_o = torch.randn(6, 4), torch.randn(6, 4)
    clean = bilinear_scores(r_s, r_o, rel.relation_operator)
    assert torch.equal(rel.eval()(r_s, r_o), clean)
    torch.manual_seed(1)
    dropped = rel.train()(r_s, r_o)
    torch.manual_seed(1)  # the same draw on the operators: entries of the normalised R_p zeroed, the rest x 1/(1-p)
    operators = F.dropout(rel.relation_operator, 0.5, True)
    kept = operators != 0
    assert 0 < kept.sum() < kept.numel()
    assert torch.allclose(operators[kept], rel.relation_operator[kept] * 2)
    assert torch.allclose(dropped, bilinear_scores(r_s, r_o, operators), atol=1e-6)
    assert not torch.allclose(dropped, clean)


def test_official_classifier_and_attention_projections():
    head = ObjectClassifier(16, 5, hidden=256, dropout=0.1)  # 768 -> 256 -> ReLU -> Dropout -> classes (official)
    assert [type(m).__name__ for m in head] == ["Linear", "ReLU", "Dropout", "Linear"]
    assert head[0].out_features == 256 and head[2].p == 0.1
    att = CrossModalAttention(16, 4, query_key_bias=False)  # official key_visual / query_language: no bias
    assert att.query.bias is None and att.key.bias is None and att.value.bias is not None


def test_stage2_counts_special_tokens_in_the_pooled_description():
    from grounding.vgbert.relational import RelationHeadOptions, VGBertRelational

    arch = dict(text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None, visual_heads=2, image_size=64)
    ids = torch.tensor([[101, 2158, 102, 0]])
    mask = (ids != 0).long()
    mean = RelationHeadOptions(query_pooling="mean")
    official = VGBertRelational(2, 3, **arch, count_special_tokens=True, relation=mean)
    assert official.encode_words(ids, mask)[1].tolist() == [[True, True, True, False]]
    assert VGBertRelational(2, 3, **arch).encode_words(ids, mask)[1].tolist() == [[False, True, False, False]]


def test_stage2_paper_config_follows_the_official_code_and_tiny_keeps_its_layout():
    from grounding.cli import resolved_config
    from grounding.paths import EXPERIMENTS_DIR
    from grounding.vgbert.relational import VGBertRelational

    paper = resolved_config(EXPERIMENTS_DIR / "vgbert" / "stage2_paper.yaml")
    net = flat_args(VGBertRelational, paper["model"]["init_args"]["net"]["init_args"])
    official = dict(shared_object_transform=True, relation_dropout=0.1, classifier_hidden=256, classifier_dropout=0.1,
                    cross_attention_dropout=0.0, query_key_bias=False, count_special_tokens=True, query_pooling="mean",
                    visual_attention_dropout=0.0, visual_ffn_dropout=0.0, relation_dim=32, dropout=0.1)
    assert {k: net[k] for k in official} == official
    assert paper["model"]["init_args"]["losses"]["loss_normalisation"] == "image"
    assert paper["model"]["init_args"]["init_from"].endswith("stage1_paper/checkpoints/best.ckpt")  # item 5
    assert paper["data"]["init_args"]["split"]["validation"] == "carve"  # item 9: not the official test-split selection
    tiny = resolved_config(EXPERIMENTS_DIR / "vgbert" / "stage2_tiny.yaml")
    tnet = flat_args(VGBertRelational, tiny["model"]["init_args"]["net"]["init_args"])
    assert (tnet["shared_object_transform"], tnet["query_pooling"], tnet["relation_dropout"]) == (False, "tokens", 0.0)
    assert tiny["model"]["init_args"]["losses"]["loss_normalisation"] == "triplet"

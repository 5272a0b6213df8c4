"""The STE's training switches (Eq. 3's label weighting) and its fast paths against the reference forms."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from data_modules.similarity_lists import SimilarityListCollator, SimilarityListsDataModule, label_weights
from data_modules.wordnet_lists import SimilarityLists


def _keyed_lists() -> SimilarityLists:
    # anchor bag.n.01.bag: synonym bag.n.01.sack (1.0), hypernym container.n.01.container (0.9),
    # hyponym purse.n.01.purse (0.85); anchor sack lists bag (1.0) and container (0.9)
    return SimilarityLists.from_mapping({
        "bag.n.01.bag": [("bag.n.01.sack", 1.0), ("container.n.01.container", 0.9), ("purse.n.01.purse", 0.85)],
        "bag.n.01.sack": [("bag.n.01.bag", 1.0), ("container.n.01.container", 0.9)],
    })


def test_synonym_mask_is_the_anchors_synset():
    lists = _keyed_lists()
    assert lists.synonym_mask().tolist() == [True, False, False, True, False]
    # a lemma name with dots (WordNet has 'H._pylori') still belongs to its synset
    dotted = SimilarityLists.from_mapping({"h.n.01.Helicobacter": [("h.n.01.H._pylori", 0.5), ("h.n.02.H", 1.0)]})
    assert dotted.synonym_mask().tolist() == [True, False]
    # plain-word curated lists: a synonym is a member scored 1
    plain = SimilarityLists.from_mapping({"bag": [("sack", 1.0), ("container", 0.9)]})
    assert plain.synonym_mask().tolist() == [True, False]


@pytest.mark.parametrize("weighting, w, expected", [
    ("score", 1.0, [1.0, 0.9, 0.85, 1.0, 0.9]),
    ("uniform", 1.0, [1.0, 1.0, 1.0, 1.0, 1.0]),
    ("score", 0.5, [1.0, 0.45, 0.425, 1.0, 0.45]),
    ("uniform", 0.0, [1.0, 0.0, 0.0, 1.0, 0.0]),
    ("uniform", 2.0, [1.0, 2.0, 2.0, 1.0, 2.0]),
])
def test_label_weights(weighting, w, expected):
    assert label_weights(_keyed_lists(), weighting, w).tolist() == pytest.approx(expected)


def test_collator_applies_the_weighting_and_keeps_zero_weight_members():
    lists = _keyed_lists()
    batch = SimilarityListCollator(lists, positive_weighting="uniform", non_synonym_weight=0.0, dense_targets=True)([0])
    cand = [lists.vocab[i] for i in batch["candidates"]]
    # the zero-weight neighbours are still encoded (denominator terms), with Y = 0
    assert set(cand) == {"bag.n.01.bag", "bag.n.01.sack", "container.n.01.container", "purse.n.01.purse"}
    y = dict(zip(cand, batch["targets"][0].tolist()))
    assert y == {"bag.n.01.bag": 0.0, "bag.n.01.sack": 1.0, "container.n.01.container": 0.0, "purse.n.01.purse": 0.0}
    default = SimilarityListCollator(lists, dense_targets=True)([0])
    assert default["targets"][0].tolist() == pytest.approx(
        [{"bag.n.01.sack": 1.0, "container.n.01.container": 0.9, "purse.n.01.purse": 0.85}.get(lists.vocab[i], 0.0)
         for i in default["candidates"]])


def test_bad_switches_fail_early():
    with pytest.raises(ValueError, match="positive_weighting"):
        SimilarityListsDataModule(positive_weighting="softmax")
    with pytest.raises(ValueError, match="non_synonym_weight"):
        SimilarityListsDataModule(non_synonym_weight=-1.0)


def test_switches_from_the_command_line():
    from grounding.cli import resolved_config
    from grounding.stage_config import ConfigError

    cfg = resolved_config("experiments/semclip/ste_wordnet.yaml",
                          [{"data": {"init_args": {"positive_weighting": "uniform", "non_synonym_weight": 0.25}}}])
    assert cfg["data"]["init_args"]["positive_weighting"] == "uniform"
    assert cfg["data"]["init_args"]["non_synonym_weight"] == 0.25
    default = resolved_config("experiments/semclip/ste_wordnet.yaml")["data"]["init_args"]
    assert default["positive_weighting"] == "score" and default["non_synonym_weight"] == 1.0
    with pytest.raises(ConfigError):
        resolved_config("experiments/semclip/ste_wordnet.yaml", [{"data": {"init_args": {"positive_weighting": "flat"}}}])


# ------------------------------------------------------------------------------------------
# The list form of Eq. 3 against the dense form
# ------------------------------------------------------------------------------------------
def _random_list_batch(generator, n_anchors=7, n_candidates=23, zero_weights=True, dtype=torch.float64):
    from data_modules.similarity_lists import dense_targets

    anchor_position = torch.randperm(n_candidates, generator=generator)[:n_anchors]
    owner, position = [], []
    for i in range(n_anchors):  # each anchor lists 1-6 other candidates (unique pairs, never itself)
        others = torch.tensor([c for c in torch.randperm(n_candidates, generator=generator).tolist()
                               if c != anchor_position[i]])
        k = int(torch.randint(1, 7, (1,), generator=generator))
        owner += [i] * k
        position += others[:k].tolist()
    weight = torch.rand(len(owner), generator=generator, dtype=dtype) * 0.4 + 0.6
    if zero_weights:  # non_synonym_weight = 0 leaves zero-weight members in the lists
        weight[::4] = 0.0
    batch = {"anchors": anchor_position, "candidates": torch.arange(n_candidates), "anchor_position": anchor_position,
             "member_owner": torch.tensor(owner), "member_position": torch.tensor(position), "member_weight": weight}
    return batch, dense_targets(batch)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("temperature", [0.05, 0.5])
def test_list_form_equals_the_dense_loss(reduction, temperature):
    from grounding.semclip.ste_loss import list_contrastive_loss, multi_positive_contrastive_loss

    g = torch.Generator().manual_seed(int(temperature * 100) + len(reduction))
    batch, targets = _random_list_batch(g)
    z = torch.randn(23, 5, generator=g, dtype=torch.float64)
    grads = []
    for form in ("dense", "list"):
        zz = z.clone().requires_grad_()
        anchor_z = zz[batch["anchor_position"]]
        if form == "dense":
            loss = multi_positive_contrastive_loss(anchor_z, zz, targets, temperature,
                                                   anchor_position=batch["anchor_position"], reduction=reduction)
        else:
            loss = list_contrastive_loss(anchor_z, zz, batch["anchor_position"], batch["member_owner"],
                                         batch["member_position"], batch["member_weight"], temperature, reduction=reduction)
        weights = torch.linspace(0.5, 1.5, loss.numel(), dtype=torch.float64).reshape(loss.shape)
        (loss * weights).sum().backward()
        grads.append((loss.detach(), zz.grad))
    (dense, g_dense), (listed, g_list) = grads
    assert torch.allclose(listed, dense, rtol=1e-12, atol=1e-12)
    assert torch.allclose(g_list, g_dense, rtol=1e-10, atol=1e-12)


def test_list_form_gradcheck():
    from grounding.semclip.ste_loss import list_contrastive_loss

    g = torch.Generator().manual_seed(3)
    batch, _ = _random_list_batch(g, n_anchors=3, n_candidates=6)
    a = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    c = torch.randn(6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    args = (batch["anchor_position"], batch["member_owner"], batch["member_position"], batch["member_weight"], 0.3)
    assert torch.autograd.gradcheck(lambda a, c: list_contrastive_loss(a, c, *args, reduction="none"), (a, c))
    assert torch.autograd.gradcheck(lambda a, c: list_contrastive_loss(a, c, *args, normalize=False), (a, c))


def test_list_form_in_float32_matches_float64():
    from grounding.semclip.ste_loss import list_contrastive_loss, multi_positive_contrastive_loss

    g = torch.Generator().manual_seed(5)
    batch, targets = _random_list_batch(g, n_anchors=40, n_candidates=300, zero_weights=False)
    z = torch.randn(300, 16, generator=g, dtype=torch.float64)
    ref = multi_positive_contrastive_loss(z[batch["anchor_position"]], z, targets, 0.05,
                                          anchor_position=batch["anchor_position"], reduction="none")
    z32 = z.float()
    got = list_contrastive_loss(z32[batch["anchor_position"]], z32, batch["anchor_position"], batch["member_owner"],
                                batch["member_position"], batch["member_weight"].float(), 0.05, reduction="none")
    assert torch.allclose(got.double(), ref, rtol=1e-5)


# ------------------------------------------------------------------------------------------
# The row-sparse Adam against torch's SparseAdam, and the training step against the old one
# ------------------------------------------------------------------------------------------
def test_row_sparse_adam_equals_sparse_adam():
    from grounding.semclip.ste import RowSparseAdam

    torch.manual_seed(0)
    embeddings = [torch.nn.Embedding(50, 6, sparse=True) for _ in range(2)]
    embeddings[1].load_state_dict(embeddings[0].state_dict())
    opts = [torch.optim.SparseAdam(embeddings[0].parameters(), lr=0.05),
            RowSparseAdam(embeddings[1].parameters(), lr=0.05)]
    for _step in range(6):
        ids = torch.randint(0, 50, (30,))  # repeated ids: the autograd gradient is uncoalesced
        target = torch.randn(30, 6)
        for emb, opt in zip(embeddings, opts):
            opt.zero_grad()
            ((emb(ids) - target) ** 2).sum().backward()
            opt.step()
        assert torch.allclose(embeddings[1].weight, embeddings[0].weight, rtol=1e-5, atol=1e-6)
    s0, s1 = (o.state_dict()["state"][0] for o in opts)
    assert s0["step"] == s1["step"] == 6
    assert torch.allclose(s1["exp_avg"], s0["exp_avg"], atol=1e-7)
    assert torch.allclose(s1["exp_avg_sq"], s0["exp_avg_sq"], atol=1e-7)


def test_training_step_equals_the_old_step():
    """One training step (row gather, list form, RowSparseAdam) moves every parameter as the old step
    did (nn.Embedding's sparse autograd, the dense Y, torch's SparseAdam)."""
    from data_modules.similarity_lists import SimilarityListCollator
    from grounding.semclip.ste import SemanticTextEmbedding, STEEncoder

    lists = SimilarityLists.from_mapping({f"w{i}": [(f"w{(i + k) % 40}", 1.0 - 0.05 * k) for k in range(1, 5)]
                                          for i in range(40)})
    torch.manual_seed(0)
    new = SemanticTextEmbedding(STEEncoder(40, encoding_size=8), embedding_lr=0.05)
    old = SemanticTextEmbedding(STEEncoder(40, encoding_size=8), embedding_lr=0.05)
    old.load_state_dict(new.state_dict())
    new_opts = new.configure_optimizers()
    old_opts = [torch.optim.SparseAdam(list(old.model.embedding.parameters()), lr=0.05),
                torch.optim.Adam([p for n, p in old.model.named_parameters() if not n.startswith("embedding.")], lr=1e-3)]
    new.optimizers = lambda: new_opts  # the LightningModule's hooks without a Trainer
    new.manual_backward = lambda loss: loss.backward()
    new.log = lambda *a, **k: None
    collate, dense_collate = SimilarityListCollator(lists), SimilarityListCollator(lists, dense_targets=True)
    for step in range(3):
        rows = np.random.default_rng(step).permutation(40)[:9]
        new.training_step(collate(rows), step)
        for o in old_opts:
            o.zero_grad()
        old.batch_loss(dense_collate(rows)).backward()
        for o in old_opts:
            o.step()
    for (name, p_new), p_old in zip(new.model.named_parameters(), old.model.parameters()):
        assert torch.allclose(p_new, p_old, rtol=1e-5, atol=1e-6), name


# ------------------------------------------------------------------------------------------
# The oneDNN GEMMs against torch's
# ------------------------------------------------------------------------------------------
def test_mm_nt_equals_torch_mm():
    from grounding.semclip.ste_loss import mm_nt

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(37, 19, generator=g), torch.randn(23, 19, generator=g), torch.randn(23, generator=g)
    assert torch.allclose(mm_nt(x, w), x @ w.T, rtol=1e-5, atol=1e-5)
    assert torch.allclose(mm_nt(x, w, b, relu=True), torch.relu(x @ w.T + b), rtol=1e-5, atol=1e-5)
    y = torch.randn(37, 5, generator=g)
    assert torch.allclose(mm_nt(x.T, y.T), x.T @ y, rtol=1e-5, atol=1e-5)  # strided views
    with pytest.raises(RuntimeError):
        mm_nt(x, y)  # shapes that do not multiply: torch's error
    assert torch.equal(mm_nt(x.double(), w.double()), x.double() @ w.double().T)  # float64: torch.mm


def test_linear_relu_equals_nn_linear_relu():
    from grounding.semclip.ste_loss import linear_relu

    torch.manual_seed(0)
    layer = torch.nn.Linear(12, 9)
    ref = torch.nn.Sequential(torch.nn.Linear(12, 9), torch.nn.ReLU())
    ref[0].load_state_dict(layer.state_dict())
    x = torch.randn(50, 12)
    for f, lin in ((lambda t: linear_relu(t, layer), layer), (ref, ref[0])):
        xx = x.clone().requires_grad_()
        out = f(xx)
        (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
        lin.grads = (out.detach(), xx.grad, lin.weight.grad, lin.bias.grad)
    for got, want in zip(layer.grads, ref[0].grads):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    assert linear_relu(torch.randn(2, 3, 12), layer).shape == (2, 3, 9)
    xd = x.double().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: linear_relu(t, layer.double()), (xd[:4],))


def test_checkpoint_vocabulary_old_and_new_layout():
    from grounding.semclip.ste import SemanticTextEmbedding, STEEncoder

    module = SemanticTextEmbedding(STEEncoder(3, encoding_size=4))
    module.vocab = ["a.n.01.a", "b.n.01.b_c", "c.n.02.H._pylori"]
    ckpt = {}
    module.on_save_checkpoint(ckpt)
    assert isinstance(ckpt["ste_vocab"], str)
    fresh = SemanticTextEmbedding(STEEncoder(3, encoding_size=4))
    fresh.on_load_checkpoint(ckpt)
    assert fresh.vocab == module.vocab
    fresh.on_load_checkpoint({"ste_vocab": list(module.vocab)})  # a checkpoint written before
    assert fresh.vocab == module.vocab
    fresh.on_load_checkpoint({})
    assert fresh.vocab is None

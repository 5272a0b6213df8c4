"""Eq. 3 on a 4-word toy vocabulary against a hand computation."""

from __future__ import annotations

import math

import pytest
import torch

from grounding.semclip.ste_loss import multi_positive_contrastive_loss


def test_four_word_vocabulary_by_hand():
    # unit vectors: cosines are exact and easy to write down
    z = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [-1.0, 0.0]])
    tau = 0.5
    # anchor 0 ("basket") with list {1: 0.9, 2: 0.5}; anchor 2 with list {1: 1.0}
    targets = torch.tensor([[0.0, 0.9, 0.5, 0.0], [0.0, 1.0, 0.0, 0.0]])
    anchors = torch.tensor([0, 2])
    loss = multi_positive_contrastive_loss(z[anchors], z, targets, tau, anchor_position=anchors, reduction="none")

    def by_hand(i, lst):
        cos = [sum(a * b for a, b in zip(z[i].tolist(), z[a].tolist())) for a in range(4)]
        denom = sum(math.exp(cos[a] / tau) for a in range(4) if a != i)  # the anchor itself is masked
        return -sum(w * math.log(math.exp(cos[j] / tau) / denom) for j, w in lst.items())

    expected = [by_hand(0, {1: 0.9, 2: 0.5}), by_hand(2, {1: 1.0})]
    assert loss.tolist() == pytest.approx(expected, rel=1e-6)
    # anchor 0: cos = [1, .6, 0, -1]; denominators without self: e^1.2 + e^0 + e^-2
    d = math.exp(1.2) + 1 + math.exp(-2)
    assert expected[0] == pytest.approx(-(0.9 * (1.2 - math.log(d)) + 0.5 * (0.0 - math.log(d))))
    mean = multi_positive_contrastive_loss(z[anchors], z, targets, tau, anchor_position=anchors)
    assert mean.item() == pytest.approx(sum(expected) / 2, rel=1e-6)


def test_normalisation_and_gradient_direction():
    torch.manual_seed(0)
    z = torch.randn(4, 3, requires_grad=True)
    targets = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    loss = multi_positive_contrastive_loss(z[:1], z, targets, 0.05, anchor_position=torch.tensor([0]))
    scaled = multi_positive_contrastive_loss(3 * z[:1], 2 * z, targets, 0.05, anchor_position=torch.tensor([0]))
    assert loss.item() == pytest.approx(scaled.item(), rel=1e-5)  # cosine logits: scale invariant
    loss.backward()
    # descending the gradient raises the anchor-positive cosine
    z2 = (z - 1e-3 * z.grad).detach()
    cos = lambda a, b: torch.nn.functional.cosine_similarity(a, b, dim=0)
    assert cos(z2[0], z2[1]) > cos(z.detach()[0], z.detach()[1])


def test_bad_reduction():
    with pytest.raises(ValueError, match="reduction"):
        multi_positive_contrastive_loss(torch.ones(1, 2), torch.ones(2, 2), torch.ones(1, 2), reduction="avg")

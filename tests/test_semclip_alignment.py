"""SemCLIP §4: Eq. 7 projection, Eq. 8 transform, caption targets, index and stability metrics."""

from __future__ import annotations

import pytest
import torch

from grounding.semclip.alignment import (
    VLM,
    AlignmentTransform,
    SemanticIndex,
    caption_nouns,
    disambiguate,
    fit_alignment,
    overlap_at_k,
    recovery_error,
    retrieval_scores,
    semclip_project_images,
)
from grounding.semclip.vlm import HFCLIP


def test_eq7_image_takes_the_transform_of_its_nearest_text():
    text_vlm = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.2]])
    transform = AlignmentTransform(in_dim=2, out_dim=3, hidden=8)
    text_semclip = transform(text_vlm).detach()
    images = torch.tensor([[0.1, 2.0], [3.0, 0.5], [-0.5, 0.0]])  # nearest texts by cosine: 1, 0, 2
    projected, nearest = semclip_project_images(images, text_vlm, text_semclip)
    assert nearest.tolist() == [1, 0, 2]
    assert torch.equal(projected, text_semclip[[1, 0, 2]])


def test_eq8_shapes_and_fit_recovers_targets():
    torch.manual_seed(0)
    t = AlignmentTransform()  # paper scale: 512 -> 4096 -> 4096 -> 300
    assert [m.out_features for m in t.net if isinstance(m, torch.nn.Linear)] == [4096, 4096, 300]
    x, y = torch.randn(64, 8), torch.randn(64, 5)
    small = AlignmentTransform(8, 5, hidden=64)
    losses = fit_alignment(small, x, y, epochs=150, batch_size=16, lr=3e-3)
    assert losses[-1] < 0.1 * losses[0]
    with torch.no_grad():
        assert recovery_error(small(x), y) == 0.0
    assert recovery_error(torch.stack([y[1], y[0]]), y[:2]) == 1.0


def test_index_overlap_and_retrieval_metrics():
    vecs = torch.tensor([[1.0, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]])
    idx = SemanticIndex(vecs)
    _, top = idx.search(torch.tensor([[1.0, 0.05]]), k=2)
    assert top.tolist() == [[0, 1]]
    q = torch.tensor([[0, 1], [2, 3]])
    syn = torch.tensor([[[1, 0], [0, 2]], [[3, 2], [1, 0]]])
    assert overlap_at_k(q, syn) == pytest.approx((1 + 0.5 + 1 + 0) / 4)
    scores = torch.tensor([[0.9, 0.8, 0.1], [0.2, 0.3, 0.9]])
    rel = torch.tensor([[True, False, True], [False, False, True]])
    m = retrieval_scores(scores, rel, k=2)
    assert m["recall@2"] == pytest.approx((0.5 + 1.0) / 2)
    assert m["map"] == pytest.approx(((1 + 2 / 3) / 2 + 1.0) / 2)
    with pytest.raises(ValueError, match="backend"):
        SemanticIndex(vecs, backend="annoy")


def test_caption_nouns_and_lesk():
    from grounding.lexicon import wordnet

    wn = wordnet()
    nouns = caption_nouns("A man eating a hot dog next to two fire hydrants", wn)
    assert "hot dog" in nouns and "fire hydrant" in nouns and "man" in nouns
    assert "a" not in nouns and "two" not in nouns
    key = disambiguate("dog", ["a", "dog", "barks"], wn)
    assert key.startswith("dog.n.") or key.split(".")[-1] == "dog"


def test_vlm_protocol_and_missing_clip(tmp_path):
    class Toy:
        def encode_image(self, images):
            return images.flatten(1)[:, :4]

        def encode_text(self, texts):
            return torch.zeros(len(texts), 4)

    assert isinstance(Toy(), VLM)
    with pytest.raises(FileNotFoundError, match="No CLIP weights"):
        HFCLIP(str(tmp_path / "absent"))

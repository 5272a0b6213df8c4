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
    # the k-nearest ablation: the mean of Γ_t of the 2 nearest texts (cosines worked out by hand: 1 then 2; 0 then 1;
    # 2 then 1), the nearest still reported first
    projected, nearest = semclip_project_images(images, text_vlm, text_semclip, neighbours=2)
    assert nearest.tolist() == [1, 0, 2]
    expected = torch.stack([text_semclip[[1, 2]].mean(0), text_semclip[[0, 1]].mean(0), text_semclip[[2, 1]].mean(0)])
    assert torch.allclose(projected, expected)
    with pytest.raises(ValueError, match="image_neighbours"):
        semclip_project_images(images, text_vlm, text_semclip, neighbours=4)


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


def _doc(text):
    from grounding.semclip.alignment import pos_tagger

    return pos_tagger()(text)


def test_caption_nouns_by_pos_with_wordnet_compounds():
    from grounding.lexicon import wordnet

    wn = wordnet()
    # issue 15's examples: colours and verbs are not nouns (the WordNet lookup took "black", "standing")
    assert caption_nouns(_doc("A man in a black coat standing next to a hamper"), wn) == ["man", "coat", "hamper"]
    nouns = caption_nouns(_doc("A man eating a hot dog next to two fire hydrants"), wn)
    assert nouns == ["man", "hot dog", "fire hydrant"]
    assert caption_nouns(_doc("Two dogs playing with a ball on the grass"), wn) == ["dog", "ball", "grass"]
    # the prompt's depiction noun is not content; a picture on a wall is
    assert caption_nouns(_doc("A photo of a car"), wn) == ["car"]
    assert caption_nouns(_doc("A picture on the wall"), wn) == ["picture", "wall"]
    # nouns outside WordNet stay, for the lexical-variant step
    assert caption_nouns(_doc("A boy takes a selfie at the skatepark"), wn) == ["boy", "selfie", "skatepark"]


def test_senses_default_when_lesk_has_no_evidence():
    from grounding.lexicon import wordnet
    from grounding.semclip.alignment import content_words

    wn = wordnet()
    context = content_words(_doc("A photo of a X"))
    expected = {"car": "car.n.01.car", "coat": "coat.n.01.coat", "ball": "ball.n.01.ball", "hamper": "hamper.n.02.hamper",
                "automobile": "car.n.01.automobile"}  # plain Lesk: railcar, coating, Lucille Ball, shackle
    for noun, key in expected.items():
        assert disambiguate(noun, context, wn) == key, noun
    # the paper's synonym pair lands on one synset
    assert disambiguate("car", context, wn).rsplit(".", 1)[0] == disambiguate("automobile", context, wn).rsplit(".", 1)[0]
    # content-word evidence still chooses: a dog that barks is the animal, a bank by the river the sloping land
    assert disambiguate("dog", content_words(_doc("a dog barks")), wn).startswith("dog.n.01")
    assert disambiguate("bank", content_words(_doc("children sit on the bank of the river")), wn).startswith("bank.n.01")


def test_query_targets_use_content_nouns_and_map_words_outside_the_ste(tmp_path):
    from semclip_helpers import tiny_world_ste

    from grounding.semclip.alignment import CaptionTargets
    from grounding.semclip.ste import STEEmbedding

    ste = STEEmbedding.load(tiny_world_ste(tmp_path / "ste"))
    asked = []

    def lexical(words):
        asked.extend(words)
        return ["ball.n.03.ball" if w == "selfie" else None for w in words]

    targets = CaptionTargets(ste, lexical=lexical)
    assert targets.keys("A photo of a ball") == targets.keys("A ball")  # the prompt word adds nothing
    keys = targets.keys("A boy takes a selfie at the skatepark")
    assert "selfie" in asked and "skatepark" in asked and keys[-1] == "ball.n.03.ball"


def test_vlm_protocol_and_missing_clip(tmp_path):
    class Toy:
        def encode_image(self, images):
            return images.flatten(1)[:, :4]

        def encode_text(self, texts):
            return torch.zeros(len(texts), 4)

    assert isinstance(Toy(), VLM)
    with pytest.raises(FileNotFoundError, match="No CLIP weights"):
        HFCLIP(str(tmp_path / "absent"))


def test_transform_refused_through_another_vlm_than_it_was_fitted_on(tmp_path):
    """Γ_t maps one VLM's text space: a row or command that queries it through another checkpoint (e.g. the same
    model's last epoch when Γ_t was fitted on the dev-best) is refused with one line naming both."""
    import os
    import shutil

    from grounding.semclip.alignment import AlignmentMismatchError, check_fitted_vlm

    best, last = tmp_path / "best-epoch012.ckpt", tmp_path / "last.ckpt"
    best.write_bytes(b"dev-best weights")
    last.write_bytes(b"last-epoch weight")
    os.link(best, tmp_path / "best.ckpt")  # what `make` links
    shutil.copy(best, tmp_path / "copy.ckpt")
    fitted = {"vlm": f"suite:{tmp_path / 'best.ckpt'}"}
    for same in (best, tmp_path / "best.ckpt", tmp_path / "copy.ckpt"):
        check_fitted_vlm(fitted, f"suite:{same}", "t.pt")  # the same checkpoint: a link or a copy
    with pytest.raises(AlignmentMismatchError) as err:
        check_fitted_vlm(fitted, f"suite:{last}", "t.pt")
    assert str(err.value) == (f"Γ_t t.pt was fitted on the VLM suite:{tmp_path / 'best.ckpt'}, but it is queried "
                              f"through suite:{last}: name the same checkpoint (semclip.vlm) or refit Γ_t on this VLM.")
    with pytest.raises(AlignmentMismatchError):
        check_fitted_vlm(fitted, "hf-clip:models/clip-vit-base-patch32", "t.pt")
    check_fitted_vlm({"vlm": "hf-clip:models/clip"}, "hf-clip:models/clip", "t.pt")
    check_fitted_vlm({}, f"suite:{last}", "t.pt")  # an unrecorded VLM (an older transform file) cannot be checked
    check_fitted_vlm({"vlm": f"suite:{tmp_path / 'gone.ckpt'}"}, f"suite:{last}", "t.pt")  # nor a vanished one

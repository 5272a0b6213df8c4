"""BERT on real tokens only (grounding.encoders.packed_bert_forward, LanguageStream(packed_tokens=True)):
the same values and gradients as the padded Hugging Face forward at every real token."""

import pytest
import torch

from grounding.encoders import load_text_encoder, load_tokenizer, packed_bert_forward
from grounding.vgbert.streams import LanguageStream

CAPTIONS = ["a dog runs on the grass", "two men", "a child in a red shirt jumps over a wooden fence at the park"]


def _batch():
    enc = load_tokenizer("tiny-random")(CAPTIONS, padding="longest", return_tensors="pt")
    assert (enc["attention_mask"] == 0).any()  # the case that matters: a padded batch
    return enc["input_ids"], enc["attention_mask"]


def _bert():
    torch.manual_seed(0)
    return load_text_encoder("tiny-random").double().eval()


def test_packed_forward_equals_padded_forward_at_real_tokens_and_zero_at_padding():
    bert, (ids, mask) = _bert(), _batch()
    reference = bert(input_ids=ids, attention_mask=mask).last_hidden_state
    packed = packed_bert_forward(bert, ids, mask)
    real = mask.bool()
    assert packed.shape == reference.shape
    torch.testing.assert_close(packed[real], reference[real], rtol=1e-12, atol=1e-12)
    assert packed[~real].abs().max() == 0  # padded positions: 0, not the padded forward's leftovers


def test_packed_forward_gradients_equal_padded_forward():
    bert, (ids, mask) = _bert(), _batch()
    real = mask.bool()
    weights = torch.randn(int(real.sum()), bert.config.hidden_size, dtype=torch.float64)
    params = list(bert.parameters())

    def grads(hidden):
        return torch.autograd.grad((hidden[real] * weights).sum(), params, allow_unused=True)

    reference = grads(bert(input_ids=ids, attention_mask=mask).last_hidden_state)
    packed = grads(packed_bert_forward(bert, ids, mask))
    for r, p in zip(reference, packed):
        assert (r is None) == (p is None)
        if r is not None:
            torch.testing.assert_close(p, r, rtol=1e-10, atol=1e-12)


def test_language_stream_switch_same_values_and_dropout_in_training():
    torch.manual_seed(0)
    stream = LanguageStream("tiny-random", trainable_layers=1, hidden_dropout=0.2, attention_dropout=0.2)
    ids, mask = _batch()
    real = mask.bool()
    stream.eval()
    padded = stream(ids, mask)
    stream.packed_tokens = True
    torch.testing.assert_close(stream(ids, mask)[real], padded[real], rtol=1e-5, atol=1e-6)
    stream.train()  # dropout acts on the packed path too (hidden and attention-probability rates)
    torch.manual_seed(1)
    a = stream(ids, mask)
    torch.manual_seed(2)
    b = stream(ids, mask)
    assert not torch.allclose(a[real], b[real])


def test_packed_forward_refuses_relative_positions():
    bert, (ids, mask) = _bert(), _batch()
    bert.config.position_embedding_type = "relative_key"
    with pytest.raises(ValueError, match="packed_tokens: false"):
        packed_bert_forward(bert, ids, mask)


def test_auto_packs_unless_autocast_lowers_precision(monkeypatch):
    calls = []
    import grounding.encoders as encoders

    def spy(bert, ids, mask, real_tokens=None):
        calls.append(True)
        return bert(input_ids=ids, attention_mask=mask).last_hidden_state

    monkeypatch.setattr(encoders, "packed_bert_forward", spy)  # the one selector: grounding.encoders.bert_hidden_states
    stream = LanguageStream("tiny-random", trainable_layers=1, packed_tokens="auto").eval()
    ids, mask = _batch()
    stream(ids, mask)
    assert calls == [True]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        stream(ids, mask)
    assert calls == [True]  # bf16 autocast: the padded forward (measured faster there)
    with pytest.raises(ValueError, match="packed_tokens"):
        LanguageStream("tiny-random", trainable_layers=1, packed_tokens="yes")

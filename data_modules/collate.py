"""Tokenisation and the caption batches (training: one caption an image; evaluation: every caption, flattened).
"""

from __future__ import annotations

from typing import Sequence

import torch


def tokenize(tokenizer, texts: Sequence[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch-tokenize, truncating to ``max_length`` and padding to the longest in the batch."""
    if len(texts) == 0:
        return torch.zeros(0, 0, dtype=torch.long), torch.zeros(0, 0, dtype=torch.long)
    enc = tokenizer(list(texts), padding="longest", truncation=True, max_length=max_length, return_tensors="pt")
    return enc["input_ids"].long(), enc["attention_mask"].long()


class CaptionTrainCollate:
    """Items ``{image, image_index, caption}`` -> the training batch of contract B."""

    def __init__(self, tokenizer, max_length: int = 32):
        self.tokenizer = tokenizer
        self.max_length = max_length

    def __call__(self, items: list[dict]) -> dict:
        captions = [it["caption"] for it in items]
        input_ids, attention_mask = tokenize(self.tokenizer, captions, self.max_length)
        return {"images": torch.stack([it["image"] for it in items]),
                "input_ids": input_ids, "attention_mask": attention_mask,
                "image_index": torch.tensor([it["image_index"] for it in items], dtype=torch.long),
                "captions": captions}


class CaptionEvalCollate(CaptionTrainCollate):
    """Items ``{image, image_index, captions}`` -> the evaluation batch: captions flattened with
    ``caption_image_index`` (split-level image index of each caption) for retrieval metrics."""

    def __call__(self, items: list[dict]) -> dict:
        image_index = torch.tensor([it["image_index"] for it in items], dtype=torch.long)
        counts = torch.tensor([len(it["captions"]) for it in items], dtype=torch.long)
        captions = [c for it in items for c in it["captions"]]
        input_ids, attention_mask = tokenize(self.tokenizer, captions, self.max_length)
        return {"images": torch.stack([it["image"] for it in items]), "image_index": image_index,
                "input_ids": input_ids, "attention_mask": attention_mask,
                "caption_image_index": torch.repeat_interleave(image_index, counts), "captions": captions}


"""BERT's text stream on real tokens only vs padded to the batch's longest caption, side by side in one run.

Training step of the language stream as stage 1 runs it (top ``--trainable`` layers learnable, dropout 0.1,
fwd + bwd of a loss on the real tokens), on batches whose caption lengths follow Flickr8k's WordPiece length
distribution (measured with the MiniLM tokenizer on 2,000 captions; max_length 32). Interleaved repeats,
medians; outputs checked equal at real tokens in eval mode first.

    python benchmarks/bench_text_stream.py                       # MiniLM (offline), CPU
    python benchmarks/bench_text_stream.py --device cuda --model bert-base --amp bf16   # BERT-base shape, random weights
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a plain script from anywhere
from table_record import add_record_option, write_table_record  # noqa: E402

from grounding.encoders import packed_bert_forward  # noqa: E402

# WordPiece lengths ([CLS] and [SEP] included) of 2,000 Flickr8k captions: {length: count}
FLICKR8K_LENGTHS = {4: 2, 5: 2, 6: 15, 7: 22, 8: 51, 9: 97, 10: 133, 11: 182, 12: 196, 13: 211, 14: 217, 15: 193,
                    16: 180, 17: 135, 18: 80, 19: 83, 20: 53, 21: 43, 22: 37, 23: 15, 24: 14, 25: 13, 26: 8, 27: 4,
                    28: 3, 29: 4, 30: 2, 31: 1, 32: 4}


def build_bert(model: str):
    from transformers import BertConfig, BertModel  # noqa: PLC0415

    if model == "minilm":
        from grounding.encoders import load_text_encoder  # noqa: PLC0415

        return load_text_encoder("minilm", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    sizes = {"bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)}
    return BertModel(BertConfig(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, **sizes[model]),
                     add_pooling_layer=False)


def caption_batches(n: int, batch: int, vocab: int, device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(list(FLICKR8K_LENGTHS))
    weights = torch.tensor(list(FLICKR8K_LENGTHS.values()), dtype=torch.float)
    out = []
    for _ in range(n):
        lens = lengths[torch.multinomial(weights, batch, replacement=True, generator=g)]
        t = int(lens.max())
        mask = (torch.arange(t) < lens[:, None]).long()
        ids = torch.randint(1000, vocab, (batch, t), generator=g) * mask
        out.append((ids.to(device), mask.to(device)))
    return out


TABLE = [("model", "model"), ("device", "device"), ("amp", "amp"), ("batch", "batch"), ("trainable_layers", "layers trained"),
         ("real_token_share", "real tokens (share of the padded batch)"), ("padded_ms", "padded (ms)"),
         ("packed_ms", "packed (ms)"), ("speedup", "padded / packed")]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="minilm", choices=["minilm", "bert-base"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--trainable", type=int, default=4, help="top layers learnable (the Flickr8k stage-1 config: 4)")
    p.add_argument("--amp", default="none", choices=["none", "bf16"])
    p.add_argument("--repeats", type=int, default=6)
    add_record_option(p)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    device = torch.device(args.device)
    bert = build_bert(args.model).to(device)
    bert.requires_grad_(False)
    for layer in bert.encoder.layer[len(bert.encoder.layer) - args.trainable:]:
        layer.requires_grad_(True)
    batches = caption_batches(args.repeats, args.batch, bert.config.vocab_size, device)
    real_share = sum(m.sum().item() for _, m in batches) / sum(m.numel() for _, m in batches)

    bert.eval()
    with torch.no_grad():
        ids, mask = batches[0]
        ref = bert(input_ids=ids, attention_mask=mask).last_hidden_state
        diff = (packed_bert_forward(bert, ids, mask) - ref)[mask.bool()].abs().max().item()
    bert.train()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def step(packed: bool, ids, mask) -> float:
        sync()
        t = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp == "bf16"):
            h = packed_bert_forward(bert, ids, mask) if packed else bert(input_ids=ids, attention_mask=mask).last_hidden_state
            loss = h[mask.bool()].float().pow(2).mean()
        loss.backward()
        sync()
        return time.perf_counter() - t

    for packed in (False, True):  # warm-up
        step(packed, *batches[0])
    times = {False: [], True: []}
    for ids, mask in batches:
        for packed in (False, True):
            times[packed].append(step(packed, ids, mask))
    padded, packed = statistics.median(times[False]), statistics.median(times[True])
    print(f"torch {torch.__version__}, {args.device}, {args.model} (top {args.trainable} layers trained), batch {args.batch}, "
          f"amp {args.amp}; real tokens {real_share:.1%} of the padded batch; max |packed - padded| at real tokens "
          f"(eval, fp32) {diff:.2e}")
    print(f"fwd+bwd per batch: padded {padded * 1e3:.1f} ms, packed {packed * 1e3:.1f} ms, {padded / packed:.2f}x")
    row = {"model": args.model, "device": args.device, "amp": args.amp, "batch": args.batch, "trainable_layers": args.trainable,
           "real_token_share": real_share, "padded_ms": padded * 1e3, "packed_ms": packed * 1e3, "speedup": padded / packed,
           "max_abs_difference": diff, "repeats": args.repeats, "torch": torch.__version__}
    write_table_record(args.record, "BERT's text stream, fwd+bwd per batch: real tokens only (packed) vs padded to the "
                       "batch's longest caption", TABLE, [row], seeds=[0])


if __name__ == "__main__":
    main()

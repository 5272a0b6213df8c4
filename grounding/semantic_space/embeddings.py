"""Word and phrase embeddings from a language stream (VG-BERT App. B).

Each word or phrase ``w`` is fed alone as ``[CLS] w [SEP]``; the last hidden layer is
average-pooled, and each channel is standardised with the mean and standard deviation of the
pooled representations of every token of the model's vocabulary (each vocabulary id fed as
``[CLS] id [SEP]``; 30,522 ids for BERT), because a few channels have far larger spread than
the rest (App. B).

Pooling includes [CLS] and [SEP] by default: App. B pools "the output from the last hidden
layer" of the whole input, and the reference implementation's phrase pooling (VG-BERT
``Bert_object``) averages every unpadded position, special tokens included. ``pool_special_tokens=False``
averages the word pieces only.

A language stream is a Hugging Face BERT (a name or directory for ``grounding.encoders``) or the
BERT inside a suite checkpoint (a Lightning ``.ckpt``); see :func:`load_language_stream`.
Pooled vectors are cached per model under ``grounding.paths.cache_dir()/semantic_space/<key>``,
keyed by a hash of the model's weights and tokenizer vocabulary (and of the checkpoint file for
``.ckpt`` sources) plus the pooling rule.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from grounding.checkpoints import CheckpointError, read_checkpoint
from grounding.encoders import load_text_encoder, load_tokenizer
from grounding.errors import UserInputError
from grounding.paths import cache_dir
from grounding.utils.io import atomic_path, atomic_write_json, sha1_of_file, sha1_of_json, state_dict_sha1

WORD_EMBEDDINGS_SUFFIX = "embeddings.word_embeddings.weight"
CACHE_VERSION = 1


class LanguageStreamError(UserInputError, ValueError):
    """A language stream could not be loaded from the given source."""


@dataclass
class LanguageStream:
    """A loaded BERT-architecture encoder with its tokenizer and a stable identity."""

    name: str                      # display name
    source: str                    # what it was loaded from
    model: torch.nn.Module
    tokenizer: object
    identity: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return sha1_of_json(self.identity)[:16]


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------
def _vocab_sha1(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha1("\n".join(t for t, _ in vocab).encode("utf-8")).hexdigest()


def _find_key(obj, key: str, depth: int = 0):
    """First value of ``key`` in a nested dict/namespace (Lightning hparams nest init args)."""
    if depth > 6:
        return None
    if isinstance(obj, dict):
        if key in obj and isinstance(obj[key], str):
            return obj[key]
        for v in obj.values():
            found = _find_key(v, key, depth + 1)
            if found is not None:
                return found
    elif hasattr(obj, "__dict__") and not isinstance(obj, (str, bytes, torch.Tensor)):
        return _find_key(vars(obj), key, depth + 1)
    return None


def detect_bert_prefix(state_dict: dict, path: str | Path = "checkpoint") -> str:
    """The key prefix of the single BERT in ``state_dict`` (the part before
    ``embeddings.word_embeddings.weight``); an error lists the candidates when there are several."""
    prefixes = [k[: -len(WORD_EMBEDDINGS_SUFFIX)] for k in state_dict if k.endswith(WORD_EMBEDDINGS_SUFFIX)]
    if not prefixes:
        raise LanguageStreamError(
            f"{path}: no key ending in {WORD_EMBEDDINGS_SUFFIX!r} in the state_dict, so no BERT language stream "
            "was found. Pass a checkpoint of a model with a BERT text encoder.")
    if len(prefixes) > 1:
        raise LanguageStreamError(
            f"{path}: several BERT-like modules in the state_dict (prefixes {prefixes}); choose one with "
            "--prefix (e.g. --prefix language_stream.bert.).")
    return prefixes[0]


def load_language_stream(source: str, name: str | None = None, prefix: str | None = "auto",
                         text_encoder: str | None = None, tokenizer: str | None = None,
                         seed: int = 0) -> LanguageStream:
    """Load a language stream.

    ``source``: a ``grounding.encoders`` text-encoder name ("minilm", "tiny-random",
    "bert-base-uncased", a local directory) or a path to a Lightning ``.ckpt`` / a torch file
    whose ``state_dict`` holds BERT weights under a prefix (``prefix="auto"`` finds the key
    ending in ``embeddings.word_embeddings.weight``; or give it, e.g. ``language_stream.bert.``).
    For a checkpoint, the architecture comes from ``text_encoder`` or else the checkpoint
    hparams' ``text_encoder`` (default "minilm"), the tokenizer from ``tokenizer`` or the same name.
    Randomly initialised encoders ("tiny-random") are seeded with ``seed`` so runs agree.
    """

    path = Path(source).expanduser()
    is_checkpoint = path.is_file()
    if not is_checkpoint and (source.endswith(".ckpt") or source.endswith(".pt") or source.endswith(".pth")):
        raise LanguageStreamError(f"Checkpoint {path} does not exist. Pass an existing Lightning .ckpt or a text "
                                  "encoder name such as 'minilm'.")
    identity: dict = {"version": CACHE_VERSION}
    if is_checkpoint:
        try:
            ckpt = read_checkpoint(path, "language-stream")
        except CheckpointError as e:
            raise LanguageStreamError(str(e)) from e
        state = ckpt["state_dict"]
        arch = text_encoder or _find_key(ckpt["hyper_parameters"], "text_encoder") or "minilm"
        if prefix in (None, "", "auto"):
            prefix = detect_bert_prefix(state, path)
        bert_state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if not bert_state:
            raise LanguageStreamError(f"{path}: no state_dict keys start with prefix {prefix!r}; "
                                      f"example keys: {list(state)[:5]}")
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = load_text_encoder(arch)
        bert_state = {k: v for k, v in bert_state.items() if not k.startswith("pooler.")}
        result = model.load_state_dict(bert_state, strict=False)
        missing = [k for k in result.missing_keys if not k.endswith("position_ids")]
        if missing or result.unexpected_keys:
            raise LanguageStreamError(
                f"{path}: the weights under {prefix!r} do not fit text encoder {arch!r} "
                f"(missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}). Pass the right architecture "
                "with --text-encoder or the right --prefix.")
        tok = load_tokenizer(tokenizer or arch)
        identity.update(kind="checkpoint", file_sha1=sha1_of_file(path), prefix=prefix, arch=arch)
    else:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = load_text_encoder(source)
        tok = load_tokenizer(tokenizer or source)
        identity.update(kind="text_encoder", encoder=source)
    model.eval()
    identity.update(weights_sha1=state_dict_sha1(model), vocab_sha1=_vocab_sha1(tok))
    return LanguageStream(name or (path.stem if is_checkpoint else source), str(source), model, tok, identity)


# --------------------------------------------------------------------------------------------
# Embedding
# --------------------------------------------------------------------------------------------
class WordEmbedder:
    """Pooled, vocabulary-standardised embeddings of words and phrases for one language stream."""

    def __init__(self, stream: LanguageStream, batch_size: int = 256, pool_special_tokens: bool = True,
                 max_length: int = 32, cache: bool = True, cache_root: str | Path | None = None,
                 vocabulary_sample: int | None = None, seed: int = 0):
        self.stream = stream
        # App. B uses every vocabulary id; a seeded subset (e.g. 4096 ids) estimates the same per-channel
        # statistics ~7x faster for quick runs (the demo). None = the whole vocabulary.
        self.vocabulary_sample = vocabulary_sample
        self.seed = seed
        self.batch_size = batch_size
        self.pool_special_tokens = pool_special_tokens
        self.max_length = max_length
        self.use_cache = cache

        key = sha1_of_json({"model": stream.identity, "pool_special_tokens": pool_special_tokens})[:16]
        self.cache_folder = Path(cache_root or cache_dir()) / "semantic_space" / key
        self._memory: dict[str, np.ndarray] = {}
        self._stats: tuple[np.ndarray, np.ndarray] | None = None
        if cache:
            self._read_cache()

    # ---- cache -------------------------------------------------------------------------------
    @property
    def _stats_file(self) -> str:
        return "vocab_stats.npz" if not self.vocabulary_sample else f"vocab_stats_sample{self.vocabulary_sample}_seed{self.seed}.npz"

    def _read_cache(self) -> None:
        f = self.cache_folder / "embeddings.npz"
        if f.is_file():
            try:
                with np.load(f, allow_pickle=False) as z:
                    self._memory.update(zip(z["texts"].tolist(), z["vectors"]))
            except Exception:  # an unreadable cache is recomputed, never trusted
                self._memory.clear()
        s = self.cache_folder / self._stats_file
        if s.is_file():
            try:
                with np.load(s, allow_pickle=False) as z:
                    self._stats = (z["mean"], z["std"])
            except Exception:
                self._stats = None

    def _write_cache(self) -> None:
        if not self.use_cache:
            return
        self.cache_folder.mkdir(parents=True, exist_ok=True)
        texts = list(self._memory)
        if texts:
            with atomic_path(self.cache_folder / "embeddings.npz", suffix=".npz") as tmp:
                np.savez(tmp, texts=np.asarray(texts, dtype=str), vectors=np.stack([self._memory[t] for t in texts]))
        if self._stats is not None:
            with atomic_path(self.cache_folder / self._stats_file, suffix=".npz") as tmp:
                np.savez(tmp, mean=self._stats[0], std=self._stats[1])
        atomic_write_json(self.cache_folder / "identity.json",
                          {"name": self.stream.name, "source": self.stream.source, "identity": self.stream.identity,
                           "pool_special_tokens": self.pool_special_tokens}, indent=1)

    # ---- encoding ----------------------------------------------------------------------------
    @torch.no_grad()
    def _pool(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, pool_mask: torch.Tensor) -> np.ndarray:
        hidden = self.stream.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        w = pool_mask.to(hidden.dtype).unsqueeze(-1)
        return ((hidden * w).sum(1) / w.sum(1).clamp_min(1.0)).float().numpy()

    def _encode_texts(self, texts: Sequence[str]) -> np.ndarray:
        tok = self.stream.tokenizer
        order = np.argsort([len(t) for t in texts], kind="stable")  # similar lengths share a batch: less padding
        out = np.empty((len(texts), self.hidden_size), dtype=np.float32)
        for start in range(0, len(texts), self.batch_size):
            idx = order[start:start + self.batch_size]
            enc = tok([texts[i] for i in idx], padding=True, truncation=True, max_length=self.max_length,
                      return_tensors="pt", return_special_tokens_mask=True)
            mask = enc["attention_mask"]
            pool_mask = mask if self.pool_special_tokens else mask * (1 - enc["special_tokens_mask"])
            out[idx] = self._pool(enc["input_ids"], mask, pool_mask)
        return out

    @property
    def hidden_size(self) -> int:
        return int(self.stream.model.config.hidden_size)

    def raw(self, texts: Sequence[str]) -> np.ndarray:
        """Pooled last-layer vectors (not standardised), (len(texts), hidden)."""
        texts = list(texts)
        todo = list(dict.fromkeys(t for t in texts if t not in self._memory))
        if todo:
            self._memory.update(zip(todo, self._encode_texts(todo)))
            self._write_cache()
        return np.stack([self._memory[t] for t in texts]) if texts else np.zeros((0, self.hidden_size), np.float32)

    def vocabulary_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel mean and std of the pooled ``[CLS] token [SEP]`` vectors of every vocabulary id
        (or of a seeded sample of ``vocabulary_sample`` ids)."""
        if self._stats is None:
            tok = self.stream.tokenizer
            n = self.stream.model.get_input_embeddings().num_embeddings
            ids = torch.arange(n)
            if self.vocabulary_sample and self.vocabulary_sample < n:
                g = torch.Generator().manual_seed(self.seed)
                ids = torch.randperm(n, generator=g)[: self.vocabulary_sample].sort().values
            chunks = []
            for start in range(0, len(ids), 1024):
                mid = ids[start:start + 1024, None]
                input_ids = torch.cat([torch.full_like(mid, tok.cls_token_id), mid,
                                       torch.full_like(mid, tok.sep_token_id)], dim=1)
                mask = torch.ones_like(input_ids)
                pool_mask = mask if self.pool_special_tokens else torch.tensor([[0, 1, 0]]).expand_as(mask)
                chunks.append(self._pool(input_ids, mask, pool_mask))
            vocab = np.concatenate(chunks).astype(np.float64)
            mean, std = vocab.mean(0), vocab.std(0)  # population statistics over the (sampled) vocabulary
            self._stats = (mean.astype(np.float32), std.astype(np.float32))
            self._write_cache()
        return self._stats

    def standardise(self, raw: np.ndarray) -> np.ndarray:
        mean, std = self.vocabulary_stats()
        # A channel that is constant over the vocabulary (std ~ 0) is centred but not scaled.
        scale = np.where(std > 1e-6 * max(float(np.median(std)), 1e-12), std, 1.0)
        return (raw - mean) / scale

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Standardised embeddings (App. B), (len(texts), hidden)."""
        return self.standardise(self.raw(texts))

"""The semantic text embedding (STE, SemCLIP §3): the semantic memory model.

one-hot lemma -> embedding layer -> dense ReLU encoder (the STE vector, 300/1024/2048/4096) ->
ReLU projection head (discarded after training), trained with Eq. 3 on the similarity lists.
The embedding layer is a sparse ``nn.Embedding`` updated by :class:`RowSparseAdam` (SparseAdam's
update on only the rows a batch touches), with the configured optimizer (Adam 1e-3) for the dense
layers: a full-vocabulary epoch then costs the rows it uses, not |V| x d optimizer updates per step.
A training step gathers the batch's candidate rows once, runs Eq. 3 in list form
(:func:`~grounding.semclip.ste_loss.list_contrastive_loss`) and hands the rows' gradient to the
optimizer as it is (the candidates are unique: no sparse autograd, no coalescing). A sparse row is updated only
when its lemma is in a batch (about 1 + list size times an epoch, against every step for a dense
Adam whose momentum keeps moving it), so ``embedding_lr`` (default 10x the dense lr) restores the
pace of the paper's single dense Adam 1e-3; measured in benchmarks/bench_semclip.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from data_modules.wordnet_lists import lemma_surface
from grounding.errors import MissingInputError
from grounding.lightning import GroundingModule, LRSchedulerCallable, OptimizerCallable
from grounding.nets import RecordedNet
from grounding.semclip.ste_loss import linear_relu, list_contrastive_loss, mm_nt, multi_positive_contrastive_loss
from grounding.utils.io import atomic_path


def ste_default_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=1e-3)  # §3 implementation details


class RowSparseAdam(torch.optim.Optimizer):
    """``torch.optim.SparseAdam``'s update (the same state: step, exp_avg, exp_avg_sq; the same
    bias correction by the parameter's step count), computed on the gradient's rows only.

    The gradient is a sparse COO tensor over rows (``nn.Embedding(sparse=True)``'s, or one built
    with ``is_coalesced=True`` from unique row ids); for rows r with gradient g:
    m_r ← β1·m_r + (1−β1)·g, v_r ← β2·v_r + (1−β2)·g², θ_r ← θ_r − lr·√(1−β2^t)/(1−β1^t) · m_r / (√v_r + ε).
    Each moment is gathered, updated in one fused op and written back once (SparseAdam builds three
    sparse tensors and two ``sparse_mask`` copies a step).
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not p.grad.is_sparse:
                    raise RuntimeError("RowSparseAdam needs a sparse (row) gradient; use Adam for dense ones")
                grad = p.grad.coalesce()  # a no-op for a gradient built coalesced
                rows, g = grad._indices()[0], grad._values()
                if g.numel() == 0:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                m = state["exp_avg"].index_select(0, rows).lerp_(g, 1 - beta1)
                v = state["exp_avg_sq"].index_select(0, rows).lerp_(g * g, 1 - beta2)
                state["exp_avg"].index_copy_(0, rows, m)
                state["exp_avg_sq"].index_copy_(0, rows, v)
                step_size = group["lr"] * math.sqrt(1 - beta2 ** state["step"]) / (1 - beta1 ** state["step"])
                p.index_add_(0, rows, m.div_(v.sqrt_().add_(group["eps"])), alpha=-step_size)
        return loss


class STEEncoder(RecordedNet):
    """Embedding -> Linear+ReLU (encoding) -> Linear+ReLU (projection head, training only)."""

    def __init__(self, vocab_size: int, encoding_size: int = 300, embedding_dim: int | None = None,
                 projection_size: int | None = None, sparse: bool = True):
        super().__init__()
        embedding_dim = embedding_dim or encoding_size
        self.embedding = nn.Embedding(vocab_size, embedding_dim, sparse=sparse)
        nn.init.normal_(self.embedding.weight, std=embedding_dim ** -0.5)
        self.encoder = nn.Sequential(nn.Linear(embedding_dim, encoding_size), nn.ReLU())
        self.projection = nn.Sequential(nn.Linear(encoding_size, projection_size or encoding_size), nn.ReLU())

    # the layers are nn.Sequential(Linear, ReLU) (checkpoint keys encoder.0.*, projection.0.*), run as one
    # fused Linear+ReLU each (grounding.semclip.ste_loss.linear_relu: oneDNN GEMMs, same values)
    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        return linear_relu(self.embedding(ids), self.encoder[0])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(ids))

    def head(self, rows: torch.Tensor) -> torch.Tensor:
        """``forward`` from embedding rows already looked up (the training step's gathered rows)."""
        return linear_relu(linear_relu(rows, self.encoder[0]), self.projection[0])

    @torch.no_grad()
    def encode_all(self, chunk: int = 16384) -> torch.Tensor:
        """The STE vector of every vocabulary item (V, encoding_size)."""
        ids = torch.arange(self.embedding.num_embeddings, device=self.embedding.weight.device)
        return torch.cat([self.encode(c) for c in ids.split(chunk)])


class SemanticTextEmbedding(GroundingModule):
    """LightningModule training the STE on similarity-list batches (see data_modules.similarity_lists).

    ``net``: the built :class:`STEEncoder`; its ``vocab_size`` is the DataModule's vocabulary size (linked
    by the CLI; the vocabulary itself is stored in checkpoints and exported with the vectors), its
    ``sparse`` switch picks SparseAdam for the embedding rows. ``export_dir``: where the trained
    embedding (vocab + vectors + word2vec text) is written when training ends.
    """

    monitor = "val/loss"
    monitor_mode = "min"

    def __init__(self, net: STEEncoder, temperature: float = 0.05, embedding_lr: float | None = None,
                 export_dir: str | None = None, optimizer: OptimizerCallable = ste_default_optimizer,
                 lr_scheduler: LRSchedulerCallable | None = None):
        super().__init__(optimizer, lr_scheduler)
        self.save_hyperparameters(ignore=["net", "optimizer", "lr_scheduler"])
        self.automatic_optimization = False  # two optimizers: SparseAdam (embedding) + the dense one
        self.model = self.adopt_net(net)
        self.sparse = self.model.init_args["sparse"]
        self.vocab: list[str] | None = None
        self._val_vectors = None

    def setup(self, stage: str):
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if dm is not None and hasattr(dm, "vocab"):
            vocab = list(dm.vocab)
            if self.model.embedding.num_embeddings != len(vocab):
                raise ValueError(f"The model has {self.model.embedding.num_embeddings} vocabulary rows but the "
                                 f"DataModule's similarity lists have {len(vocab)} lemmas; train a new model "
                                 "or use the lists it was trained on.")
            self.vocab = vocab

    # ------------------------------------------------------------------------------ training
    def configure_optimizers(self):
        dense = [p for n, p in self.model.named_parameters() if not n.startswith("embedding.")]
        if not self.sparse:
            dense = list(self.model.parameters())
        dense_opt = self.optimizer_factory(dense)
        optimizers = [dense_opt]
        if self.sparse:
            lr = self.hparams.embedding_lr or 10 * dense_opt.param_groups[0]["lr"]
            optimizers.insert(0, RowSparseAdam(list(self.model.embedding.parameters()), lr=lr))
        if self.lr_scheduler_factory is None:
            return optimizers
        return optimizers, [self.lr_scheduler_factory(o) for o in optimizers]

    def batch_loss(self, batch, z: torch.Tensor | None = None) -> torch.Tensor:
        """Eq. 3 on a batch (``z``: the candidates' projections when already computed); the list form,
        or the dense form when the batch carries a dense ``targets`` matrix (same value)."""
        z = self.model(batch["candidates"]) if z is None else z
        anchor_z = z[batch["anchor_position"]]
        if "targets" in batch:
            return multi_positive_contrastive_loss(anchor_z, z, batch["targets"], self.hparams.temperature,
                                                   anchor_position=batch["anchor_position"])
        return list_contrastive_loss(anchor_z, z, batch["anchor_position"], batch["member_owner"],
                                     batch["member_position"], batch["member_weight"], self.hparams.temperature)

    def training_step(self, batch, batch_idx):
        optimizers = self.optimizers()
        optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
        for opt in optimizers:
            opt.zero_grad()
        if self.sparse:  # look up the candidates' rows once; their gradient is the embedding's, row-sparse
            weight = self.model.embedding.weight
            rows = weight.detach()[batch["candidates"]].requires_grad_()
            loss = self.batch_loss(batch, self.model.head(rows))
            self.manual_backward(loss)
            # the collator's candidates are unique and sorted: a coalesced COO gradient as it is
            weight.grad = torch.sparse_coo_tensor(batch["candidates"][None], rows.grad, weight.shape, is_coalesced=True,
                                                  check_invariants=False)
        else:
            loss = self.batch_loss(batch)
            self.manual_backward(loss)
        for opt in optimizers:
            opt.step()
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=False, batch_size=len(batch["anchors"]))
        self.log("train/epoch_loss", loss, on_step=False, on_epoch=True, batch_size=len(batch["anchors"]))
        return loss

    def on_train_epoch_end(self):
        schedulers = self.lr_schedulers()
        if schedulers is not None:
            for s in schedulers if isinstance(schedulers, list) else [schedulers]:
                s.step()

    # ------------------------------------------------------------------------------ validation
    def on_validation_epoch_start(self):
        vectors = self.model.encode_all()
        self._val_vectors = torch.nn.functional.normalize(vectors, dim=-1)

    def validation_step(self, batch, batch_idx):
        n = len(batch["anchors"])
        self.log("val/loss", self.batch_loss(batch), prog_bar=True, batch_size=n)
        # list recall@10: an anchor's 10 nearest STE vectors (itself excluded) hold a list member
        sims = mm_nt(self._val_vectors[batch["anchors"]], self._val_vectors)
        sims[torch.arange(n), batch["anchors"]] = -2.0
        top = sims.topk(min(10, sims.shape[1] - 1), dim=-1).indices
        # (anchor row, vocabulary id) keys of the positive list members, and of the 10 nearest
        vocab = len(self._val_vectors)
        positive = batch["member_weight"] > 0
        members = batch["member_owner"][positive] * vocab + batch["candidates"][batch["member_position"][positive]]
        nearest = torch.arange(n)[:, None] * vocab + top
        member = torch.isin(nearest, members)
        self.log("val/list_recall@10", member.any(dim=1).float().mean(), prog_bar=True, batch_size=n)

    def on_validation_epoch_end(self):
        self._val_vectors = None

    def configure_callbacks(self):
        callbacks = super().configure_callbacks()
        # The best-by-val/loss checkpoint without the optimizer state: last.ckpt (every epoch) is the resume
        # point, and the |V| x d SparseAdam moments would triple the best file's size (~0.5 GB at WordNet scale).
        for cb in callbacks:
            if isinstance(cb, ModelCheckpoint) and cb.monitor:
                cb.save_weights_only = True
        return callbacks

    # ------------------------------------------------------------------------------ export
    def on_save_checkpoint(self, checkpoint):
        # one newline-joined string (lemma keys hold no newline): pickling 146k separate strings cost ~0.6 s a file
        checkpoint["ste_vocab"] = None if self.vocab is None else "\n".join(self.vocab)

    def on_load_checkpoint(self, checkpoint):
        vocab = checkpoint.get("ste_vocab")
        self.vocab = (vocab.split("\n") if vocab else []) if isinstance(vocab, str) else vocab  # older: a list

    def on_train_end(self):
        if self.hparams.export_dir and self.trainer.is_global_zero and not self.trainer.sanity_checking:
            out = export_ste(self, self.hparams.export_dir)
            print(f"STE exported to {out}")

    def embedding(self) -> "STEEmbedding":
        if self.vocab is None:
            raise ValueError("This STE has no vocabulary (train it with a SimilarityListsDataModule or load a checkpoint).")
        self.model.eval()
        return STEEmbedding(self.vocab, self.model.encode_all().cpu())


# ------------------------------------------------------------------------------------------
# The trained embedding: vocabulary + vectors
# ------------------------------------------------------------------------------------------
class STEEmbedding:
    """Exported STE vectors over lemma keys, with word-level lookup and nearest neighbours."""

    def __init__(self, keys: Sequence[str], vectors: torch.Tensor | np.ndarray):
        vectors = torch.as_tensor(np.asarray(vectors, dtype=np.float32))
        if vectors.ndim != 2 or len(keys) != len(vectors):
            raise ValueError(f"{len(keys)} keys but vectors of shape {tuple(vectors.shape)}")
        self.keys = list(keys)
        self.vectors = vectors
        self.index = {k: i for i, k in enumerate(self.keys)}
        self._surface_index: dict[str, list[int]] | None = None

    @property
    def dim(self) -> int:
        return self.vectors.shape[1]

    @property
    def normalized(self) -> torch.Tensor:
        if not hasattr(self, "_normalized"):
            self._normalized = torch.nn.functional.normalize(self.vectors, dim=-1)
        return self._normalized

    def surface_index(self) -> dict[str, list[int]]:
        """written form (lower case, spaces) -> rows of every sense/lemma item with that form."""
        if self._surface_index is None:
            idx: dict[str, list[int]] = {}
            for i, k in enumerate(self.keys):
                idx.setdefault(lemma_surface(k), []).append(i)
            self._surface_index = idx
        return self._surface_index

    def __contains__(self, key: str) -> bool:
        return key in self.index

    def vector(self, key: str) -> torch.Tensor:
        return self.vectors[self.index[key]]

    def nearest(self, rows: torch.Tensor, k: int = 10, exclude_self: bool = True, chunk: int = 1024) -> torch.Tensor:
        """Rows of the k nearest items (cosine) to each of ``rows``."""
        out = []
        for part in torch.as_tensor(rows).split(chunk):
            sims = self.normalized[part] @ self.normalized.T
            if exclude_self:
                sims[torch.arange(len(part)), part] = -2.0
            out.append(sims.topk(k, dim=-1).indices)
        return torch.cat(out) if out else torch.empty(0, k, dtype=torch.long)

    # ---------------------------------------------------------------------------- files
    def save(self, out: str | Path) -> Path:
        """``out/`` with vocab.txt, vectors.npy, ste.w2v.txt (word2vec text format), meta.json; atomic."""
        out = Path(out)
        with atomic_path(out) as tmp:
            tmp.mkdir()
            (tmp / "vocab.txt").write_text("\n".join(self.keys) + "\n", encoding="utf-8")
            np.save(tmp / "vectors.npy", self.vectors.numpy())
            write_word2vec(tmp / "ste.w2v.txt", self.keys, self.vectors.numpy())
            (tmp / "meta.json").write_text(json.dumps({"vocab_size": len(self.keys), "dim": self.dim}))
        return out

    @classmethod
    def load(cls, path: str | Path) -> "STEEmbedding":
        """A folder written by :meth:`save`, or a word2vec text file."""
        path = Path(path)
        if path.is_dir():
            if not (path / "vocab.txt").is_file() or not (path / "vectors.npy").is_file():
                raise MissingInputError(f"{path} is not an exported STE (expected vocab.txt and vectors.npy; "
                                        "export one with `python -m grounding.semclip export --ckpt CKPT --out DIR`).")
            keys = (path / "vocab.txt").read_text(encoding="utf-8").splitlines()
            return cls(keys, np.load(path / "vectors.npy"))
        if path.is_file():
            keys, vectors = read_word2vec(path)
            return cls(keys, vectors)
        raise MissingInputError(f"STE embedding {path} does not exist (a folder from `grounding.semclip export` or a word2vec text file).")


def write_word2vec(path: Path, keys: Sequence[str], vectors: np.ndarray):
    """word2vec text format: ``"<count> <dim>"`` then ``"<token> v1 ... vd"`` per line."""
    fmt = " ".join(["%.6g"] * vectors.shape[1])
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{len(keys)} {vectors.shape[1]}\n")
        f.writelines(k.replace(" ", "_") + " " + fmt % tuple(row) + "\n" for k, row in zip(keys, vectors.tolist()))


def read_word2vec(path: Path) -> tuple[list[str], np.ndarray]:
    with open(path, encoding="utf-8") as f:
        header = f.readline().split()
        if len(header) != 2 or not all(h.isdigit() for h in header):
            raise ValueError(f"{path}: the first line must be '<count> <dim>' (word2vec text format), got {header!r}")
        n, d = map(int, header)
        keys, rows = [], np.empty((n, d), np.float32)
        for i, line in enumerate(f):
            parts = line.rstrip("\n").split(" ")
            if len(parts) != d + 1:
                raise ValueError(f"{path}:{i + 2}: expected a token and {d} numbers, got {len(parts) - 1} numbers")
            keys.append(parts[0])
            rows[i] = np.asarray(parts[1:], dtype=np.float32)
    if len(keys) != n:
        raise ValueError(f"{path}: header says {n} vectors, file has {len(keys)}")
    return keys, rows


def export_ste(module: SemanticTextEmbedding, out: str | Path) -> Path:
    return module.embedding().save(out)

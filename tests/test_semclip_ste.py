"""The STE (SemCLIP §3): batches, training on synthetic lists, export formats."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from data_modules.similarity_lists import SimilarityListCollator, SimilarityListsDataModule
from data_modules.wordnet_lists import SimilarityLists
from grounding.semclip.ste import SemanticTextEmbedding, STEEmbedding, STEEncoder, read_word2vec


def _synthetic_lists(groups=6, size=4) -> SimilarityLists:
    # group g holds words g.n.01.w0 .. w3: every member lists the others (score 0.9)
    mapping = {}
    for g in range(groups):
        members = [f"group{g}.n.01.w{k}" for k in range(size)]
        for m in members:
            mapping[m] = [(o, 0.9) for o in members if o != m]
    return SimilarityLists.from_mapping(mapping)


def test_collator_builds_eq3_label_vectors():
    lists = SimilarityLists.from_mapping({"a": [("b", 0.9), ("c", 0.5)], "b": [("a", 1.0)], "c": [], "d": [("a", 0.7)]})
    batch = SimilarityListCollator(lists, dense_targets=True)([0, 3])  # anchors a and d
    cand = batch["candidates"].tolist()
    assert sorted(cand) == cand and set(cand) == {0, 1, 2, 3}
    dense = torch.zeros(2, 4)
    dense[:, batch["candidates"]] = batch["targets"]
    assert dense.tolist() == [[0, pytest.approx(0.9), 0.5, 0], [pytest.approx(0.7), 0, 0, 0]]
    assert batch["candidates"][batch["anchor_position"]].tolist() == [0, 3]
    with_neg = SimilarityListCollator(lists, num_negatives=5, dense_targets=True)([1])
    assert len(with_neg["candidates"]) >= 2 and with_neg["targets"].sum().item() == pytest.approx(1.0)


def test_ste_puts_list_members_nearest(tmp_path):
    torch.manual_seed(0)
    lists = _synthetic_lists()
    model = STEEncoder(len(lists.vocab), encoding_size=32, sparse=True)
    module = SemanticTextEmbedding(model)
    collate = SimilarityListCollator(lists)
    opt_sparse = torch.optim.SparseAdam(list(model.embedding.parameters()), lr=1e-1)
    opt_dense = torch.optim.Adam(list(model.encoder.parameters()) + list(model.projection.parameters()), lr=1e-2)
    rows = np.arange(len(lists.anchors))
    for step in range(150):
        batch = collate(np.random.default_rng(step).permutation(rows)[:12].tolist())
        opt_sparse.zero_grad(), opt_dense.zero_grad()
        module.batch_loss(batch).backward()
        opt_sparse.step(), opt_dense.step()
    module.vocab = lists.vocab
    emb = module.embedding()
    # the STE vectors (the encoder; the projection head is discarded): every word's nearest
    # neighbour is a list member, and list members are far more similar than non-members
    group = torch.tensor([int(k.split(".")[0][5:]) for k in emb.keys])
    nearest = emb.nearest(torch.arange(len(emb.keys)), k=1)[:, 0]
    assert (group[nearest] == group).all()
    sims = emb.normalized @ emb.normalized.T
    same = group[:, None] == group[None, :]
    off_diag = ~torch.eye(len(group), dtype=torch.bool)
    assert sims[same & off_diag].mean() > sims[~same].mean() + 0.3


def test_lightning_fit_and_export(tmp_path):
    from lightning.pytorch import Trainer, seed_everything

    seed_everything(0)
    lists = _synthetic_lists(groups=4)
    curated = tmp_path / "lists.jsonl"
    curated.write_text("\n".join(json.dumps({"anchor": lists.vocab[a], "similar": lists.list_of(lists.vocab[a])}) for a in lists.anchors))
    dm = SimilarityListsDataModule(curated=str(curated), batch_size=8, val_anchors=8)
    module = SemanticTextEmbedding(STEEncoder(len(dm.vocab), encoding_size=32), export_dir=str(tmp_path / "ste"),
                                   embedding_lr=0.1, optimizer=lambda p: torch.optim.Adam(p, lr=1e-2))
    trainer = Trainer(max_epochs=40, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=dm)
    assert trainer.callback_metrics["val/list_recall@10"] == pytest.approx(1.0)
    emb = STEEmbedding.load(tmp_path / "ste")
    assert emb.keys == lists.vocab and emb.dim == 32
    keys, vecs = read_word2vec(tmp_path / "ste" / "ste.w2v.txt")
    assert keys == emb.keys and np.allclose(vecs, emb.vectors.numpy(), atol=1e-4)
    assert STEEmbedding.load(tmp_path / "ste" / "ste.w2v.txt").keys == keys
    nearest = emb.nearest(torch.arange(len(emb.keys)), k=1)[:, 0].tolist()
    assert all(emb.keys[j].split(".")[0] == emb.keys[i].split(".")[0] for i, j in enumerate(nearest))


def test_checkpoint_restores_vocabulary(tmp_path):
    lists = _synthetic_lists(groups=2)
    module = SemanticTextEmbedding(STEEncoder(len(lists.vocab), encoding_size=8))
    module.vocab = lists.vocab
    ckpt = {"hyper_parameters": dict(module.hparams)}
    module.on_save_checkpoint(ckpt)
    fresh = SemanticTextEmbedding(ckpt["hyper_parameters"]["net"])  # a checkpoint's spec rebuilds the network
    fresh.on_load_checkpoint(ckpt)
    assert fresh.vocab == lists.vocab and fresh.model.embedding.num_embeddings == len(lists.vocab)


def test_bad_files_explain_themselves(tmp_path):
    (tmp_path / "v.txt").write_text("2 3\na 1 2\n")
    with pytest.raises(ValueError, match="v.txt:2: expected a token and 3 numbers"):
        read_word2vec(tmp_path / "v.txt")
    with pytest.raises(FileNotFoundError, match="vocab.txt"):
        STEEmbedding.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="build-lists"):
        SimilarityLists.load(tmp_path / "absent.npz")

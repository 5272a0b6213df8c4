"""SemCLIP §4–5 end to end: alignment pairs cache, the Γ_t LightningModule, the Eq. 7 store,
the stability / retrieval numbers and the evaluate command."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from semclip_helpers import markdown_tables, tiny_baseline_ckpt, tiny_world_ste


@pytest.fixture(scope="module")
def semclip_inputs(tiny_world, tmp_path_factory):
    root = tmp_path_factory.mktemp("semclip")
    return {"vlm": f"suite:{tiny_baseline_ckpt(root / 'vlm')}", "ste": str(tiny_world_ste(root / 'ste')),
            "captions": str(tiny_world / "coco" / "annotations" / "captions_train2017.json"), "root": root}


def test_pairs_cache_is_atomic_reused_and_keyed(semclip_inputs, tmp_path, monkeypatch):
    import grounding.semclip.vlm as vlm_module
    from grounding.semclip import alignment_data
    from grounding.semclip.alignment_data import AlignmentPairsDataModule

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    captions = tmp_path / "captions.txt"
    captions.write_text("A ball on a box.\nThe sky above the field\nA  ball on a box.\nAn automobile near a pail\n")
    args = dict(vlm=semclip_inputs["vlm"], ste=semclip_inputs["ste"], captions=str(captions), lexical_variants=False,
                val_fraction=0.5, batch_size=4)
    dm = AlignmentPairsDataModule(**args)
    dm.prepare_data()
    path = dm.cache_path()
    targets_file = path.parent / f"caption_targets-{dm.targets_key()[:16]}.pt"
    assert path.is_file() and sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, targets_file.name])
    # (no temporary left behind)
    pairs = dm.load_pairs()
    # distinct captions only; the one without an STE noun (sky, field) is dropped
    assert pairs["captions"] == ["A ball on a box.", "An automobile near a pail"]
    assert pairs["vlm_text"].shape == (2, dm.vlm_dim) and pairs["targets"].shape == (2, dm.ste_dim) == (2, 16)
    from grounding.semclip.ste import STEEmbedding

    ste = STEEmbedding.load(semclip_inputs["ste"])
    expected = (ste.vector("ball.n.03.ball") + ste.vector("box.n.01.box")) / 2
    assert torch.allclose(pairs["targets"][0], expected, atol=1e-6)

    # reused: a second DataModule never loads the VLM
    monkeypatch.setattr(vlm_module, "load_vlm", lambda *a, **k: pytest.fail("cache not reused"))
    again = AlignmentPairsDataModule(**args)
    assert again.cache_path() == path and torch.equal(again.load_pairs()["vlm_text"], pairs["vlm_text"])
    again.setup("fit")
    assert len(again.train_set) == 1 and len(again.val_set) == 1
    assert [t.tolist() for t in again.split_indices()] == [t.tolist() for t in dm.split_indices()]  # seeded
    x, y = next(iter(again.train_dataloader()))
    assert x.shape == (1, dm.vlm_dim) and y.shape == (1, 16)
    # keyed by the caption file's content
    captions.write_text("A car.\n")
    assert AlignmentPairsDataModule(**args).cache_path() != path
    with pytest.raises(FileNotFoundError, match="(?i)caption file"):
        AlignmentPairsDataModule(**{**args, "captions": str(tmp_path / "none.json")}).cache_path()
    assert alignment_data.read_captions(semclip_inputs["captions"])  # COCO JSON


def test_a_second_vlm_reuses_the_caption_targets(semclip_inputs, tmp_path, monkeypatch):
    """The targets (POS, Lesk, the lexical step: the costly half) do not depend on the VLM: Γ_t for another VLM on the
    same captions and STE reads them from their own cache and only encodes the captions."""
    from grounding.semclip import alignment_data
    from grounding.semclip.alignment_data import AlignmentPairsDataModule

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    captions = tmp_path / "captions.txt"
    captions.write_text("A ball on a box.\nThe sky above the field\nAn automobile near a pail\n")
    args = dict(ste=semclip_inputs["ste"], captions=str(captions), lexical_variants=False)
    first = AlignmentPairsDataModule(vlm=semclip_inputs["vlm"], **args)
    first_pairs = first.load_pairs()
    other_vlm = f"suite:{tiny_baseline_ckpt(tmp_path / 'vlm_b', seed=1)}"
    second = AlignmentPairsDataModule(vlm=other_vlm, **args)
    assert second.targets_key() == first.targets_key() and second.cache_key() != first.cache_key()
    monkeypatch.setattr(alignment_data, "CaptionTargets", lambda *a, **k: pytest.fail("targets recomputed"))
    pairs = second.load_pairs()
    assert pairs["captions"] == first_pairs["captions"] and torch.equal(pairs["targets"], first_pairs["targets"])
    assert not torch.allclose(pairs["vlm_text"], first_pairs["vlm_text"])  # the second VLM's own encoding
    # a damaged targets file is rebuilt, never trusted
    targets_file = second.cache_path().parent / f"caption_targets-{second.targets_key()[:16]}.pt"
    targets_file.write_bytes(b"half a file")
    monkeypatch.undo()
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    second.cache_path().unlink()
    again = AlignmentPairsDataModule(vlm=other_vlm, **args).load_pairs()
    assert torch.equal(again["targets"], first_pairs["targets"])
    assert torch.load(targets_file, weights_only=True)["captions"] == first_pairs["captions"]


def test_caption_images_keep_only_the_listed_images_captions(semclip_inputs, tmp_path, monkeypatch):
    """caption_images (a Flickr-style image list) keeps the training photos' captions, and keys the cache."""
    from data_modules.file_checks import MalformedDataError, MissingDataError
    from grounding.semclip.alignment_data import AlignmentPairsDataModule, read_captions

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("a.jpg#0\tA ball on a box .\na.jpg#1\tA box .\nb.jpg#0\tAn automobile near a pail .\n"
                      "c.jpg#0\tA ball on a box .\n")
    train, test = tmp_path / "train.txt", tmp_path / "test.txt"
    train.write_text("a.jpg\nc.jpg\n")
    test.write_text("b.jpg\n")
    assert read_captions(str(tokens), str(train)) == ["A ball on a box .", "A box ."]
    assert read_captions(str(tokens), str(test)) == ["An automobile near a pail ."]
    assert len(read_captions(str(tokens))) == 3
    plain = tmp_path / "plain.txt"
    plain.write_text("A ball.\n")  # plain text names no images: not selectable
    with pytest.raises(MalformedDataError, match="caption_images"):
        read_captions(str(plain), str(train))
    with pytest.raises(MissingDataError, match="caption_images=.*none.txt does not exist"):
        read_captions(str(tokens), str(tmp_path / "none.txt"))
    args = dict(vlm=semclip_inputs["vlm"], ste=semclip_inputs["ste"], captions=str(tokens), lexical_variants=False,
                val_fraction=0.0, batch_size=4)
    every, only_train = AlignmentPairsDataModule(**args), AlignmentPairsDataModule(**args, caption_images=str(train))
    assert every.cache_path() != only_train.cache_path()
    assert only_train.load_pairs()["captions"] == ["A ball on a box .", "A box ."]


def test_alignment_module_trains_and_exports(tmp_path):
    from lightning.pytorch import Trainer
    from torch.utils.data import DataLoader, TensorDataset

    from grounding.semclip.alignment import AlignmentTransform, load_transform, recovery_error
    from grounding.semclip.alignment_training import SemCLIPAlignment

    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=g)
    y = x @ torch.randn(8, 5, generator=g) / 8 ** 0.5  # a toy (linear) VLM -> STE mapping
    train = DataLoader(TensorDataset(x[:80], y[:80]), batch_size=20, shuffle=True, generator=g)
    val = DataLoader(TensorDataset(x[80:], y[80:]), batch_size=16)
    torch.manual_seed(0)
    module = SemCLIPAlignment(AlignmentTransform(in_dim=8, out_dim=5, hidden=64), export_path=str(tmp_path / "transform.pt"))
    with torch.no_grad():
        before = float(((module(x[80:]) - y[80:]) ** 2).sum(-1).mean())
    trainer = Trainer(max_epochs=30, check_val_every_n_epoch=15, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path, accelerator="cpu")
    trainer.fit(module, train, val)
    assert isinstance(module.trainer.optimizers[0], torch.optim.AdamW)
    after = float(trainer.callback_metrics["val/loss"])
    assert after < 0.25 * before
    assert "val/recovery_error" in trainer.callback_metrics
    transform, _ = load_transform(tmp_path / "transform.pt")
    with torch.no_grad():
        assert torch.allclose(transform(x), module.transform(x), atol=1e-6)
        assert recovery_error(transform(x[:80]), y[:80]) < 0.1
    ckpt, _ = load_transform(tmp_path / "checkpoints" / "last.ckpt")  # the Lightning checkpoint works too
    with torch.no_grad():
        assert torch.allclose(ckpt(x), transform(x), atol=1e-6)
    with pytest.raises(FileNotFoundError, match="align_world.yaml"):
        load_transform(tmp_path / "absent.pt")


class _ToyVLM:
    """Texts and 'images' are already vectors: encode_* look them up."""

    def __init__(self, table):
        self.table = table

    def encode_text(self, texts):
        return torch.stack([self.table[t] for t in texts])

    def encode_image(self, images):
        return images


def test_store_eq7_maps_an_image_onto_the_transform_of_its_nearest_text():
    from grounding.semclip.alignment import AlignmentTransform
    from grounding.semclip.store import SemCLIPStore

    torch.manual_seed(0)
    table = {"a ball": torch.tensor([1.0, 0.0, 0.0]), "an orb": torch.tensor([0.9, 0.1, 0.0]),
             "a car": torch.tensor([0.0, 1.0, 0.0]), "a tree": torch.tensor([0.0, 0.0, 1.0])}
    transform = AlignmentTransform(3, 4, hidden=8)
    store = SemCLIPStore(_ToyVLM(table), transform, query_mode="transform")
    with pytest.raises(ValueError, match="text bank"):
        store.ingest(torch.zeros(1, 3))
    store.add_texts(["a ball", "a car", "a tree"])
    images = torch.tensor([[0.2, 3.0, 0.1], [2.0, 0.1, 0.3], [0.0, 0.4, 1.0]])  # nearest texts: car, ball, tree
    nearest = store.ingest(images, ids=["img-car", "img-ball", "img-tree"])
    assert nearest.tolist() == [1, 0, 2]
    with torch.no_grad():
        bank = transform(torch.stack([table[t] for t in ("a ball", "a car", "a tree")]))
    assert torch.allclose(store.image_semclip, bank[[1, 0, 2]])
    _, ids = store.search(["a ball"], k=1)
    assert ids == [["img-ball"]]
    # the same image takes the same vector whichever synonym tagged it: "an orb" ranks like "a ball"
    assert store.search(["an orb"], k=3)[1] == store.search(["a ball"], k=3)[1]
    try:
        import faiss  # noqa: F401
    except ImportError:
        return
    fast = SemCLIPStore(_ToyVLM(table), transform, query_mode="transform", backend="faiss")
    fast.add_texts(["a ball", "a car", "a tree"])
    fast.ingest(images, ids=["img-car", "img-ball", "img-tree"])
    assert fast.search(["a car"], k=3)[1] == store.search(["a car"], k=3)[1]


def test_store_ste_queries_and_folder_ingestion(semclip_inputs, tiny_world):
    from grounding.semclip.alignment import AlignmentTransform
    from grounding.semclip.ste import STEEmbedding
    from grounding.semclip.store import SemCLIPStore
    from grounding.semclip.vlm import list_images, load_vlm

    vlm, ste = load_vlm(semclip_inputs["vlm"], feature_cache=False), STEEmbedding.load(semclip_inputs["ste"])
    store = SemCLIPStore(vlm, AlignmentTransform(vlm.dim, ste.dim, hidden=16), ste, query_mode="ste")
    store.add_texts(["A red ball.", "A white car near a tree."])
    store.ingest(tiny_world / "images")
    assert len(store.image_ids) == len(list_images(tiny_world / "images"))
    q = store.embed_queries(["A photo of an automobile", "A photo of the sky"])
    assert torch.allclose(q[0], ste.vector("car.n.01.automobile"))  # the STE of its noun (paper §4)
    with torch.no_grad():  # no STE noun: Γ_t of its VLM embedding
        assert torch.allclose(q[1], store.transform(vlm.encode_text(["A photo of the sky"]))[0], atol=1e-5)


def test_stability_and_retrieval_on_hand_made_cases():
    from grounding.semclip.stability import NounQuery, pair_overlaps, relevance, retrieval, stability

    queries = [NounQuery("A photo of a ball", "ball", "ball", True), NounQuery("A photo of an orb", "orb", "ball", False),
               NounQuery("A photo of a car", "car", "car", True), NounQuery("A photo of an auto", "auto", "car", False)]
    s = torch.tensor([[0.9, 0.8, 0.1, 0.0], [0.9, 0.8, 0.1, 0.0],   # identical lists -> overlap 1
                      [0.9, 0.8, 0.1, 0.0], [0.0, 0.1, 0.8, 0.9]])  # reversed -> top-2 disjoint
    st = stability(s, queries, [1, 2, 4])
    assert pair_overlaps(s, queries, 2).tolist() == [1.0, 0.0]
    assert st[1] == pytest.approx((1 + 0) / 2) and st[2] == pytest.approx((1 + 0) / 2) and st[4] == pytest.approx(1.0)
    rel = relevance(queries, [{"ball"}, {"ball", "car"}, {"car"}, set()])
    assert rel.tolist() == [[True, True, False, False]] * 2 + [[False, True, True, False]] * 2
    r = retrieval(s, rel, k=10)
    assert r["t2i"]["queries"] == 4 and r["i2t"]["queries"] == 3  # image 3 has no relevant query
    # t2i: queries 0, 1 rank their two relevant images first (AP 1); query 2 ranks 0,1,2: AP (1/2 + 2/3)/2;
    # query 3 ranks 3,2,1: AP (1/2 + 2/3)/2
    assert r["t2i"]["map"] == pytest.approx((1 + 1 + 2 * (0.5 + 2 / 3) / 2) / 4)
    assert r["t2i"]["recall@10"] == pytest.approx(1.0)


def test_evaluate_command_writes_the_report(semclip_inputs, tiny_world, tmp_path, monkeypatch, capsys):
    from grounding.docs_tables import render_table, validate_record
    from grounding.semclip.__main__ import main
    from grounding.semclip.alignment import AlignmentTransform, fit_alignment, save_transform
    from grounding.semclip.alignment_data import AlignmentPairsDataModule

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    dm_args = dict(vlm=semclip_inputs["vlm"], ste=semclip_inputs["ste"], captions=semclip_inputs["captions"],
                   lexical_variants=False, val_fraction=0.2, seed=0)
    dm = AlignmentPairsDataModule(**dm_args)
    pairs = dm.load_pairs()
    train_idx, _ = dm.split_indices()
    torch.manual_seed(0)
    transform = AlignmentTransform(dm.vlm_dim, dm.ste_dim, hidden=32)
    fit_alignment(transform, pairs["vlm_text"][train_idx], pairs["targets"][train_idx], epochs=5, batch_size=64)
    path = save_transform(transform, tmp_path / "transform.pt", **dm_args)
    out = tmp_path / "report"
    main(["evaluate", "--transform", str(path), "--world", str(tiny_world), "--out", str(out), "--ks", "1", "5",
          "--record", str(tmp_path / "world.json")])
    assert "Table 3" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == {"README.md", "stability.csv", "stability_pairs.csv", "retrieval.csv",
                                               "recovery.csv", "results.json"}
    assert len(list(csv.DictReader(open(out / "stability_pairs.csv")))) == 3 * 12
    rows = list(csv.DictReader(open(out / "stability.csv")))
    assert {r["method"] for r in rows} == {"VLM", "SemCLIP (STE query)", "SemCLIP (Γ_t query)"}
    assert all(0.0 <= float(r["overlap"]) <= 1.0 for r in rows)
    results = json.loads((out / "results.json").read_text())
    assert results["n_pairs"] == 12 and set(results["recovery"]) == {"train", "val"}
    assert len(list(csv.DictReader(open(out / "retrieval.csv")))) == 6
    # --record: Tables 3-4 as one record whose rows render back to the report's two tables
    record = json.loads((tmp_path / "world.json").read_text())
    validate_record(record, "world.json")
    table3, table4 = markdown_tables((out / "README.md").read_text())[:2]
    assert render_table(record, columns=record["columns"][:3], digits=3) == "\n".join(table3) + "\n"
    assert render_table(record, columns=["system", *record["columns"][3:]], digits=3) == "\n".join(table4) + "\n"
    assert record["columns"][:3] == ["system", "overlap_at1", "overlap_at5"] and len(record["columns"]) == 9
    assert record["config"] == [str(path)] and record["seeds"] is None and record["n_pairs"] == 12
    assert record["systems"] == ["VLM", "SemCLIP (STE query)", "SemCLIP (Γ_t query)"] and record["inputs"]["world"] == str(tiny_world)


def test_ties_are_broken_at_random_with_a_seed_not_by_index():
    """Eq. 7 gives images that share their nearest text the same vector: their order must not favour low ids."""
    from grounding.retrieval_metrics import break_ties
    from grounding.semclip.stability import ranked

    scores = torch.tensor([[0.5] * 8 + [0.9, 0.1]])  # 8 tied images between a clear best and a clear worst
    top = ranked(scores, 10)[0].tolist()
    assert top[0] == 8 and top[-1] == 9  # distinct values keep their order
    assert sorted(top[1:9]) == list(range(8)) and top[1:9] != list(range(8))  # ties: shuffled, not index order
    assert ranked(scores, 10)[0].tolist() == top  # the same seed, the same order
    assert ranked(scores, 10, seed=1)[0].tolist() != top
    jittered = break_ties(torch.tensor([[1.0, 1.0 + 1e-6, float("-inf")]]))
    assert jittered[0, 1] > jittered[0, 0] and jittered[0, 2] == float("-inf")  # tiny gaps survive

"""Semantic-space evaluation (VG-BERT §4.1-4.4): math against hand computations, loaders' errors,
embeddings' vocabulary standardisation and checkpoint loading, and one real-data check."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from data_modules import lexical
from grounding.semantic_space import clustering, composition, concreteness, property_norms
from grounding.semantic_space.embeddings import LanguageStream, LanguageStreamError, WordEmbedder, detect_bert_prefix, load_language_stream


# --------------------------------------------------------------------------------------------
# Clustering: Eqs. 12-14 against a loop over the definitions
# --------------------------------------------------------------------------------------------
def _silhouette_by_hand(x, k):
    d = lambda i, j: 1 - x[i] @ x[j] / np.linalg.norm(x[i]) / np.linalg.norm(x[j])  # noqa: E731
    cats = sorted(set(k))
    out = []
    for i in range(len(x)):
        own = [j for j in range(len(x)) if k[j] == k[i] and j != i]
        a = np.mean([d(i, j) for j in own])
        b = np.mean([np.mean([d(i, j) for j in range(len(x)) if k[j] == c]) for c in cats if c != k[i]])
        out.append((b - a) / max(a, b))
    return np.array(out)


def test_modified_silhouette_matches_hand_computation():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(11, 4))
    k = np.array([0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    np.testing.assert_allclose(clustering.modified_silhouette(x, k), _silhouette_by_hand(x, k), atol=1e-12)
    # A tiny case by hand: two tight orthogonal pairs -> a = 0, b = 1, s = 1.
    x2 = np.array([[1.0, 0], [2.0, 0], [0, 1.0], [0, 3.0]])
    np.testing.assert_allclose(clustering.modified_silhouette(x2, np.array([0, 0, 1, 1])), 1.0)
    per_cat = clustering.category_silhouettes(x, k, ["a", "b", "c"])
    np.testing.assert_allclose(per_cat["b"], _silhouette_by_hand(x, k)[3:7].mean())


def test_silhouette_uses_mean_not_min_over_other_categories():
    # Category 2 is close to category 0: the min rule would give b ~ small; the mean rule averages.
    x = np.array([[1, 0, 0], [1, 0.1, 0], [0, 1, 0], [0, 1, 0.1], [1, 0, 0.05], [1, 0.05, 0]], float)
    k = np.array([0, 0, 1, 1, 2, 2])
    s = clustering.modified_silhouette(x, k)
    np.testing.assert_allclose(s, _silhouette_by_hand(x, k), atol=1e-12)
    assert s[0] > 0  # with the minimum, entry 0 would be negative (category 2 is closer than its own)


# --------------------------------------------------------------------------------------------
# Concreteness: PC1 sign rule and correlations
# --------------------------------------------------------------------------------------------
def test_pc1_sign_makes_concrete_positive():
    scores = np.array([[1.0, 5], [2, 4], [3, 3], [4, 2]])
    ratings = np.array([4.0, 3.0, np.nan, 1.0])       # decreasing with column 0: flip
    out, flipped = concreteness.orient_pc1(scores, ratings)
    assert flipped and np.array_equal(out[:, 0], -scores[:, 0]) and np.array_equal(out[:, 1], scores[:, 1])
    out2, flipped2 = concreteness.orient_pc1(scores, -ratings)
    assert not flipped2 and np.array_equal(out2, scores)


def test_concreteness_analysis_on_planted_axis():
    rng = np.random.default_rng(1)
    n_cat, per = 6, 20
    conc_cat = np.linspace(1.5, 4.8, n_cat)
    words = [f"w{i}" for i in range(n_cat * per)]
    k = np.repeat(np.arange(n_cat), per)
    rating = conc_cat[k] + rng.normal(0, 0.2, len(k))
    emb = rng.normal(0, 0.3, (len(k), 8))
    emb[:, 3] += -4 * rating          # the dominant direction, anti-aligned with concreteness
    ratings = {w: r for w, r in zip(words, rating)}
    res = concreteness.concreteness_analysis(emb, words, k, [f"c{i}" for i in range(n_cat)], ratings)
    assert res.pc1_flipped in (True, False) and res.word_r > 0.95 and res.category_r > 0.99
    ref = np.corrcoef(res.entry_scores[:, 0], rating)[0, 1]
    assert res.word_r == pytest.approx(ref)
    assert set(res.extremes.pc) == set(range(1, 7))


# --------------------------------------------------------------------------------------------
# Property norms: LOO lambda selection (our reading of Eqs. 9-10)
# --------------------------------------------------------------------------------------------
def _toy(separable: bool, n=40, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = (X[:, 0] > 0.3).astype(int) if separable else rng.integers(0, 2, n)
    if separable:
        X[:, 0] += np.where(y == 1, 1.5, -1.5)    # a wide margin
    return X, y


def test_loo_picks_smallest_lambda_when_separable_and_largest_for_noise():
    X, y = _toy(separable=True)
    lams = property_norms.lambda_grid(X, y, n_lambdas=6, min_ratio=1e-3)
    fit = property_norms.fit_feature(X, y, lams, loo="exact", patience=None)
    assert fit.best == len(lams) - 1 and fit.f1 == 1.0 and fit.loo_f1 == 1.0
    Xn, yn = _toy(separable=False, n=200, seed=3)
    lams_n = property_norms.lambda_grid(Xn, yn, n_lambdas=6, min_ratio=1e-2)
    fit_n = property_norms.fit_feature(Xn, yn, lams_n, loo="exact", patience=None)
    assert fit_n.best == 0 and fit_n.n_active == 0


def test_lambda_max_zeroes_the_weights_and_approximate_loo_tracks_exact():
    X, y = _toy(separable=False, n=60, d=4, seed=5)
    y = ((X[:, 1] + 0.8 * np.random.default_rng(2).normal(size=60)) > 0).astype(int)
    lams = property_norms.lambda_grid(X, y, n_lambdas=5, min_ratio=0.05)
    w, _ = property_norms._fit(X, y, lams[0] * 1.01, tol=1e-8)
    assert np.count_nonzero(w) == 0
    w, b = property_norms._fit(X, y, lams[2], tol=1e-8)
    approx = property_norms.approximate_loo_margins(X, y, w, b)
    exact = property_norms.exact_loo_margins(X, y, lams[2], tol=1e-8)
    assert np.corrcoef(approx, exact)[0, 1] > 0.99
    assert np.abs(approx - exact).max() < 0.15


def test_l1_logistic_regression_is_sparse_on_every_scikit_learn_spelling():
    """Eq. 8's penalty is L1 whatever scikit-learn is installed: before 1.8 `l1_ratio` alone would leave the
    default L2 (dense weights); the fit must zero the 18 noise features of 20 at a moderate lambda."""
    assert property_norms.l1_penalty_args("1.7.2") == {"penalty": "l1"}
    assert property_norms.l1_penalty_args("1.8.0") == {"l1_ratio": 1.0}
    assert property_norms.l1_penalty_args("2.0.1rc1") == {"l1_ratio": 1.0}
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 20))
    y = ((2 * X[:, 0] - 2 * X[:, 1] + 0.3 * rng.normal(size=200)) > 0).astype(int)
    lam = property_norms.lambda_grid(X, y, n_lambdas=4, min_ratio=0.05)[1]
    w, _ = property_norms._fit(X, y, lam, tol=1e-8)
    assert w[0] > 0 > w[1] and np.count_nonzero(w) <= 4  # an L2 fit has 20 non-zero weights


def test_balanced_loss_and_one_sided_wilcoxon():
    y = np.array([1, 0, 0, 0])
    m = np.array([0.0, 0.0, 0.0, 0.0])
    assert property_norms.balanced_loo_loss(m, y) == pytest.approx(2 * np.log(2))
    from scipy import stats

    a, b = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.0]), np.array([0.3, 0.5, 0.4, 0.9, 0.6, 0.0])
    assert property_norms.one_sided_wilcoxon(a, b) == pytest.approx(stats.wilcoxon(b, a, alternative="greater").pvalue)
    assert np.isnan(property_norms.one_sided_wilcoxon(a, a))


# --------------------------------------------------------------------------------------------
# Composition
# --------------------------------------------------------------------------------------------
def test_query_rank_and_neighbours():
    vocab = ["zebra", "horse", "stripe", "car"]
    V = np.array([[1.0, 1, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]])
    q = np.array([[1.0, 0.9, 0]])
    t = composition.query_ranks(q, V[:1], V, ["striped horse"], ["zebra"], vocab)
    assert t["rank"][0] == 1 and t.cosine[0] == pytest.approx(1.9 / np.sqrt(2) / np.sqrt(1.81))
    nb = composition.neighbours(V[1:2], ["horse"], V, vocab, k=2)
    assert list(nb.word) == ["zebra", "stripe"]  # the query itself is excluded


# --------------------------------------------------------------------------------------------
# Embeddings: vocabulary standardisation, caching, checkpoints
# --------------------------------------------------------------------------------------------
@pytest.fixture()
def small_stream(monkeypatch, tmp_path):
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    from transformers import BertConfig, BertModel

    from grounding.encoders import load_tokenizer

    tok = load_tokenizer("tiny-random")
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=16, max_position_embeddings=32), add_pooling_layer=False).eval()
    return LanguageStream("small", "test", model, tok, {"test": "small"})


def test_standardisation_uses_vocabulary_statistics(small_stream):
    emb = WordEmbedder(small_stream, batch_size=64)
    mean, std = emb.vocabulary_stats()
    tok, n = small_stream.tokenizer, small_stream.model.get_input_embeddings().num_embeddings
    ids = torch.arange(n)[:, None]
    seq = torch.cat([torch.full_like(ids, tok.cls_token_id), ids, torch.full_like(ids, tok.sep_token_id)], 1)
    with torch.no_grad():
        ref = small_stream.model(input_ids=seq).last_hidden_state.mean(1).double().numpy()  # [CLS],[SEP] included
    np.testing.assert_allclose(mean, ref.mean(0), atol=1e-5)
    np.testing.assert_allclose(std, ref.std(0), rtol=1e-4)
    words = ["zebra", "striped horse"]
    enc = tok(words, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = small_stream.model(**enc).last_hidden_state
    m = enc["attention_mask"].unsqueeze(-1).float()
    raw = ((h * m).sum(1) / m.sum(1)).numpy()
    np.testing.assert_allclose(emb.embed(words), (raw - mean) / std, rtol=1e-4, atol=1e-4)
    # The cache returns the same vectors in a fresh embedder.
    again = WordEmbedder(small_stream)
    assert (again.cache_folder / "embeddings.npz").is_file()
    np.testing.assert_allclose(again.embed(words), emb.embed(words), atol=1e-6)


def test_checkpoint_language_stream_prefix_detection(tmp_path, monkeypatch):
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    ref = load_language_stream("tiny-random", seed=7)
    state = {f"language_stream.bert.{k}": v.clone() for k, v in ref.model.state_dict().items()}
    state["visual_stream.conv.weight"] = torch.zeros(2)
    path = tmp_path / "model.ckpt"
    torch.save({"state_dict": state, "hyper_parameters": {"text_encoder": "tiny-random"}}, path)
    assert detect_bert_prefix(state) == "language_stream.bert."
    loaded = load_language_stream(str(path))
    assert loaded.identity["prefix"] == "language_stream.bert." and loaded.name == "model"
    for k, v in ref.model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[k], v)
    state2 = {**state, "teacher.embeddings.word_embeddings.weight": torch.zeros(1)}
    with pytest.raises(LanguageStreamError, match="several BERT-like modules"):
        detect_bert_prefix(state2)
    with pytest.raises(LanguageStreamError, match="does not exist"):
        load_language_stream(str(tmp_path / "missing.ckpt"))


def test_vocabulary_sample_statistics_come_from_the_sampled_ids(small_stream):
    emb = WordEmbedder(small_stream, batch_size=64, vocabulary_sample=50, seed=3)
    mean, std = emb.vocabulary_stats()
    tok, n = small_stream.tokenizer, small_stream.model.get_input_embeddings().num_embeddings
    ids = torch.randperm(n, generator=torch.Generator().manual_seed(3))[:50].sort().values[:, None]
    seq = torch.cat([torch.full_like(ids, tok.cls_token_id), ids, torch.full_like(ids, tok.sep_token_id)], 1)
    with torch.no_grad():
        ref = small_stream.model(input_ids=seq).last_hidden_state.mean(1).double().numpy()
    np.testing.assert_allclose(mean, ref.mean(0), atol=1e-5)
    np.testing.assert_allclose(std, ref.std(0), rtol=1e-4)
    # Sampled and full statistics are cached under different names: neither is mistaken for the other.
    full = WordEmbedder(small_stream, batch_size=64)
    assert not np.allclose(full.vocabulary_stats()[0], mean)
    assert {p.name for p in emb.cache_folder.glob("vocab_stats*.npz")} == {"vocab_stats.npz", "vocab_stats_sample50_seed3.npz"}


def test_language_stream_of_a_real_suite_checkpoint(tmp_path, monkeypatch):
    """A checkpoint written by Lightning for a VG-BERT stage loads as that stage's BERT (prefix
    ``model.language.bert.`` found automatically, architecture from the saved hyperparameters)."""
    import lightning as L

    from grounding.vgbert.pretrain import GroundingPretrain, MatchMapGrounding

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(0)
    module = GroundingPretrain(MatchMapGrounding(text_encoder="tiny-random", backbone="tiny_cnn", backbone_weights=None,
                                                 visual_heads=4, trainable_layers=1, image_size=32), feature_cache=False)
    with torch.no_grad():  # make the BERT differ from a fresh tiny-random one
        module.model.language.bert.embeddings.word_embeddings.weight.add_(1.0)
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.strategy.connect(module)
    path = tmp_path / "stage1.ckpt"
    trainer.save_checkpoint(path)
    loaded = load_language_stream(str(path), "Grounded")
    assert loaded.identity["prefix"] == "model.language.bert." and loaded.identity["arch"] == "tiny-random"
    expected = module.model.language.bert.state_dict()
    for k, v in loaded.model.state_dict().items():
        assert torch.equal(v, expected[k]), k
    # Its embeddings differ from the ungrounded encoder's (the report compares real weights).
    ungrounded = WordEmbedder(load_language_stream("tiny-random"), cache=False).raw(["zebra"])
    assert not np.allclose(WordEmbedder(loaded, cache=False).raw(["zebra"]), ungrounded)


def test_report_configs_name_only_known_options():
    import yaml

    from grounding.paths import EXPERIMENTS_DIR
    from grounding.semantic_space.report import merge_config

    paths = sorted((EXPERIMENTS_DIR / "semantic_space").glob("*.yaml"))
    assert {p.stem for p in paths} >= {"minilm", "vgbert", "demo"}
    for p in paths:
        cfg = merge_config(yaml.safe_load(p.read_text())["semantic_space"])
        assert len(cfg["models"]) >= 2, p


# --------------------------------------------------------------------------------------------
# Loaders
# --------------------------------------------------------------------------------------------
def test_loaders_parse_and_explain_errors(tmp_path):
    sem = tmp_path / "semcat"
    sem.mkdir()
    (sem / "animal-3.txt").write_text("zebra\nhorse\nPanda\n")
    (sem / "car-2.txt").write_text("car\nhorse\n")
    s = lexical.load_semcat(sem)
    assert s.categories == ["animal", "car"] and s.words[2] == "panda" and s.vocabulary == ["zebra", "horse", "panda", "car"]
    (sem / "bad-5.txt").write_text("one\n")
    with pytest.raises(lexical.LexicalDataError, match="holds 1 words but its name says 5"):
        lexical.load_semcat(sem)
    with pytest.raises(lexical.LexicalDataError, match="SemCat folder not found"):
        lexical.load_semcat(tmp_path / "nope")

    conc = tmp_path / "conc.txt"
    conc.write_text("Word\tBigram\tConc.M\tConc.SD\nZebra\t0\t4.9\t0.3\nbaking soda\t1\t5\t0\n")
    assert lexical.load_concreteness(conc) == {"zebra": 4.9, "baking soda": 5.0}
    conc.write_text("Word\tConcreteness\nzebra\t4.9\n")
    with pytest.raises(lexical.LexicalDataError, match=r"columns \['Word', 'Bigram', 'Conc.M'\]"):
        lexical.load_concreteness(conc)

    norms = tmp_path / "norms.dat"
    head = "domain\tfeature type\tconcept\tfeature\tpf\tfeature alternatives\tparticipant list\n"
    rows = [f"living\tvisual perceptual\tc{i}\thas stripes\t{6 if i < 5 else 3}\tx\tp 1\n" for i in range(8)]
    rows += ["living\ttaxonomic\tbat_(animal)\tis an animal\t9\tx\tp\n"]
    norms.write_text(head + "".join(rows))
    n = lexical.load_cslb_norms(norms)
    assert n.features == ["has stripes"] and n.labels.sum() == 5 and n.labels.shape == (9, 1)
    assert n.concept_texts()[0] == "bat" and n.concept_texts(keep_sense=True)[0] == "bat animal"
    norms.write_text(head + "living\tvisual perceptual\tc0\thas x\tmany\tx\tp\n")
    with pytest.raises(lexical.LexicalDataError, match="integer pf"):
        lexical.load_cslb_norms(norms)
    with pytest.raises(lexical.LexicalDataError, match="CSLB norms file not found"):
        lexical.load_cslb_norms(tmp_path / "missing.dat")


# --------------------------------------------------------------------------------------------
# Real data
# --------------------------------------------------------------------------------------------
@pytest.mark.shared_data
def test_concreteness_end_to_end_on_semcat_subset(shared_data, tmp_path, monkeypatch):
    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    semcat = lexical.load_semcat(shared_data / "semcat").subset(
        ["animal", "emotions", "car", "math", "birds", "virtues"], max_words_per_category=12)
    ratings = lexical.load_concreteness(lexical.default_path("concreteness", shared_data))
    norms = lexical.load_cslb_norms(lexical.default_path("cslb", shared_data))
    assert norms.labels.shape == (638, 390)  # the paper's 390 features
    stream = load_language_stream("tiny-random")
    emb = WordEmbedder(stream, cache=False)
    d = stream.model.config.hidden_size
    emb._stats = (np.zeros(d, np.float32), np.ones(d, np.float32))  # vocabulary statistics are tested above
    x = emb.embed(semcat.words)
    res = concreteness.concreteness_analysis(x, semcat.words, semcat.category_index, semcat.categories, ratings)
    assert res.n_rated_entries > 50 and res.word_r >= 0 and -1 <= res.category_r <= 1
    assert len(res.categories) == 6 and res.categories.mean_concreteness.between(1, 5).all()
    # Concrete categories are rated above abstract ones (a sanity check on the loader join).
    c = res.categories.set_index("category").mean_concreteness
    assert c["animal"] > c["emotions"] and c["car"] > c["virtues"]


# --------------------------------------------------------------------------------------------
# Command line (jsonargparse): configs, flags, errors
# --------------------------------------------------------------------------------------------
def _cli_config(argv):
    from grounding.semantic_space.__main__ import build_parser, config_from_args
    from grounding.semantic_space.report import merge_config
    from grounding.stage_config import config_options_first

    return merge_config(config_from_args(build_parser().parse_args(config_options_first(argv))))


def test_cli_reads_the_report_configs_and_flags_win():
    import yaml

    from grounding.paths import EXPERIMENTS_DIR
    from grounding.semantic_space.report import merge_config

    for p in sorted((EXPERIMENTS_DIR / "semantic_space").glob("*.yaml")):
        assert _cli_config(["--config", str(p)]) == merge_config(yaml.safe_load(p.read_text())["semantic_space"]), p
    demo = str(EXPERIMENTS_DIR / "semantic_space" / "demo.yaml")
    cfg = _cli_config(["--out", "elsewhere", "--config", demo, "--n-jobs", "4", "--no-cache", "--loo", "exact",
                       "--names", "A", "B", "C", "--embedding.batch_size", "8"])
    assert cfg["out"] == "elsewhere" and [m["name"] for m in cfg["models"]] == ["A", "B", "C"]
    assert cfg["models"][1]["source"].endswith("stage1_tiny/checkpoints/last.ckpt") and cfg["models"][1]["prefix"] == "auto"
    assert cfg["property_norms_part"]["n_jobs"] == 4 and cfg["property_norms_part"]["n_components"] == 32
    assert cfg["property_norms_part"]["loo"] == "exact"
    assert cfg["embedding"] == {"batch_size": 8, "pool_special_tokens": True, "max_length": 32, "cache": False,
                                "vocabulary_sample": 4096}
    cfg = _cli_config(["--models", "minilm", "a.ckpt", "--names", "M", "G", "--prefix", "auto", "model.bert.",
                       "--vocabulary-sample", "64", "--n-components", "5"])
    assert cfg["models"] == [
        {"name": "M", "prefix": "auto", "text_encoder": None, "tokenizer": None, "model_class": None, "source": "minilm"},
        {"name": "G", "prefix": "model.bert.", "text_encoder": None, "tokenizer": None, "model_class": None,
         "source": "a.ckpt"}]
    assert cfg["embedding"]["vocabulary_sample"] == 64 and cfg["property_norms_part"]["n_components"] == 5


def test_cli_errors_are_one_line_and_exit_2(tmp_path, capsys):
    from grounding.semantic_space.__main__ import main

    nested = tmp_path / "nested.yaml"
    nested.write_text("semantic_space:\n  models: [minilm]\n  embedding: {batch_sise: 8}\n")
    top = tmp_path / "top.yaml"
    top.write_text("models: [minilm]\nouts: x\n")
    for argv, needle in [(["--config", str(nested)], "embedding.batch_sise"), (["--config", str(top)], "outs"),
                         (["--models", "minilm", "--bogus"], "--bogus"), ([], "no models given"),
                         (["--models", "minilm", "x", "--names", "a"], "one value per model"),
                         (["--models", "minilm", "--parts", "nope"], "unknown parts"),
                         (["--models", "minilm", "--loo", "maybe"], "maybe"),
                         (["--models", "{source: minilm, name: A, B}"], "unknown key")]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err, (argv, err)
        assert all(str(p) in err for p in argv if p.endswith(".yaml"))


def test_cli_writes_a_report(tmp_path, monkeypatch, capsys):
    from grounding.docs_tables import validate_record
    from grounding.semantic_space.__main__ import main

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    sem = tmp_path / "semcat"
    sem.mkdir()
    (sem / "animal-3.txt").write_text("zebra\nhorse\npanda\n")
    (sem / "car-2.txt").write_text("car\nbus\n")
    out, record = tmp_path / "report", tmp_path / "records" / "sem.json"
    assert main(["--models", "tiny-random", "tiny-random", "--names", "A", "B", "--semcat", str(sem), "--parts",
                 "clustering", "--vocabulary-sample", "64", "--no-cache", "--out", str(out), "--record", str(record)]) == 0
    assert (out / "report.md").is_file() and (out / "silhouettes.csv").is_file()
    assert "total:" in capsys.readouterr().out
    written = json.loads(record.read_text(encoding="utf-8"))  # --record: the intervals.csv rows, one a measure
    validate_record(written, str(record))
    assert [r["measure"] for r in written["rows"]] == ["silhouette (categories)", "nearest-category accuracy (categories)"]
    assert written["labels"]["m1"] == "B" and written["rows"][0]["d1"] == 0 and written["seeds"] is None


# --------------------------------------------------------------------------------------------
# Paired bootstrap intervals
# --------------------------------------------------------------------------------------------
def test_interval_statistics_match_scipy_and_pair_the_resamples():
    from scipy import stats

    from grounding.semantic_space import intervals

    rng = np.random.default_rng(0)
    gold = rng.normal(size=40)
    scores = np.stack([gold + rng.normal(size=40), gold + 0.3 * rng.normal(size=40)])
    full = np.arange(40)[None]
    r = intervals.pearson_statistic(scores, gold)(full)[:, 0]
    assert r == pytest.approx([stats.pearsonr(s, gold).statistic for s in scores])
    ties = np.round(scores, 0)  # ties averaged, as scipy
    rho = intervals.spearman_statistic(ties, gold)(full)[:, 0]
    assert rho == pytest.approx([stats.spearmanr(s, gold).statistic for s in ties])
    idx = intervals.resample_indices(40, 7, seed=3)
    by_hand = [stats.spearmanr(ties[1, i], gold[i]).statistic for i in idx]
    assert intervals.spearman_statistic(ties, gold)(idx)[1] == pytest.approx(by_hand)

    iv = intervals.paired_bootstrap(intervals.pearson_statistic(scores, gold), 40, ["A", "B"], "r", "items",
                                    n_resamples=300, seed=0)
    assert iv.value == pytest.approx(r) and iv.diff[0] == 0 and iv.diff[1] == pytest.approx(r[1] - r[0])
    assert np.all(iv.low <= iv.value) and np.all(iv.value <= iv.high)
    assert iv.diff_low[1] > 0  # B tracks gold far better: the paired interval excludes 0
    again = intervals.paired_bootstrap(intervals.pearson_statistic(scores, gold), 40, ["A", "B"], "r", "items",
                                       n_resamples=300, seed=0)
    assert np.array_equal(iv.low, again.low) and np.array_equal(iv.diff_high, again.diff_high)  # seeded
    # paired: a model that is the reference plus a constant has a zero-width difference interval
    values = np.stack([rng.random(30), np.zeros(30)])
    values[1] = values[0] + 0.25
    shift = intervals.paired_bootstrap(intervals.mean_statistic(values), 30, ["A", "B"], "mean", "items", 200)
    assert shift.diff_low[1] == pytest.approx(0.25) and shift.diff_high[1] == pytest.approx(0.25)
    assert shift.low[0] < shift.high[0]
    md = intervals.markdown([iv, shift])
    assert "Δ B − A" in md and " *" in md and md.count("\n") == 3


def test_nearest_category_accuracy_by_hand():
    from grounding.semantic_space import clustering

    # two tight categories and an entry of category 0 that sits with category 1
    x = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9], [0.05, 1.0], [-1.0, -0.1]])
    k = np.array([0, 0, 1, 1, 0, 2])  # entry 4 is labelled 0 but lies in 1; category 2 has one entry
    correct = clustering.nearest_category_correct(x, k)
    assert correct[:4].tolist() == [1.0, 1.0, 1.0, 1.0] and correct[4] == 0.0 and np.isnan(correct[5])
    assert clustering.per_category_mean(correct, k, 3)[:2] == pytest.approx([2 / 3, 1.0])


def test_report_intervals_and_word_similarity(tmp_path, monkeypatch):
    """Two copies of one stream: every paired difference is exactly 0; the word-similarity part reads the sets."""
    import pandas as pd

    from grounding.semantic_space.report import run_report

    monkeypatch.setenv("GROUNDING_CACHE", str(tmp_path / "cache"))
    sem = tmp_path / "semcat"
    sem.mkdir()
    (sem / "animal-4.txt").write_text("zebra\nhorse\npanda\ndog\n")
    (sem / "vehicle-3.txt").write_text("car\nbus\ntrain\n")
    (sem / "feeling-3.txt").write_text("joy\nfear\nanger\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "EN-TINY-6.txt").write_text("car\tbus\t8\nzebra\thorse\t7\njoy\tcar\t1\ndog\tpuppy\t9\nfear\tanger\t6\n"
                                      "train\tpanda\t2\n")
    out = run_report({"models": [{"source": "tiny-random", "name": "A"}, {"source": "tiny-random", "name": "B"}],
                      "semcat": str(sem), "word_similarity": str(ws), "parts": ["clustering", "word_similarity"],
                      "embedding": {"vocabulary_sample": 64, "cache": False},
                      "intervals_part": {"n_resamples": 50}, "out": str(tmp_path / "report")})
    frame = pd.read_csv(out / "intervals.csv")
    assert set(frame.measure) == {"silhouette (categories)", "nearest-category accuracy (categories)",
                                  "word similarity: EN-TINY-6"}
    assert (frame["diff"] == 0).all() and (frame.diff_low == 0).all() and (frame.diff_high == 0).all()
    assert set(frame.n_units) == {3, 6}
    md = (out / "report.md").read_text()
    assert "## Paired bootstrap intervals" in md and "## Word similarity" in md and "EN-TINY-6" in md
    assert pd.read_csv(out / "word_similarity.csv").pairs.tolist() == [6]
    none = run_report({"models": ["tiny-random"], "semcat": str(sem), "parts": ["clustering"], "out": str(tmp_path / "r2"),
                       "embedding": {"vocabulary_sample": 64, "cache": False}, "intervals_part": {"n_resamples": 0}})
    assert not (none / "intervals.csv").exists()


def _interval(measure, values, lows, highs, diffs, diff_lows, diff_highs, models=("MiniLM", "G6000", "G753")):
    from grounding.semantic_space.intervals import Interval

    return Interval(measure, "SemCat categories", 100, list(models), *(np.array(v, dtype=float) for v in
                                                                      (values, lows, highs, diffs, diff_lows, diff_highs)))


def test_intervals_record_rows_by_hand(tmp_path):
    """The record of a report's intervals (--record): one row a measure, each model's value and interval, each later
    model's paired difference, the labels naming the models; it follows the docs' record schema and renders."""
    from grounding.docs_tables import provenance, render_table, validate_record
    from grounding.semantic_space.intervals import record_rows
    from grounding.semantic_space.report import write_intervals_record

    found = [_interval("silhouette (categories)", [0.109, 0.132, 0.116], [0.101, 0.122, 0.108], [0.119, 0.143, 0.126],
                       [0.0, 0.022, 0.007], [0.0, 0.019, 0.005], [0.0, 0.026, 0.008]),
             _interval("word similarity: MEN", [0.754, np.nan, 0.763], [0.74, np.nan, 0.75], [0.77, np.nan, 0.78],
                       [0.0, np.nan, 0.009], [0.0, np.nan, 0.004], [0.0, np.nan, 0.014])]
    columns, labels, rows = record_rows(found, confidence=0.95)
    assert columns == ["measure", "units", "n_units", "m0", "m0_ci", "m1", "m1_ci", "m2", "m2_ci", "d1", "d1_ci", "d2", "d2_ci"]
    assert labels["m0"] == "MiniLM" and labels["m2"] == "G753" and labels["d1"] == "Δ G6000 − MiniLM"
    assert labels["m1_ci"] == "95 % CI" and labels["d2_ci"] == "paired 95 % CI"
    assert rows[0] == {"measure": "silhouette (categories)", "units": "SemCat categories", "n_units": 100,
                       "m0": 0.109, "m0_low": 0.101, "m0_high": 0.119, "m1": 0.132, "m1_low": 0.122, "m1_high": 0.143,
                       "m2": 0.116, "m2_low": 0.108, "m2_high": 0.126, "d1": 0.022, "d1_low": 0.019, "d1_high": 0.026,
                       "d2": 0.007, "d2_low": 0.005, "d2_high": 0.008,
                       "paper": "up (§4.3, Fig. 5: categories cluster better)"}
    assert rows[1]["m1"] is None and rows[1]["d1_high"] is None and rows[1]["d2"] == 0.009  # not finite: null
    assert rows[1]["paper"] == "not measured in the paper" and "d0" not in rows[0]
    record = {**provenance(command="python -m grounding.semantic_space --config x.yaml", config="x.yaml", seeds=[0]),
              "labels": labels, "columns": columns, "rows": rows}
    validate_record(record, "by hand")
    table = render_table(record, digits=3)
    assert table.splitlines()[0].startswith("| measure | units | n | MiniLM | 95 % CI | G6000 |")
    assert "| silhouette (categories) | SemCat categories | 100 | 0.109 | [0.101, 0.119] |" in table
    assert "| 0.022 | [0.019, 0.026] | 0.007 | [0.005, 0.008] |" in table and "| 0.754 | [0.740, 0.770] | – | – |" in table
    with pytest.raises(ValueError, match="has models"):
        record_rows([found[0], _interval("x", [1, 2], [1, 2], [1, 2], [0, 1], [0, 1], [0, 1], models=("A", "B"))])
    cfg = {"intervals_part": {"n_resamples": 50, "confidence": 0.9, "seed": 3}, "out": "reports/x", "parts": ["clustering"],
           "models": [{"name": n, "source": n.lower()} for n in ("MiniLM", "G6000", "G753")]}
    written = json.loads(write_intervals_record(tmp_path / "r.json", found, cfg, record).read_text(encoding="utf-8"))
    validate_record(written, "written")
    assert written["rows"] == rows and written["labels"]["m0_ci"] == "90 % CI" and written["resample_seed"] == 3
    assert written["command"] == record["command"] and written["config"] == "x.yaml" and written["seeds"] == [0]
    from grounding.errors import UserInputError

    with pytest.raises(UserInputError, match="no intervals"):
        write_intervals_record(tmp_path / "none.json", [], cfg, record)


def test_cli_record_option_errors_and_provenance(tmp_path, capsys):
    """--record: a bad name or a report without intervals is one line and exit 2 before any work; the record's
    provenance names the command line, the config file and the seed the config names (else null)."""
    from grounding.semantic_space.__main__ import build_parser, main, record_of

    for argv, needle in [(["--models", "minilm", "--record", "bad name"], "record name 'bad name'"),
                         (["--models", "minilm", "--bootstrap", "0", "--record", "x"], "--bootstrap N > 0"),
                         (["--models", "minilm", "--parts", "composition", "--record", "x"], "one of the parts")]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err, (argv, err)
    named = tmp_path / "named.yaml"
    named.write_text("semantic_space:\n  models: [minilm]\n  intervals_part: {seed: 4}\n")
    plain = tmp_path / "plain.yaml"
    plain.write_text("models: [minilm]\n")
    for argv, config, seeds in [(["--config", str(named), "--record", "sem_x"], str(named), [4]),
                                (["--config", str(plain), "--record", str(tmp_path / "r.json")], str(plain), None),
                                (["--config", str(plain), "--intervals_part.seed", "2", "--record", "y"], str(plain), [2]),
                                (["--models", "minilm", "--record", "z"], None, None)]:
        args = build_parser().parse_args(argv)
        from grounding.semantic_space.__main__ import config_from_args
        from grounding.semantic_space.report import merge_config

        path, keys = record_of(args, argv, merge_config(config_from_args(args)))
        assert keys["config"] == config and keys["seeds"] == seeds, argv
        assert keys["command"].startswith("python -m grounding.semantic_space ") and argv[-1] in keys["command"]
        assert str(path).endswith(".json") and (path.parts[:2] == ("docs", "records") or path == tmp_path / "r.json")
    assert record_of(build_parser().parse_args(["--models", "minilm"]), [], {}) == (None, None)


# --------------------------------------------------------------------------------------------
# Seeds: one grounded model trained several times, summarised over its reports
# --------------------------------------------------------------------------------------------
def _intervals_csv(path, model, rows, reference="MiniLM"):
    """A report's intervals.csv: rows of (measure, reference value, model value, Δ low, Δ high)."""
    import pandas as pd

    path.mkdir(parents=True)
    records = []
    for measure, ref, value, low, high in rows:
        records.append(dict(measure=measure, units="items", n_units=10, model=reference, value=ref, low=ref - .1,
                            high=ref + .1, diff=0.0, diff_low=0.0, diff_high=0.0))
        records.append(dict(measure=measure, units="items", n_units=10, model=model, value=value, low=value - .1,
                            high=value + .1, diff=value - ref, diff_low=low, diff_high=high))
    pd.DataFrame(records).to_csv(path / "intervals.csv", index=False)
    return path


def test_seeds_summary_by_hand(tmp_path, capsys):
    """Three seeds: Δ's mean and sample sd by hand, and each measure's verdict from its seeds' paired intervals."""
    import pandas as pd

    from grounding.semantic_space.seeds import main, summarise

    rows = {  # measure: (reference, [grounded value per seed], [(Δ low, Δ high) per seed])
        "silhouette (categories)": (0.1, [0.13, 0.12, 0.14], [(0.01, 0.05), (0.005, 0.03), (0.02, 0.06)]),
        "concreteness r (entries)": (0.6, [0.4, 0.3, 0.35], [(-0.3, -0.1), (-0.4, -0.2), (-0.3, -0.2)]),
        "word similarity: MEN": (0.7, [0.72, 0.69, 0.71], [(0.01, 0.03), (-0.02, 0.0), (-0.01, 0.03)]),
    }
    seeds = []
    for i in range(3):
        name = f"Grounded, seed {i}"
        path = _intervals_csv(tmp_path / f"r{i}", name, [(m, ref, v[i], *ci[i]) for m, (ref, v, ci) in rows.items()])
        seeds.append((path if i else path / "intervals.csv", name))  # a folder or the file itself
    summary = summarise(seeds).set_index("measure")
    assert list(summary.index) == list(rows)
    sil = summary.loc["silhouette (categories)"]
    assert sil.diff_mean == pytest.approx(0.03) and sil.diff_sd == pytest.approx(0.01)  # Δ = .03, .02, .04
    assert sil.value_mean == pytest.approx(0.13) and sil.reference_sd == pytest.approx(0.0)
    assert (sil.seeds_up, sil.seeds_down) == (3, 0)
    con = summary.loc["concreteness r (entries)"]
    assert con.diff_mean == pytest.approx(-0.25) and con.diff_sd == pytest.approx(0.05)  # Δ = -.2, -.3, -.25
    assert (con.seeds_up, con.seeds_down) == (0, 3)
    men = summary.loc["word similarity: MEN"]
    assert (men.seeds_up, men.seeds_down) == (1, 0)  # (-0.02, 0.0) touches 0: not below it
    assert men.diff_seed1 == pytest.approx(-0.01) and men.diff_low_seed1 == pytest.approx(-0.02)

    out = tmp_path / "seeds"
    argv = [a for path, name in seeds for a in ("--seed", str(path), name)] + ["--out", str(out)]
    assert main(argv) == 0
    md = (out / "seeds.md").read_text()
    assert "| silhouette (categories) | 10 items | 0.100 ± 0.000 | 0.130 ± 0.010 | +0.030 ± 0.010 |" in md
    assert "consistent up" in md and "consistent down" in md and "1 up, 0 down, 2 include 0" in md
    assert pd.read_csv(out / "seeds.csv").seeds.tolist() == [3, 3, 3]
    one = summarise(seeds[:1]).set_index("measure")  # one seed: no sd
    assert np.isnan(one.loc["silhouette (categories)", "diff_sd"])


def test_seeds_record_holds_the_per_seed_table(tmp_path, capsys):
    """``--record``: a record of the schema, a row per measure with seeds.csv's numbers, each seed's Δ interval as
    ``diff_seed<i>_ci``, the verdict and paper columns of seeds.md; config the report folders' config.yaml."""
    import json

    import pandas as pd

    from grounding.docs_tables import validate_record
    from grounding.semantic_space.seeds import main

    rows = {"silhouette (categories)": (0.1, [0.13, 0.12], [(0.01, 0.05), (0.005, 0.03)]),
            "word similarity: MEN": (0.7, [0.72, 0.69 + 1 / 3], [(0.01, 0.03), (-0.02, 0.0)])}
    seeds = [(_intervals_csv(tmp_path / f"r{i}", f"G{i}", [(m, ref, v[i], *ci[i]) for m, (ref, v, ci) in rows.items()]),
              f"G{i}") for i in range(2)]
    (seeds[0][0] / "config.yaml").write_text("models: []\n")
    out, path = tmp_path / "seeds", tmp_path / "records" / "s.json"
    assert main([a for p, n in seeds for a in ("--seed", str(p), n)] + ["--out", str(out), "--record", str(path)]) == 0
    record = json.loads(path.read_text())
    validate_record(record, str(path))
    assert record["config"] == [str(seeds[0][0] / "config.yaml")] and record["seeds"] is None
    assert record["columns"][:3] == ["measure", "n_units", "units"] and record["labels"]["reference_mean"] == "MiniLM"
    assert {"diff_seed1", "diff_seed1_ci", "verdict", "paper"} <= set(record["columns"])
    table = pd.read_csv(out / "seeds.csv")
    assert [r["measure"] for r in record["rows"]] == table.measure.tolist()
    for written, (_, row) in zip(record["rows"], table.iterrows()):
        for column, value in row.items():
            assert written[column] == (value if isinstance(value, str) else pytest.approx(float(value), abs=0)), column
        assert written["diff_seed1_ci"] == [row.diff_low_seed1, row.diff_high_seed1]
    md = (out / "seeds.md").read_text()
    assert [r["verdict"] for r in record["rows"]] == ["consistent up", "1 up, 0 down, 1 include 0"]
    assert all(f"| {r['verdict']} | {r['paper']} |" in md for r in record["rows"])


def test_seeds_record_bad_names_are_one_line_before_any_work(tmp_path, capsys):
    from grounding.errors import user_errors_exit
    from grounding.semantic_space import seeds as seeds_module

    (tmp_path / "file").write_text("x")
    for name in ("bad name!", str(tmp_path), str(tmp_path / "file" / "x.json")):
        with pytest.raises(SystemExit) as exited, user_errors_exit(seeds_module.PROG):
            seeds_module.main(["--seed", str(tmp_path / "none"), "G0", "--out", str(tmp_path / "out"), "--record", name])
        lines = capsys.readouterr().err.strip().splitlines()
        assert exited.value.code == 2 and len(lines) == 2 and "none" not in lines[0], lines
        assert "--record " in lines[0] or "record name " in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_seeds_summary_errors_are_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    import subprocess
    import sys

    from grounding.errors import user_errors_exit
    from grounding.semantic_space import seeds as seeds_module

    monkeypatch.delenv("GROUNDING_DEBUG", raising=False)

    a = _intervals_csv(tmp_path / "a", "G0", [("silhouette (categories)", 0.1, 0.12, 0.01, 0.03)])
    b = _intervals_csv(tmp_path / "b", "G1", [("silhouette (categories)", 0.1, 0.12, 0.01, 0.03)], reference="Bert")
    c = _intervals_csv(tmp_path / "c", "G2", [("word similarity: MEN", 0.7, 0.72, 0.01, 0.03)])
    (tmp_path / "bad.csv").write_text("measure,model\nx,y\n")
    (tmp_path / "file").write_text("keep me")
    cases = [(["--seed", str(a), "G9"], "no grounded model named 'G9'"),
             (["--seed", str(a), "MiniLM"], "no grounded model named 'MiniLM'"),
             (["--seed", str(tmp_path / "none"), "G0"], "no such file"),
             (["--seed", str(tmp_path / "bad.csv"), "G0"], "columns"),
             (["--seed", str(a), "G0", "--seed", str(b), "G1"], "different reference models"),
             (["--seed", str(a), "G0", "--seed", str(c), "G2"], "measures differ"),
             (["--seed", str(a), "G0", "--out", str(tmp_path / "file")], "a file is in the way")]
    for i, (argv, needle) in enumerate(cases):
        argv = argv + ([] if "--out" in argv else ["--out", str(tmp_path / "out")])
        if i == 0:  # the command itself once, in its own process; the other cases through the same wrapper in this one
            done = subprocess.run([sys.executable, "-m", "grounding.semantic_space.seeds", *argv], capture_output=True,
                                  text=True)
            code, stderr = done.returncode, done.stderr
        else:
            capsys.readouterr()
            with pytest.raises(SystemExit) as exited, user_errors_exit(seeds_module.PROG):
                seeds_module.main(argv)
            code, stderr = exited.value.code, capsys.readouterr().err
        assert code == 2, (argv, stderr)
        lines = stderr.strip().splitlines()  # the error, then the suite's GROUNDING_DEBUG hint
        assert len(lines) <= 2 and needle in lines[0] and "Traceback" not in stderr, (argv, stderr)
    assert (tmp_path / "file").read_text() == "keep me" and not (tmp_path / "out").exists()

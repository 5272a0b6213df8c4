"""COMPOSER's Table 6 cost (grounding/composer/cost.py, `python -m grounding.composer cost`): parameters per
part, FLOPs per (image, caption) pair against hand counts, growth with the Composition Transformer's depth."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from grounding.composer import ConceptGraph, extract_crg
from grounding.composer.__main__ import main
from grounding.composer.batch import PLACEHOLDER_TYPES, TokenTables, composition_batch
from grounding.composer.cost import (
    APP_A_CAPTION,
    FROZEN_BACKBONE,
    PARTS,
    build_composer,
    composer_cost,
    composer_flops,
    composer_parameters,
    region_inputs,
)
from grounding.composer.model import Composer
from grounding.composer.parsing import backend_available
from grounding.encoders import MissingWeightsError, load_tokenizer
from grounding.nets import constructor_args, regrouped_spec

# App. A's example as the spacy backend parses it: "two [NNS]" and "the [NN]", then "[NP] are running on [NP]"
TREE = "(S (NP (CD two) (NNS dogs)) (VP (VBP are) (VBG running) (PP (IN on) (NP (DT the) (NN grass)))))"
D, REGION_DIM, N = 32, 7, 3  # tiny-random's width, a detector feature width, regions
TINY = dict(text_encoder="tiny-random", pt_layers=2, region_source="files", region_dim=REGION_DIM, heads=2, co_dim=16,
            co_heads=2, ct_layers=3, dropout=0.0)


def tiny_net(**kw) -> Composer:
    torch.manual_seed(0)
    return Composer(**constructor_args(Composer, {**TINY, **kw})).eval()


def app_a_batch() -> dict:
    graph = ConceptGraph.build([extract_crg(TREE)], [0], ["0.jpg"])
    return composition_batch(graph, TokenTables(graph, load_tokenizer("tiny-random"), [APP_A_CAPTION]), [0])


def test_parameter_parts_sum_to_the_network():
    for kw in ({}, {"region_source": "grid", "backbone": "tiny_cnn", "backbone_weights": None}, {"modulator": "replace"}):
        net = tiny_net(**kw)
        parts = composer_parameters(net)
        assert sum(parts.values()) == sum(p.numel() for p in net.parameters())
        assert set(parts) <= set(PARTS.values())
    parts = composer_parameters(tiny_net())
    assert parts["score θ"] == D + 1  # θ: Linear(d, 1)
    assert parts["region embedding"] == (REGION_DIM * D + D) + (5 * D + D) + 2 * D  # feature, 5-d location, LayerNorm
    assert parts["modulator"] == 3 * 2 * (D * D + D)  # FiLM: MLP_a, MLP_b, MLP_proj, two d x d layers each
    assert FROZEN_BACKBONE in composer_parameters(tiny_net(region_source="grid", backbone="tiny_cnn", backbone_weights=None))


def test_flops_of_simple_parts_by_hand():
    batch = app_a_batch()
    net = tiny_net()
    inputs, n = region_inputs(net, N)
    assert n == N and inputs["features"].shape == (1, N, REGION_DIM)
    flops = composer_flops(net, batch, inputs)
    # a multiply-add is 2 FLOPs: N regions through Linear(7, d) and Linear(5, d); θ on the root concept
    assert flops["region embedding"] == 2 * N * D * (REGION_DIM + 5)
    assert flops["score θ"] == 2 * D
    # FiLM on every bound argument (1 + 1 + 2 of them): three MLPs of two d x d layers
    assert int((batch["app_args"] >= 0).sum()) == 4
    assert flops["modulator"] == 4 * 3 * 2 * 2 * D * D
    assert "other" not in flops


def test_one_layer_composition_transformer_by_hand_attention_included():
    """CT 1 is one text self-attention layer per application: Q, K, V, out (4 d x d), the FFN (d x 64 x d for
    tiny-random) and attention (QKᵀ, AV: 2 x 2 L² d), over 3 applications of the padded template length L."""
    batch = app_a_batch()
    apps, length = int(batch["app_caption"].numel()), batch["template_ids"].shape[1]
    assert apps == 3
    net = tiny_net(ct_layers=1)
    ffn = net.predicate_transformer.config.intermediate_size
    per_app = 2 * length * 4 * D * D + 2 * length * 2 * D * ffn + 4 * length * length * D
    flops = composer_flops(net, batch, region_inputs(net, N)[0])
    assert flops["Composition Transformer"] == apps * per_app


def test_flops_grow_with_ct_layers_and_only_there():
    batch = app_a_batch()
    nets = {ct: tiny_net(ct_layers=ct) for ct in (1, 3, 5, 7)}
    costs = {ct: composer_flops(net, batch, region_inputs(net, N)[0]) for ct, net in nets.items()}
    ct = {k: v["Composition Transformer"] for k, v in costs.items()}
    assert ct[1] < ct[3] < ct[5] < ct[7]
    # from CT 3 on each self/co-attention pair adds the same work (Table 6: "~10G per 2 layers"); the first pair adds
    # less, since the last co-attention block computes only its text direction (the image stream is not read after it)
    assert ct[7] - ct[5] == ct[5] - ct[3] > ct[3] - ct[1]
    for part in ("region embedding", "primitive encoder", "Predicate Transformer", "modulator", "score θ"):
        assert costs[1][part] == costs[3][part] == costs[5][part] == costs[7][part]
    more_regions = composer_flops(nets[3], batch, region_inputs(nets[3], 2 * N)[0])
    assert more_regions["Composition Transformer"] > costs[3]["Composition Transformer"]


def test_report_totals_and_grid_regions():
    batch = app_a_batch()
    net = tiny_net(region_source="grid", backbone="tiny_cnn", backbone_weights=None, image_size=64)
    inputs, n = region_inputs(net)
    assert n == (64 // 16) ** 2  # tiny_cnn: stride 16, one region a cell
    report = composer_cost(net, batch, inputs, n)
    assert report.total_parameters == sum(p.numel() for p in net.parameters())
    assert report.trainable_parameters < report.total_parameters  # the frozen backbone
    assert report.flops[FROZEN_BACKBONE] > 0 and report.pair_flops == sum(report.flops.values()) - report.flops[FROZEN_BACKBONE]
    with pytest.raises(ValueError, match="image_size"):
        region_inputs(net, 10)


def test_bert_base_uncased_without_weights_is_counted_as_its_architecture(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = {"class_path": "grounding.composer.model.Composer",
            "init_args": dict(TINY, text_encoder="bert-base-uncased", pt_layers=1, ct_layers=1, heads=12, co_dim=64, co_heads=4)}
    net, _ = build_composer(spec)
    d, vocab = 768, 30522 + len(PLACEHOLDER_TYPES)
    layer = 4 * (d * d + d) + (d * 3072 + 3072) + (3072 * d + d) + 2 * 2 * d  # attention, FFN, two LayerNorms
    embeddings = vocab * d + 512 * d + 2 * d + 2 * d  # words (+ placeholders), positions, token types, LayerNorm
    assert composer_parameters(net)["Predicate Transformer"] == embeddings + layer
    other = dict(spec, init_args=dict(spec["init_args"], text_encoder="/nonexistent/text-encoder"))
    with pytest.raises(MissingWeightsError):
        build_composer(other)


def tiny_config(tmp_path, **net) -> str:
    cfg = {"model": {"class_path": "grounding.composer.training.ComposerTraining",
                     "init_args": {"net": regrouped_spec({"class_path": "grounding.composer.model.Composer",
                                                           "init_args": {**TINY, **net}})}},
           "data": {"init_args": {"parsing": {"backend": "spacy"}}}}
    path = tmp_path / "composer_tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.mark.skipif(not backend_available("spacy")[0], reason="the spacy parser backend is not installed")
def test_cost_command_prints_and_writes_the_counts(tmp_path, capsys):
    out, config = tmp_path / "cost.json", tiny_config(tmp_path)
    assert main(["cost", "--config", config, "--regions", str(N), "--out", str(out), "--record", str(tmp_path / "parts.json")]) == 0
    text = capsys.readouterr().out
    assert "[NP] are running on [NP]" in text and "Composition Transformer" in text
    report = json.loads(out.read_text())
    assert report["n_regions"] == N and report["total_parameters"] == sum(report["parameters"].values())
    assert report["flops"]["region embedding"] == 2 * N * D * (REGION_DIM + 5)
    assert report["crg"]["primitives"] == ["dogs", "grass"] and report["crg"]["height"] == 2
    # --record: the printed per-part table, the counts of cost.json
    record = _record(tmp_path / "parts.json")
    assert (record["config"], record["columns"]) == (config, ["part", "params_m", "gflops", "gmacs"])
    assert {"config": config, **record["cost"], "table6": []} == report
    rows = {r["part"]: r for r in record["rows"]}
    assert list(rows) == [*[p for p, n in report["parameters"].items() if n or report["flops"].get(p)], "total"]
    assert all((rows[p]["parameters"], rows[p]["flops"]) == (report["parameters"][p], report["flops"].get(p, 0))
               for p in rows if p != "total")
    assert (rows["total"]["parameters"], rows["total"]["flops"], rows["total"]["gmacs"]) == \
        (report["total_parameters"], report["pair_flops"], report["pair_macs"] / 1e9)
    total = next(line for line in text.splitlines() if line.startswith("total")).split()
    assert total[1:] == [f"{rows['total']['params_m']:.2f}M", f"{rows['total']['gflops']:.3f}", f"{rows['total']['gmacs']:.3f}"]


def _record(path):
    from grounding.docs_tables import validate_record

    record = json.loads(path.read_text())
    validate_record(record, str(path))
    return record


@pytest.mark.skipif(not backend_available("spacy")[0], reason="the spacy parser backend is not installed")
def test_cost_table6_record_holds_the_printed_rows(tmp_path, capsys):
    """`cost --table6 --record`: a row per (PT, CT) of Table 6 with the paper's cells as numbers and the counts
    cost.json holds; a record docs_tables accepts."""
    from grounding.composer.cost import TABLE6

    out, config = tmp_path / "cost.json", tiny_config(tmp_path)
    assert main(["cost", "--config", config, "--regions", str(N), "--table6", "--out", str(out),
                 "--record", str(tmp_path / "table6.json")]) == 0
    text = capsys.readouterr().out
    record, report = _record(tmp_path / "table6.json"), json.loads(out.read_text())
    assert record["columns"] == ["pt_layers", "ct_layers", "paper_params_m", "paper_gflops", "params_m", "gflops", "gmacs"]
    assert [(r["pt_layers"], r["ct_layers"], r["parameters"], r["flops"]) for r in record["rows"]] == \
        [(t["pt_layers"], t["ct_layers"], t["total_parameters"], t["pair_flops"]) for t in report["table6"]]
    assert [(r["paper_params_m"], r["paper_gflops"]) for r in record["rows"]] == \
        [(float(p[:-1]), float(f[:-1])) for p, f in TABLE6.values()]
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["PT", "CT"])
    printed = [line.split() for line in lines[head + 1:head + 1 + len(TABLE6)]]
    assert [[int(c[0]), int(c[1]), c[4]] for c in printed] == \
        [[r["pt_layers"], r["ct_layers"], f"{r['params_m']:.2f}M"] for r in record["rows"]]
    assert record["cost"]["total_parameters"] == report["total_parameters"] and f"wrote the record {tmp_path}" in text


def test_cost_command_fails_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["cost", "--config", tiny_config(tmp_path, text_encoder="/nonexistent/text-encoder")]) == 2
    assert "Could not load text encoder '/nonexistent/text-encoder'" in capsys.readouterr().err
    not_composer = tmp_path / "other.yaml"
    not_composer.write_text(yaml.safe_dump({"model": {"class_path": "grounding.vgbert.GroundingPretrain"}}))
    assert main(["cost", "--config", str(not_composer)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "not a COMPOSER model config" in err and len(err.strip().splitlines()) == 1

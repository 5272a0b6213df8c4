"""COMPOSER's cost (Table 6, §5.3): parameters per part and FLOPs per (image, caption) pair.

FLOPs are counted by :class:`torch.utils.flop_counter.FlopCounterMode` on one forward of the real network
(:class:`grounding.composer.model.Composer`: region embedding, primitive encoder, Predicate Transformer, then
the modulator and the Composition Transformer once per predicate application, bottom-up, and θ on the root)
for one caption's Concept & Relation Graph and one image of N regions. The counter counts matrix products
(a multiply-add = 2 FLOPs; MACs = FLOPs / 2) and attention, not element-wise work (norms, GELU, softmax).
Templates and primitives are padded to the longest one of the caption, as the network computes them. A
frozen backbone (``region_source: grid`` / ``boxes``) is counted apart: it runs once per image, its maps are
cached, and the paper's detector features are likewise precomputed.
"""

from __future__ import annotations

import unittest.mock
from dataclasses import asdict, dataclass, field

import torch
from jsonargparse import ArgumentError
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from grounding.encoders import MissingWeightsError, load_tokenizer
from grounding.nets import build_net
from grounding.stage_config import expand_config_bases, stage_config_parser

from . import model as composer_model
from .concept_graph import OK, ConceptGraph
from .graph_build import texts_batch
from .model import Composer
from .parsing import DEFAULT_BACKEND
from .training import ComposerTraining

# App. A / Table 8's first example caption: "two dogs" and "the grass" composed by "[NP] are running on [NP]".
APP_A_CAPTION = "two dogs are running on the grass"
# App. C: "features from up to 100 patches in one image" (Bottom-Up Attention gives 10-100; 36 is also common).
DEFAULT_REGIONS = 100
# Composer's children as Table 6 / App. C name them, in print order; any other child is listed by its own name.
PARTS = {
    "regions": "region embedding",
    "primitive_encoder": "primitive encoder",
    "predicate_transformer": "Predicate Transformer",
    "modulator": "modulator",
    "composition": "Composition Transformer",
    "theta": "score θ",
    "image_gate": "image gate g(x)",
    "composition_gain": "composition scale γ",
    "text_proj": "text projection",
    "backbone": "frozen backbone",
}
FROZEN_BACKBONE = PARTS["backbone"]
# Table 6: (PT layers, CT layers) -> (# params, FLOPS) as the paper prints them.
TABLE6 = {(2, 5): ("129M", "35.40G"), (4, 5): ("143M", "37.11G"), (6, 5): ("157M", "38.40G"),
          (6, 3): ("136M", "29.40G"), (6, 1): ("115M", "19.98G")}
# bert-base-uncased is BertConfig's default architecture: its cost needs no weights (see build_composer).
BERT_BASE_NAMES = ("bert-base-uncased", "google-bert/bert-base-uncased")
ARCHITECTURE_ONLY_NOTE = ("bert-base-uncased weights are not on this machine: its architecture (BertConfig's defaults: 768 "
                          "wide, 12 heads, 3072 FFN, 30,522 word pieces) is built with random weights; parameters and FLOPs "
                          "do not depend on the weights. Word pieces: MiniLM's tokenizer, the same uncased vocabulary.")


@dataclass
class CostReport:
    """Parameters and forward FLOPs of one (image, caption) pair, per part (labels of :data:`PARTS`)."""

    parameters: dict[str, int]
    flops: dict[str, int]
    n_regions: int
    region_source: str
    caption: str
    crg: dict = field(default_factory=dict)
    trainable_parameters: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def total_parameters(self) -> int:
        return sum(self.parameters.values())

    @property
    def pair_flops(self) -> int:
        """FLOPs of one (image, caption) pair, the frozen backbone excluded (Table 6's FLOPS)."""
        return sum(v for k, v in self.flops.items() if k != FROZEN_BACKBONE)

    def as_dict(self) -> dict:
        return {**asdict(self), "total_parameters": self.total_parameters, "pair_flops": self.pair_flops,
                "pair_macs": self.pair_flops // 2}


# ------------------------------------------------------------------------------------------ counting
def _children(net: Composer) -> list[tuple[str, nn.Module]]:
    """The network's children in :data:`PARTS` order (any other child last)."""
    order = list(PARTS)
    return sorted(net.named_children(), key=lambda kv: order.index(kv[0]) if kv[0] in PARTS else len(order))


def composer_parameters(net: Composer) -> dict[str, int]:
    """Parameters of every child of the network, by part; the values sum to ``net``'s parameter count."""
    return {PARTS.get(name, name): sum(p.numel() for p in child.parameters()) for name, child in _children(net)}


def cpu_sdpa_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """``scaled_dot_product_attention``'s CPU kernel, counted as torch counts the GPU kernels (QKᵀ and AV)."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


# torch's flop counter knows the CUDA attention kernels; on CPU, F.scaled_dot_product_attention runs this one
CUSTOM_FLOPS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_sdpa_flop}


class PairForward(nn.Module):
    """One (image, caption) pair through the network: region tokens, then ``Composer.forward`` (the score of
    the caption's root). A module, so the flop counter names the network's parts ``PairForward.net.<part>``."""

    def __init__(self, net: Composer):
        super().__init__()
        self.net = net

    def forward(self, batch: dict, inputs: dict) -> torch.Tensor:
        regions, mask = self.net.embed_regions(**inputs)
        first = torch.zeros(1, dtype=torch.long, device=regions.device)
        return self.net(batch, regions, mask, first, first)


def region_inputs(net: Composer, n_regions: int | None = None, seed: int = 0) -> tuple[dict, int]:
    """Random inputs of one image for ``net.embed_regions`` and its number of regions N: ``files``: N detector
    features of the network's ``region_dim`` with boxes; ``boxes``: pixels and N boxes; ``grid``: pixels at
    ``image_size`` (N is the backbone's cell count)."""
    g = torch.Generator().manual_seed(seed)
    size = net.image_size
    if net.region_source == "grid":
        if n_regions is not None:
            raise ValueError(f"region_source 'grid' has one region per backbone cell ({size} px images): change the "
                             "config's image_size instead of --regions")
        images = torch.rand(1, 3, size, size, generator=g)
        with torch.no_grad():
            n = net.embed_regions(images=images)[0].shape[1]
        return {"images": images}, n
    n = DEFAULT_REGIONS if n_regions is None else n_regions
    if n < 1:
        raise ValueError(f"--regions must be at least 1; got {n}")
    corners = torch.rand(1, n, 2, 2, generator=g).sort(dim=2).values  # x1 <= x2, y1 <= y2 in [0, 1]
    boxes = corners.transpose(2, 3).reshape(1, n, 4)
    mask = torch.ones(1, n, dtype=torch.bool)
    if net.region_source == "files":
        features = torch.rand(1, n, net.regions.feature.in_features, generator=g)
        return {"features": features, "boxes": boxes, "mask": mask}, n
    return {"images": torch.rand(1, 3, size, size, generator=g), "boxes": boxes, "mask": mask}, n


def composer_flops(net: Composer, batch: dict, inputs: dict) -> dict[str, int]:
    """Forward FLOPs of one pair by part (:data:`PARTS` labels) for a one-caption composition ``batch`` and one
    image's ``inputs`` (:func:`region_inputs`); ``other`` holds anything counted outside the parts."""
    wrapper = PairForward(net).eval()
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=CUSTOM_FLOPS) as counter:
        wrapper(batch, inputs)
    counts = counter.get_flop_counts()
    out = {PARTS.get(name, name): sum(counts.get(f"PairForward.net.{name}", {}).values()) for name, _ in _children(net)}
    other = counter.get_total_flops() - sum(out.values())
    if other:
        out["other"] = other
    return out


# ------------------------------------------------------------------------------------------ inputs
def caption_batch(caption: str, tokenizer, backend: str = DEFAULT_BACKEND) -> tuple[dict, ConceptGraph]:
    """The composition batch of one caption, its CRG built by the suite's parser (no parse cache written)."""
    batch, graph = texts_batch([caption], tokenizer, backend)
    if graph.caption_status[0] != OK:
        raise ValueError(f"the {backend} parser found no concept to compose in {caption!r}: pass a --caption with a noun "
                         "phrase (e.g. the default, App. A's example)")
    return batch, graph


def crg_summary(graph: ConceptGraph, batch: dict) -> dict:
    tree = graph.caption_tree(0)
    return {"primitives": tree["primitives"], "applications": int(batch["app_caption"].numel()),
            "height": int(batch["app_height"].max()) if batch["app_height"].numel() else 0,
            "compositions": [f"{a['result']} = {a['predicate']}" for level in tree["levels"] for a in level]}


# ------------------------------------------------------------------------------------------ the network
def composer_spec(config: str) -> tuple[dict, dict]:
    """(the network spec ``{class_path, init_args}``, the data's init args) of a COMPOSER LightningCLI config,
    its ``base:`` chain followed, type-checked by jsonargparse against :class:`ComposerTraining`."""
    p = stage_config_parser(ComposerTraining, "model")
    try:
        cfg = p.parse_args(expand_config_bases(["--config", config]))
    except ArgumentError as e:
        if "subclass of ComposerTraining" in str(e):
            raise ValueError(f"{config} is not a COMPOSER model config: its model.class_path is not "
                             "grounding.composer.training.ComposerTraining (see experiments/composer/composer_*.yaml)") from e
        raise
    return cfg.model.init_args.net.as_dict(), (cfg.data or {}).get("init_args") or {}


def bert_base_architecture(name: str, **config_overrides) -> nn.Module:
    """bert-base-uncased's architecture with random weights (``BertConfig()`` is bert-base-uncased)."""
    from transformers import BertConfig, BertModel  # heavy; the suite's encoders import it lazily too

    return BertModel(BertConfig(**config_overrides), add_pooling_layer=False)


def build_composer(spec: dict, **overrides) -> tuple[Composer, list[str]]:
    """The network of ``spec`` (``overrides`` replacing init args) and notes. bert-base-uncased without its
    weights is built as its architecture (:func:`bert_base_architecture`); any other missing encoder raises
    :class:`MissingWeightsError`."""
    try:
        return build_net(spec, **overrides).eval(), []
    except MissingWeightsError:
        if {**spec.get("init_args", {}), **overrides}.get("text_encoder") not in BERT_BASE_NAMES:
            raise
    # Composer loads its text encoder by name; only here, only for bert-base-uncased, the loader is swapped
    with unittest.mock.patch.object(composer_model, "load_text_encoder", bert_base_architecture):
        return build_net(spec, **overrides).eval(), [ARCHITECTURE_ONLY_NOTE]


def net_tokenizer(text_encoder: str):
    """The network's tokenizer; for bert-base-uncased without its files, MiniLM's (the same uncased WordPiece)."""
    try:
        return load_tokenizer(text_encoder)
    except MissingWeightsError:
        if text_encoder not in BERT_BASE_NAMES:
            raise
        return load_tokenizer("minilm")


def composer_cost(net: Composer, batch: dict, inputs: dict, n_regions: int, caption: str = "", crg: dict | None = None,
                  notes: list[str] | None = None) -> CostReport:
    """Table 6's columns for a built network, one caption's composition batch and one image's inputs."""
    return CostReport(parameters=composer_parameters(net), flops=composer_flops(net, batch, inputs), n_regions=n_regions,
                      region_source=net.region_source, caption=caption, crg=crg or {},
                      trainable_parameters=sum(p.numel() for p in net.parameters() if p.requires_grad), notes=list(notes or []))


def config_cost(config: str, caption: str = APP_A_CAPTION, n_regions: int | None = None, backend: str | None = None,
                **net_overrides) -> CostReport:
    """:func:`composer_cost` of the network a config builds (``net_overrides``: e.g. ``pt_layers=2``) on
    ``caption``'s CRG (parsed with ``backend``, default the config's data backend) and N regions."""
    spec, data = composer_spec(config)
    torch.manual_seed(0)
    net, notes = build_composer(spec, **net_overrides)
    tokenizer = net_tokenizer(net.init_args["text_encoder"])
    if len(tokenizer) != net.placeholder_base:
        raise ValueError(f"{config}: the tokenizer has {len(tokenizer)} word pieces but the text encoder "
                         f"{net.placeholder_base}")
    backend = backend or (data.get("parsing") or {}).get("backend") or DEFAULT_BACKEND
    batch, graph = caption_batch(caption, tokenizer, backend)
    inputs, n = region_inputs(net, n_regions)
    return composer_cost(net, batch, inputs, n, caption, {"backend": backend, **crg_summary(graph, batch)}, notes)


def table6_costs(config: str, caption: str = APP_A_CAPTION, n_regions: int | None = None,
                 backend: str | None = None) -> dict[tuple[int, int], CostReport]:
    """The config's network at every (PT layers, CT layers) row of Table 6."""
    return {(pt, ct): config_cost(config, caption, n_regions, backend, pt_layers=pt, ct_layers=ct) for pt, ct in TABLE6}


# ------------------------------------------------------------------------------------------ printing
def _m(n: int) -> str:
    return f"{n / 1e6:.2f}M"


def _g(n: int) -> str:
    return f"{n / 1e9:.2f}G"


def format_cost(report: CostReport, name: str = "") -> str:
    crg = report.crg
    lines = [f"COMPOSER cost{f' of {name}' if name else ''}: one (image, caption) pair, forward"]
    lines += [f"note: {n}" for n in report.notes]
    if crg:
        lines.append(f"caption {report.caption!r}, CRG ({crg['backend']}): {len(crg['primitives'])} primitives "
                     f"({', '.join(crg['primitives'])}), {crg['applications']} predicate applications, height {crg['height']}")
        lines += [f"    {c}" for c in crg["compositions"]]
    lines.append(f"regions: {report.n_regions} ({report.region_source})")
    lines.append(f"{'part':<26}{'parameters':>14}{'GFLOPs':>10}{'GMACs':>9}")
    for part, n in report.parameters.items():
        f = report.flops.get(part, 0)
        if n or f:
            lines.append(f"{part:<26}{_m(n):>14}{f / 1e9:>10.3f}{f / 2e9:>9.3f}")
    if report.flops.get("other"):
        lines.append(f"{'other':<26}{'':>14}{report.flops['other'] / 1e9:>10.3f}{report.flops['other'] / 2e9:>9.3f}")
    backbone = report.flops.get(FROZEN_BACKBONE, 0)
    lines.append(f"{'total':<26}{_m(report.total_parameters):>14}{report.pair_flops / 1e9:>10.3f}{report.pair_flops / 2e9:>9.3f}"
                 + ("   (FLOPs: the pair, without the frozen backbone, which runs once per image and is cached)"
                    if backbone else ""))
    if report.trainable_parameters != report.total_parameters:
        lines.append(f"{'trainable':<26}{_m(report.trainable_parameters):>14}")
    lines.append("FLOPs: torch.utils.flop_counter (a multiply-add = 2 FLOPs; element-wise ops not counted); "
                 "paper Table 6, PT 6 / CT 5: 157M parameters, 38.40G FLOPS")
    return "\n".join(lines)


def format_table6(costs: dict[tuple[int, int], CostReport]) -> str:
    lines = ["Table 6 rows (paper: # Param, FLOPS; here: parameters, GFLOPs and GMACs of one pair)",
             f"{'PT':>3}{'CT':>4}{'paper params':>14}{'paper FLOPS':>13}{'params':>11}{'GFLOPs':>9}{'GMACs':>8}"]
    for (pt, ct), r in costs.items():
        paper_params, paper_flops = TABLE6.get((pt, ct), ("", ""))
        lines.append(f"{pt:>3}{ct:>4}{paper_params:>14}{paper_flops:>13}{_m(r.total_parameters):>11}{_g(r.pair_flops):>9}"
                     f"{_g(r.pair_flops // 2):>8}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ records (``cost --record NAME``)
# the printed tables as records: counts as numbers (parameters and FLOPs exact, params_m / gflops / gmacs scaled as printed)
PARTS_LABELS = {"part": "part", "params_m": "parameters (M)", "gflops": "GFLOPs", "gmacs": "GMACs"}
TABLE6_LABELS = {"pt_layers": "PT", "ct_layers": "CT", "paper_params_m": "paper params (M)", "paper_gflops": "paper FLOPS (G)",
                 "params_m": "params (M)", "gflops": "GFLOPs", "gmacs": "GMACs"}


def _counts(parameters: int | None, flops: int | None) -> dict:
    return {"parameters": parameters, "params_m": None if parameters is None else parameters / 1e6, "flops": flops,
            "gflops": None if flops is None else flops / 1e9, "gmacs": None if flops is None else flops / 2e9}


def cost_record_rows(report: CostReport) -> list[dict]:
    """:func:`format_cost`'s table as rows: every part it prints, ``other`` FLOPs, ``total`` (the pair's FLOPs, the
    frozen backbone excluded) and ``trainable`` when it differs from the total."""
    rows = [{"part": part, **_counts(n, report.flops.get(part, 0))} for part, n in report.parameters.items()
            if n or report.flops.get(part, 0)]
    if report.flops.get("other"):
        rows.append({"part": "other", **_counts(None, report.flops["other"])})
    rows.append({"part": "total", **_counts(report.total_parameters, report.pair_flops)})
    if report.trainable_parameters != report.total_parameters:
        rows.append({"part": "trainable", **_counts(report.trainable_parameters, None)})
    return rows


def _paper_number(text: str) -> float | None:
    """``"129M"`` -> 129.0, ``"35.40G"`` -> 35.4 (Table 6's cells in their own unit)."""
    return float(text[:-1]) if text else None


def table6_record_rows(costs: dict[tuple[int, int], CostReport]) -> list[dict]:
    """:func:`format_table6`'s rows: PT / CT layers, the paper's # Param (M) and FLOPS (G), then the counts here."""
    rows = []
    for (pt, ct), r in costs.items():
        paper_params, paper_flops = TABLE6.get((pt, ct), ("", ""))
        rows.append({"pt_layers": pt, "ct_layers": ct, "paper_params_m": _paper_number(paper_params),
                     "paper_gflops": _paper_number(paper_flops), **_counts(r.total_parameters, r.pair_flops)})
    return rows

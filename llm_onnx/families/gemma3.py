"""Gemma 3 (text, ``Gemma3ForCausalLM``): RMSNorm scaled by (1 + weight), read as the plain
RMSNorm of (1 + weight); embeddings times sqrt(hidden_size); four norms per layer (before and
after attention, before and after the MLP); a GeGLU MLP (tanh GELU); q/k RMSNorm; attention
scaled by query_pre_attn_scalar ** -0.5; sliding-window layers with their own RoPE base
(``rope_local_base_freq``, unscaled) interleaved with full layers (``rope_theta`` and its
scaling) by ``layer_types`` or ``sliding_window_pattern``; final logit soft-capping where the
config sets it. Attention-logit soft-capping (Gemma 2's) is refused.

Checkpoints: the text-only class, or ``Gemma3ForConditionalGeneration`` (4B, 12B, 27B) with the
text fields under ``text_config`` (transformers' Gemma3TextConfig defaults where the released
configs leave them out) and the text weights under ``language_model.model.`` (as the released
files keep them and transformers still saves them); its vision side (SigLIP and the projector,
``vision_tower.``, ``multi_modal_projector.``: gemma_vision.py) is read beside the text model
unless exported ``--text-only``."""

from __future__ import annotations

import math
from typing import Any

from llm_onnx.errors import CheckpointError, ConfigError
from llm_onnx.families.family import Family
from llm_onnx.families.gemma_vision import gemma3_vision_fields
from llm_onnx.families.layouts import GGUFNames, Part
from llm_onnx.families.llama import GGUF_GLOBALS, GGUF_LAYER, base_hf_config, gguf_fields
from llm_onnx.modeling.config import (
    AttentionConfig,
    EmbeddingConfig,
    ModelConfig,
    PositionConfig,
    ResidualConfig,
)
from llm_onnx.modeling.gemma_vision_config import Gemma3VisionConfig

ARCHITECTURE = "Gemma3ForCausalLM"
HF_CONFIG_CLASS = "Gemma3TextConfig"
NORM_WEIGHT_OFFSET = 1.0  # its norms multiply by (1 + the stored weight)
ALIASES = ("Gemma3ForConditionalGeneration",)  # 4B and up: text under text_config
# the multimodal files' text weights: the layout transformers saves and the released files keep
CHECKPOINT_NESTED = ("model.", "language_model.model.")
CHECKPOINT_SKIP = r"^(model\.)?(vision_tower|multi_modal_projector)\."  # read apart
# transformers' Gemma3TextConfig defaults that the released multimodal configs rely on (and
# that differ from what config_fields assumes when a field is missing)
TEXT_DEFAULTS = dict(vocab_size=262_208, hidden_size=2304, intermediate_size=9216,
                     num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                     head_dim=256)


def pattern_layers(layers: int, pattern: int) -> tuple[str, ...]:
    """Gemma 3's interleaving: every ``pattern``-th layer full, the others sliding."""
    return tuple("sliding_attention" if (i + 1) % pattern else "full_attention"
                 for i in range(layers))


GEMMA3_1B = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=262_144, hidden_size=1152, num_hidden_layers=26, num_attention_heads=4,
    num_key_value_heads=1, head_dim=256, intermediate_size=6912, max_position_embeddings=32_768,
    rms_norm_eps=1e-6, rope_theta=1_000_000.0, hidden_act="gelu_pytorch_tanh",
    tie_word_embeddings=True, sliding_window=512, layer_types=pattern_layers(26, 6),
    attention=AttentionConfig(qk_norm=True, attention_scale=256 ** -0.5),
    residual=ResidualConfig(topology="sandwich"),
    positions=PositionConfig(rope_local_theta=10_000.0),
    embedding=EmbeddingConfig(embedding_multiplier=math.sqrt(1152)),
)
# Three layers (sliding, sliding, full with pattern 3), a window of 4, a query_pre_attn_scalar
# that is not head_dim, a full-layer RoPE scaling and a soft cap: every mechanism in play.
GEMMA3_TINY = GEMMA3_1B.replace(
    vocab_size=256, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, intermediate_size=96, max_position_embeddings=256,
    embedding_multiplier=math.sqrt(48), attention_scale=24 ** -0.5, sliding_window=4,
    layer_types=pattern_layers(3, 3), rope_scaling={"rope_type": "linear", "factor": 4.0},
    final_logit_softcapping=3.0,
)
PRESETS = {"gemma3_1b": GEMMA3_1B, "gemma3_tiny": GEMMA3_TINY}
HF_REPOS = {"gemma3_1b": "google/gemma-3-1b-it"}


def _rope(hf: Any) -> tuple[float, float, dict | None]:
    """(global base, local base, global scaling) from the classic fields or transformers 5's
    per-layer-type rope_parameters."""
    params = hf.get("rope_parameters") or {}
    full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    theta = float(hf.get("rope_theta", full.get("rope_theta", 1_000_000.0)))
    local_theta = float(hf.get("rope_local_base_freq", local.get("rope_theta", 10_000.0)))
    scaling = hf.get("rope_scaling")
    if scaling is None and full.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in full.items() if k != "rope_theta"}
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind == "default":
            scaling = None
        elif kind != "linear":
            raise ConfigError(f"{hf.source}: rope_scaling type '{kind}' is not supported for "
                              f"{hf.architecture}; supported: linear.")
    return theta, local_theta, scaling


def text_config(hf: Any) -> Any:
    """The text model's fields: ``text_config`` of the multimodal config (over transformers'
    defaults), else the config itself."""
    nested = hf.data.get("text_config")
    if nested is None:
        return hf
    if not isinstance(nested, dict):
        raise ConfigError(f"{hf.source}: text_config must be an object.")
    data = {**TEXT_DEFAULTS, **nested, "architectures": [hf.architecture]}
    tie = hf.get("tie_word_embeddings")  # the multimodal config's, which transformers reads
    if tie is not None:
        data["tie_word_embeddings"] = tie
    return type(hf)(data, f"{hf.source} (text_config)")


def config_fields(hf: Any) -> dict[str, Any]:
    hf = text_config(hf)
    if hf.get("attn_logit_softcapping") is not None:
        raise ConfigError(f"{hf.source}: attn_logit_softcapping is not supported for "
                          f"{hf.architecture} (Gemma 3 checkpoints do not set it).")
    hf.refuse(use_bidirectional_attention=True)
    hidden = hf.require("hidden_size")
    heads = hf.require("num_attention_heads")
    layers = hf.require("num_hidden_layers")
    types = hf.get("layer_types")
    theta, local_theta, scaling = _rope(hf)
    bias = bool(hf.get("attention_bias", False))
    return dict(
        vocab_size=hf.require("vocab_size"), hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hidden // heads,
        intermediate_size=hf.require("intermediate_size"),
        max_position_embeddings=hf.get("max_position_embeddings", 131_072),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=theta, rope_local_theta=local_theta, rope_scaling=scaling,
        hidden_act=hf.get("hidden_activation", "gelu_pytorch_tanh"), qk_norm=True,
        attention_bias=bias, o_proj_bias=bias,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        embedding_multiplier=math.sqrt(hidden),
        attention_scale=float(hf.get("query_pre_attn_scalar", 256)) ** -0.5,
        topology="sandwich", sliding_window=hf.get("sliding_window", 4096),
        layer_types=(tuple(types) if types else
                     pattern_layers(layers, hf.get("sliding_window_pattern", 6))),
        # the multimodal class never soft-caps its logits (transformers'; the released
        # configs set no cap)
        final_logit_softcapping=None if hf.architecture in ALIASES
        else hf.get("final_logit_softcapping"),
    )


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    fields = base_hf_config(cfg)
    fields.pop("hidden_act")
    fields.pop("rope_theta")
    scale = cfg.attention.attention_scale
    return dict(fields, hidden_activation=cfg.hidden_act, bos_token_id=None, eos_token_id=None,
                pad_token_id=None, rope_theta=cfg.rope_theta,
                rope_local_base_freq=cfg.positions.rope_local_theta, rope_scaling=cfg.rope_scaling,
                query_pre_attn_scalar=round(scale ** -2) if scale else None,
                sliding_window=cfg.sliding_window, layer_types=list(cfg.layer_types or ()),
                final_logit_softcapping=cfg.final_logit_softcapping,
                attn_logit_softcapping=None)


def vision_config(hf: Any) -> Gemma3VisionConfig | None:
    """SigLIP and the projector of a ``Gemma3ForConditionalGeneration``."""
    return gemma3_vision_fields(hf, text_config(hf))


def plus_one(t: Any, cfg: ModelConfig) -> Any:
    """Gemma's RMSNorm multiplies by (1 + weight): the plain RMSNorm of (1 + weight) is the same
    function, and what ONNX Runtime's SimplifiedLayerNormalization computes."""
    return t.float() + 1.0


NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
         "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm")
CHECKPOINT_GLOBALS = {"model.embed_tokens.weight": "model.embed_tokens.weight",
                      "model.norm.weight": Part("model.norm.weight", plus_one)}


def checkpoint_layer(cfg: ModelConfig, i: int) -> dict[str, Part]:
    p = f"model.layers.{i}"
    out = {f"{p}.{n}.weight": Part(f"{p}.{n}.weight", plus_one) for n in NORMS}
    for proj in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
        out[f"{p}.{proj}.weight"] = Part(f"{p}.{proj}.weight")
        if cfg.attention.attention_bias and proj.startswith("self_attn"):
            out[f"{p}.{proj}.bias"] = Part(f"{p}.{proj}.bias")
    return out


def gemma3_gguf_fields(meta: Any) -> dict[str, Any]:
    """ModelConfig fields from llama.cpp's gemma3 metadata: Llama's, plus Gemma's mechanisms and
    llama.cpp's own defaults for what the converter does not write: the sliding layers' pattern
    (6, or ``attention.sliding_window_pattern``), their RoPE base (10 000, or
    ``rope.freq_base_swa``), and the attention scale (head_dim ** -0.5; (hidden / heads) ** -0.5
    for the 62-layer 27B)."""
    fields = gguf_fields(meta)
    hidden, heads = fields["hidden_size"], fields["num_attention_heads"]
    layers = fields["num_hidden_layers"]
    window = int(meta.get("attention.sliding_window") or 0)
    pattern = meta.get("attention.sliding_window_pattern")
    if not window:
        types = ("full_attention",) * layers
    elif isinstance(pattern, list):
        if len(pattern) != layers:
            raise CheckpointError(f"{meta.path}: gemma3.attention.sliding_window_pattern lists "
                                  f"{len(pattern)} layers, the file has {layers}.")
        types = tuple("sliding_attention" if p else "full_attention" for p in pattern)
    else:
        types = pattern_layers(layers, int(pattern or 6))
    scaling = None
    kind = meta.get("rope.scaling.type")
    if kind not in (None, "none"):
        if kind != "linear":
            raise CheckpointError(f"{meta.path}: gemma3.rope.scaling.type {kind!r} is not "
                                  "supported; supported: linear.")
        scaling = {"rope_type": "linear", "factor": float(meta.need("rope.scaling.factor"))}
    softcap = meta.get("final_logit_softcapping")
    return dict(
        fields, intermediate_size=int(meta.need("feed_forward_length")),
        rope_theta=float(meta.get("rope.freq_base") or 1_000_000.0),
        rope_local_theta=float(meta.get("rope.freq_base_swa") or 10_000.0), rope_scaling=scaling,
        hidden_act="gelu_pytorch_tanh", qk_norm=True, embedding_multiplier=math.sqrt(hidden),
        attention_scale=(hidden // heads if layers == 62 else fields["head_dim"]) ** -0.5,
        topology="sandwich", sliding_window=window or None, layer_types=types,
        final_logit_softcapping=float(softcap) if softcap else None,
    )


# llama.cpp's gemma3 names; its converter stores every norm as 1 + w (norm_shift).
GGUF = GGUFNames(
    arch="gemma3", config_fields=gemma3_gguf_fields, globals=GGUF_GLOBALS, norm_shift=1.0,
    layer={**GGUF_LAYER,
           "post_attention_norm.weight": "post_attention_layernorm.weight",
           "ffn_norm.weight": "pre_feedforward_layernorm.weight",
           "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
           "attn_q_norm.weight": "self_attn.q_norm.weight",
           "attn_k_norm.weight": "self_attn.k_norm.weight"})


FAMILY = Family(
    architecture=ARCHITECTURE, summary=__doc__, hf_config_class=HF_CONFIG_CLASS,
    config_fields=config_fields, hf_config=hf_config, presets=PRESETS, hf_repos=HF_REPOS,
    checkpoint_globals=CHECKPOINT_GLOBALS, checkpoint_layer=checkpoint_layer, gguf=GGUF,
    norm_weight_offset=NORM_WEIGHT_OFFSET, aliases=ALIASES, checkpoint_nested=CHECKPOINT_NESTED,
    checkpoint_skip=CHECKPOINT_SKIP, vision_config=vision_config)

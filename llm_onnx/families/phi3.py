"""Phi-3 and Phi-4-mini (Phi3ForCausalLM): Llama without biases, whose checkpoints fuse q/k/v
(rows [q | k | v]) and the MLP's gate and up (rows [gate | up]) into one tensor each, read here
as Llama's separate projections. RMSNorm eps defaults to 1e-5. Phi-4-mini rotates only part of
each head (``partial_rotary_factor``) and extends its context with LongRoPE (per-frequency short
and long factors, cos/sin scaled by an attention factor; which factors a table uses:
llm_onnx/modeling/rope.py). Phi-3-mini-4k has a sliding window (``sliding_window``, as Mistral).
RoPE kinds other than default and longrope (the old names su and yarn are longrope, as in
transformers) are refused."""

from __future__ import annotations

from typing import Any

from llm_onnx.errors import CheckpointError, ConfigError
from llm_onnx.families.family import Family
from llm_onnx.families.layouts import (
    QKV,
    GGUFNames,
    Part,
    concat_part,
    fused_gate_up_shape,
    fused_qkv_shape,
    halves_part,
)
from llm_onnx.families.llama import GGUF_GLOBALS, gguf_fields
from llm_onnx.modeling.config import ModelConfig, longrope_attention_factor

ARCHITECTURE = "Phi3ForCausalLM"
HF_CONFIG_CLASS = "Phi3Config"

PHI3_MINI_4K = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=32_064, hidden_size=3072, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=32, head_dim=96, intermediate_size=8192, max_position_embeddings=4096,
    rope_theta=10_000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=2047,
)
# microsoft/Phi-4-mini-instruct's config.json: 48 factors each (rotary dim 96 of head_dim 128).
PHI4_MINI_LONG_FACTOR = [
    1.0, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817,
    2.187582649, 2.446418898, 2.735880826, 3.059592084, 3.421605075, 3.826451687, 4.279200023,
    4.785517845, 5.351743533, 5.984965424, 6.693110555, 7.485043894, 8.370679318, 9.36110372,
    10.4687158, 11.70738129, 13.09260651, 14.64173252, 16.37415215, 18.31155283, 20.47818807,
    22.90118105, 25.61086418, 28.64115884, 32.03, 32.1, 32.13, 32.23, 32.6, 32.61, 32.64, 32.66,
    32.7, 32.71, 32.93, 32.97, 33.28, 33.49, 33.5, 44.16, 47.77,
]
PHI4_MINI = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=200_064, hidden_size=3072, num_hidden_layers=32, num_attention_heads=24,
    num_key_value_heads=8, head_dim=128, intermediate_size=8192, max_position_embeddings=131_072,
    rope_theta=10_000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, sliding_window=262_144,
    partial_rotary_factor=0.75,
    rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 48,
                  "long_factor": PHI4_MINI_LONG_FACTOR, "original_max_position_embeddings": 4096},
)
# Phi-4-mini's mechanisms at test size: partial rotary (16 of 32 dims: GroupQueryAttention's
# rotary needs cos/sin widths that are multiples of 8), LongRoPE with uneven factors and an
# attention factor, tied embeddings, Phi-4-mini's window (longer than any sequence). hidden 68
# != 2 x 32 exposes layout bugs; transformers checks the factors' length against
# hidden // heads = 34 (int(34 * 0.5) // 2 = 8, as int(32 * 0.5) // 2), so hidden stays near
# heads x 32, and two heads keep it small (4 heads and hidden 136 put random int4 logits past
# the fidelity bar). The original context equals the table length (64, the tests' export
# length), so every registry rung runs the short factors; tests/model/test_phi3.py runs the long
# ones and the derived attention factor. phi3_mini_tiny has 4 heads on 2 kv heads.
PHI3_TINY = PHI4_MINI.replace(
    vocab_size=256, hidden_size=68, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, head_dim=32, intermediate_size=96, max_position_embeddings=64,
    partial_rotary_factor=0.5,
    rope_scaling={"rope_type": "longrope",
                  "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                  "long_factor": [1.0, 1.6, 2.7, 4.4, 7.3, 12.0, 19.9, 32.8],
                  "original_max_position_embeddings": 64, "attention_factor": 1.2},
)
# Phi-3-mini-4k's shape: full rotary, plain RoPE, untied, a window of 4 keys that 11-token
# prompts slide.
PHI3_MINI_TINY = PHI3_MINI_4K.replace(
    vocab_size=256, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, intermediate_size=96, max_position_embeddings=256,
    sliding_window=4,
)
PRESETS = {"phi3_mini_4k": PHI3_MINI_4K, "phi4_mini": PHI4_MINI, "phi3_tiny": PHI3_TINY,
           "phi3_mini_tiny": PHI3_MINI_TINY}
HF_REPOS = {"phi3_mini_4k": "microsoft/Phi-3-mini-4k-instruct",
            "phi4_mini": "microsoft/Phi-4-mini-instruct"}


def rope_fields(hf: Any, head_dim: int) -> dict[str, Any]:
    """rope_theta, partial_rotary_factor and a LongRoPE rope_scaling, read as transformers'
    Phi3Config does: rope_scaling (or transformers 5's rope_parameters) first, then the
    top-level fields; the top-level original_max_position_embeddings (default 4096) always."""
    scaling = dict(hf.get("rope_scaling") or hf.get("rope_parameters") or {})
    theta = float(scaling.get("rope_theta", hf.get("rope_theta", 10_000.0)))
    partial = float(scaling.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    kind = "longrope" if kind in ("su", "yarn") else kind
    if kind == "default":
        return {"rope_theta": theta, "partial_rotary_factor": partial, "rope_scaling": None}
    if kind != "longrope":
        raise ConfigError(f"{hf.source}: rope type '{kind}' is not supported for {ARCHITECTURE}; "
                          "supported: default, longrope.")
    half = int(head_dim * partial) // 2
    out: dict[str, Any] = {"rope_type": "longrope"}
    for key in ("short_factor", "long_factor"):
        factors = scaling.get(key)
        if not isinstance(factors, list) or len(factors) != half:
            raise ConfigError(f"{hf.source}: rope_scaling.{key} must list {half} numbers (one per "
                              f"rotated frequency), got {factors!r:.60}.")
        out[key] = [float(f) for f in factors]
    out["original_max_position_embeddings"] = int(hf.get("original_max_position_embeddings", 4096))
    for key in ("factor", "attention_factor"):
        if scaling.get(key) is not None:
            out[key] = float(scaling[key])
    return {"rope_theta": theta, "partial_rotary_factor": partial, "rope_scaling": out}


def config_fields(hf: Any) -> dict[str, Any]:
    hidden = hf.require("hidden_size")
    heads = hf.require("num_attention_heads")
    head_dim = hf.get("head_dim") or hidden // heads
    return dict(
        vocab_size=hf.require("vocab_size"), hidden_size=hidden,
        num_hidden_layers=hf.require("num_hidden_layers"), num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads, head_dim=head_dim,
        intermediate_size=hf.require("intermediate_size"),
        max_position_embeddings=hf.get("max_position_embeddings", 4096),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        hidden_act=hf.get("hidden_act", "silu"), sliding_window=hf.get("sliding_window"),
        **rope_fields(hf, head_dim),
    )  # attention_bias / mlp_bias: no biases in Phi-3, whatever those (unread) fields say


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    out = dict(
        architectures=[cfg.architecture], vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta,
        partial_rotary_factor=cfg.partial_rotary_factor, sliding_window=cfg.sliding_window,
        tie_word_embeddings=cfg.tie_word_embeddings, hidden_act=cfg.hidden_act,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,  # Phi-3's ids exceed tiny vocabs
    )
    if cfg.rope_scaling is not None:
        scaling = dict(cfg.rope_scaling)
        out["original_max_position_embeddings"] = scaling.pop("original_max_position_embeddings")
        out["rope_scaling"] = scaling
    return out


CHECKPOINT_GLOBALS = {"model.embed_tokens.weight": "model.embed_tokens.weight",
                      "model.norm.weight": "model.norm.weight"}


def checkpoint_layer(cfg: ModelConfig, i: int) -> dict[str, Part]:
    """Llama's names, with qkv_proj split into q/k/v and gate_up_proj into gate/up."""
    p = f"model.layers.{i}"
    out = {f"{p}.self_attn.{proj}.weight": Part(f"{p}.self_attn.qkv_proj.weight",
                                                concat_part(which, transposed=False),
                                                fused_qkv_shape(transposed=False))
           for which, proj in enumerate(QKV)}
    for which, proj in enumerate(("gate_proj", "up_proj")):
        out[f"{p}.mlp.{proj}.weight"] = Part(f"{p}.mlp.gate_up_proj.weight", halves_part(which),
                                             fused_gate_up_shape, fused="gate and up")
    for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight",
                 "post_attention_layernorm.weight"):
        out[f"{p}.{name}"] = Part(f"{p}.{name}")
    return out


def phi3_gguf_fields(meta: Any) -> dict[str, Any]:
    """ModelConfig fields from llama.cpp's phi3 metadata: Llama's, plus the rotary width
    (``rope.dimension_count``; head_dim is hidden / heads, as the converter writes no key
    length), LongRoPE's factors from the tensors rope_factors_short/long.weight, and the sliding
    window (0 means none)."""
    fields = gguf_fields(meta)
    head_dim = fields["head_dim"]
    rotary = int(meta.get("rope.dimension_count") or head_dim)
    short, long = meta.floats("rope_factors_short.weight"), meta.floats("rope_factors_long.weight")
    scaling = None
    if short is not None or long is not None:
        if short is None or long is None or len(short) != len(long) or 2 * len(long) != rotary:
            raise CheckpointError(f"{meta.path}: rope_factors_short/long.weight must both hold "
                                  f"{rotary // 2} factors (rope.dimension_count / 2).")
        original = int(meta.need("rope.scaling.original_context_length"))
        scaling = {"rope_type": "longrope", "short_factor": short, "long_factor": long,
                   "original_max_position_embeddings": original}
        factor = meta.get("rope.scaling.attn_factor")
        default = longrope_attention_factor(fields["max_position_embeddings"] / original, original)
        if factor is not None and abs(float(factor) - default) > 1e-6:
            scaling["attention_factor"] = float(factor)
    return dict(fields, intermediate_size=int(meta.need("feed_forward_length")),
                partial_rotary_factor=rotary / head_dim, rope_scaling=scaling,
                sliding_window=int(meta.get("attention.sliding_window") or 0) or None)


# llama.cpp's phi3 names: the fused qkv and gate|up tensors keep Phi-3's layouts (rows [q | k | v]
# and [gate | up], no rotary interleaving), read through checkpoint_layer's splits as a
# safetensors file is.
GGUF = GGUFNames(
    arch="phi3", config_fields=phi3_gguf_fields, globals=GGUF_GLOBALS,
    layer={"attn_norm.weight": "input_layernorm.weight",
           "attn_qkv.weight": "self_attn.qkv_proj.weight",
           "attn_output.weight": "self_attn.o_proj.weight",
           "ffn_norm.weight": "post_attention_layernorm.weight",
           "ffn_up.weight": "mlp.gate_up_proj.weight",
           "ffn_down.weight": "mlp.down_proj.weight"})


FAMILY = Family(
    architecture=ARCHITECTURE, summary=__doc__, hf_config_class=HF_CONFIG_CLASS,
    config_fields=config_fields, hf_config=hf_config, presets=PRESETS, hf_repos=HF_REPOS,
    checkpoint_globals=CHECKPOINT_GLOBALS, checkpoint_layer=checkpoint_layer, gguf=GGUF)

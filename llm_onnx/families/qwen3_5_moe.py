"""Qwen3.5-MoE and Qwen3.6-MoE (``Qwen3_5MoeForCausalLM``; the released checkpoints are
``Qwen3_5MoeForConditionalGeneration``): Qwen3.5's hybrid layers (qwen3_5.py) with a sparse MLP
in every layer: a softmax router, the top k experts always renormalised, SwiGLU experts, and a
shared expert every token takes, scaled by sigmoid of a learned (1, D) gate and added to the
routed sum. Experts come per expert (``mlp.experts.E.gate_proj``, as transformers saves them) or
fused (``mlp.experts.gate_up_proj`` (E, 2I, D), gate rows first, and ``mlp.experts.down_proj``
(E, D, I), as the released files store them). GGUF: llama.cpp's ``qwen35moe``. The released
checkpoints' vision tower is Qwen3.5's (read as qwen3_5.py reads it)."""

from __future__ import annotations

from typing import Any

from llm_onnx.families.family import Family
from llm_onnx.families.layouts import GGUFNames, Part
from llm_onnx.families.llama import GGUF_GLOBALS
from llm_onnx.families.qwen3_5 import (
    CHECKPOINT_GLOBALS,
    GGUF_HYBRID_LAYER,
    gguf_relayout,
    hybrid_fields,
    hybrid_gguf_fields,
    hybrid_hf_config,
    interval_layers,
    mixer_parts,
    text_config,
    vision_config,
)
from llm_onnx.modeling.config import AttentionConfig, LinearAttentionConfig, ModelConfig, MoEConfig

ARCHITECTURE = "Qwen3_5MoeForCausalLM"
HF_CONFIG_CLASS = "Qwen3_5MoeTextConfig"
ALIASES = ("Qwen3_5MoeForConditionalGeneration",)
NORM_WEIGHT_OFFSET = 1.0
CHECKPOINT_NESTED = ("model.", "model.language_model.")
CHECKPOINT_SKIP = r"^(model\.visual\.|mtp\.)"

# Qwen3.6-35B-A3B (and Qwen3.5-35B-A3B, the same shape): 40 layers (every fourth full
# attention), 256 experts of which 8 run per token, 3B active parameters. intermediate_size is
# not used (every layer is sparse); it is the experts' width here.
QWEN3_6_35B_A3B = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=248_320, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
    num_key_value_heads=2, head_dim=256, intermediate_size=512, rope_theta=10_000_000.0,
    partial_rotary_factor=0.25, rms_norm_eps=1e-6, max_position_embeddings=262_144,
    tie_word_embeddings=False, layer_types=interval_layers(40),
    attention=AttentionConfig(qk_norm=True, attention_output_gate=True),
    linear_attention=LinearAttentionConfig(num_key_heads=16, num_value_heads=32, key_head_dim=128,
                                           value_head_dim=128, conv_kernel=4),
    moe=MoEConfig(num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
                  norm_topk_prob=True, shared_expert_intermediate_size=512),
)
# d_k (64) != d_v (16): key heads of a real model's width ratio to the hidden size (an
# L2-normalised key of 16 dims makes quantization noise of a random model far larger).
QWEN3_5_MOE_TINY = QWEN3_6_35B_A3B.replace(
    vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=64, intermediate_size=32, max_position_embeddings=256,
    rope_theta=10_000.0, layer_types=interval_layers(2, 2),
    linear_attention=LinearAttentionConfig(num_key_heads=2, num_value_heads=4, key_head_dim=64,
                                           value_head_dim=16, conv_kernel=4),
    moe=MoEConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                  norm_topk_prob=True, shared_expert_intermediate_size=48),
)
PRESETS = {"qwen3_6_35b_a3b": QWEN3_6_35B_A3B, "qwen3_5_moe_tiny": QWEN3_5_MOE_TINY}
HF_REPOS = {"qwen3_6_35b_a3b": "Qwen/Qwen3.6-35B-A3B"}


def moe_fields(hf: Any, normalize: bool) -> dict[str, Any]:
    width = hf.require("moe_intermediate_size")
    return dict(intermediate_size=hf.get("intermediate_size", width), moe=MoEConfig(
        num_experts=hf.require("num_experts"), num_experts_per_tok=hf.require("num_experts_per_tok"),
        moe_intermediate_size=width, norm_topk_prob=normalize,
        decoder_sparse_step=hf.get("decoder_sparse_step", 1) or 1,
        mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()),
        shared_expert_intermediate_size=hf.require("shared_expert_intermediate_size")))


def config_fields(hf: Any) -> dict[str, Any]:
    hf = text_config(hf)
    return dict(hybrid_fields(hf), **moe_fields(hf, normalize=True))  # always renormalised


def moe_hf_config(cfg: ModelConfig) -> dict[str, Any]:
    moe = cfg.moe
    assert moe is not None
    return dict(num_experts=moe.num_experts, num_experts_per_tok=moe.num_experts_per_tok,
                moe_intermediate_size=moe.moe_intermediate_size,
                shared_expert_intermediate_size=moe.shared_expert_intermediate_size)


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    return dict(hybrid_hf_config(cfg), **moe_hf_config(cfg))


def _expert_part(source: str, e: int, rows: str) -> Part:
    """Expert e of a fused (E, 2I, D) gate_up_proj (rows "gate" or "up") or (E, D, I) down_proj."""

    def relayout(t: Any, cfg: ModelConfig) -> Any:
        assert cfg.moe is not None
        i = cfg.moe.moe_intermediate_size
        return t[e, :i] if rows == "gate" else t[e, i:] if rows == "up" else t[e]

    def shape(cfg: ModelConfig, is_bias: bool) -> tuple[int, ...]:
        moe = cfg.moe
        assert moe is not None
        i = moe.moe_intermediate_size
        return ((moe.num_experts, cfg.hidden_size, i) if rows == "down"
                else (moe.num_experts, 2 * i, cfg.hidden_size))

    return Part(source, relayout, fused_shape=shape, fused="the experts' projections")


def moe_parts(cfg: ModelConfig, i: int) -> dict[str, Part]:
    """A sparse layer's router, shared expert and (fused-form) experts."""
    p = f"model.layers.{i}.mlp"
    moe = cfg.moe
    assert moe is not None
    out = {f"{p}.gate.weight": Part(f"{p}.gate.weight"),
           f"{p}.shared_expert_gate.weight": Part(f"{p}.shared_expert_gate.weight")}
    out.update({f"{p}.shared_expert.{m}.weight": Part(f"{p}.shared_expert.{m}.weight")
                for m in ("gate_proj", "up_proj", "down_proj")})
    for e in range(moe.num_experts):  # per-expert checkpoints pass through under these names
        out[f"{p}.experts.{e}.gate_proj.weight"] = _expert_part(f"{p}.experts.gate_up_proj", e, "gate")
        out[f"{p}.experts.{e}.up_proj.weight"] = _expert_part(f"{p}.experts.gate_up_proj", e, "up")
        out[f"{p}.experts.{e}.down_proj.weight"] = _expert_part(f"{p}.experts.down_proj", e, "down")
    return out


def checkpoint_layer(cfg: ModelConfig, i: int) -> dict[str, Part]:
    return {**mixer_parts(cfg, i), **moe_parts(cfg, i)}


GGUF_MOE = {"ffn_gate_inp.weight": "mlp.gate.weight",
            "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
            "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
            "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
            "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight"}
GGUF_EXPERTS = {"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj",
                "ffn_down_exps.weight": "down_proj"}


def gguf_moe_fields(meta: Any, normalize: bool = True) -> dict[str, Any]:
    width = int(meta.need("expert_feed_forward_length"))
    return dict(intermediate_size=int(meta.get("feed_forward_length") or width), moe=MoEConfig(
        num_experts=int(meta.need("expert_count")),
        num_experts_per_tok=int(meta.need("expert_used_count")), moe_intermediate_size=width,
        norm_topk_prob=normalize,
        shared_expert_intermediate_size=int(meta.need("expert_shared_feed_forward_length"))))


def gguf_fields(meta: Any) -> dict[str, Any]:
    return dict(hybrid_gguf_fields(meta), **gguf_moe_fields(meta))


GGUF = GGUFNames(arch="qwen35moe", config_fields=gguf_fields,
                 layer={**GGUF_HYBRID_LAYER, **GGUF_MOE}, globals=GGUF_GLOBALS,
                 experts=GGUF_EXPERTS, norm_shift=1.0, norm_shift_skip=("ssm_norm.weight",),
                 relayout=gguf_relayout(tiled=True))


# checkpoint_globals: Qwen3.5's (imported from qwen3_5), the same global tensors
FAMILY = Family(
    architecture=ARCHITECTURE, summary=__doc__, hf_config_class=HF_CONFIG_CLASS,
    config_fields=config_fields, hf_config=hf_config, presets=PRESETS, hf_repos=HF_REPOS,
    checkpoint_globals=CHECKPOINT_GLOBALS, checkpoint_layer=checkpoint_layer,
    checkpoint_skip=CHECKPOINT_SKIP, gguf=GGUF, norm_weight_offset=NORM_WEIGHT_OFFSET,
    aliases=ALIASES, checkpoint_nested=CHECKPOINT_NESTED, vision_config=vision_config)

"""Qwen3-Next (``Qwen3NextForCausalLM``, also Qwen3-Coder-Next): Qwen3.5-MoE's layers with a flat
config and two differences: the linear-attention input projections are fused per key-head group
(``in_proj_qkvz``: for each key head g the rows [q_g | k_g | v_g | z_g], v and z holding that
group's value heads; ``in_proj_ba``: [b_g | a_g]), read here as Qwen3.5's four projections; and
the router renormalises its top k only when ``norm_topk_prob``, with dense layers where
``mlp_only_layers`` or ``decoder_sparse_step`` say. GGUF: llama.cpp's ``qwen3next`` (value heads
in the checkpoint's order; in_proj_qkvz split into attn_qkv and attn_gate)."""

from __future__ import annotations

from typing import Any

from llm_onnx.families.family import Family
from llm_onnx.families.layouts import GGUFNames, Part
from llm_onnx.families.llama import GGUF_GLOBALS
from llm_onnx.families.qwen3_5 import (
    CHECKPOINT_GLOBALS,
    GGUF_DENSE_MLP,
    GGUF_HYBRID_LAYER,
    gguf_relayout,
    hybrid_fields,
    hybrid_gguf_fields,
    hybrid_hf_config,
    mixer_parts,
)
from llm_onnx.families.qwen3_5_moe import (
    GGUF_EXPERTS,
    GGUF_MOE,
    QWEN3_5_MOE_TINY,
    gguf_moe_fields,
    moe_fields,
    moe_hf_config,
    moe_parts,
)
from llm_onnx.modeling.config import LinearAttentionConfig, ModelConfig, MoEConfig

ARCHITECTURE = "Qwen3NextForCausalLM"
HF_CONFIG_CLASS = "Qwen3NextConfig"
NORM_WEIGHT_OFFSET = 1.0
CHECKPOINT_SKIP = r"^mtp\."

# Qwen3.5-MoE's tiny shape (a linear layer with experts, a full layer with a dense MLP),
# renormalised routing and d_k > d_v (a key head of 16 dims, L2-normalised, makes int8 and int4
# rounding of a random model's keys far noisier than the real 128).
QWEN3_NEXT_TINY = QWEN3_5_MOE_TINY.replace(
    architecture=ARCHITECTURE, intermediate_size=96,
    linear_attention=LinearAttentionConfig(num_key_heads=2, num_value_heads=4, key_head_dim=64,
                                           value_head_dim=32, conv_kernel=4),
    moe=MoEConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                  norm_topk_prob=True, mlp_only_layers=(1,), shared_expert_intermediate_size=48),
)
PRESETS = {"qwen3_next_tiny": QWEN3_NEXT_TINY}


def config_fields(hf: Any) -> dict[str, Any]:
    return dict(hybrid_fields(hf), **moe_fields(hf, normalize=bool(hf.get("norm_topk_prob", False))))


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    moe = cfg.moe
    assert moe is not None
    return dict(hybrid_hf_config(cfg), **moe_hf_config(cfg), intermediate_size=cfg.intermediate_size,
                norm_topk_prob=moe.norm_topk_prob, decoder_sparse_step=moe.decoder_sparse_step,
                mlp_only_layers=list(moe.mlp_only_layers))


def _group_part(source: str, which: str) -> Part:
    """Qwen3.5's in_proj_qkv / in_proj_z / in_proj_b / in_proj_a from Qwen3-Next's fused
    projections, laid out per key-head group."""

    def split(t: Any, cfg: ModelConfig) -> tuple[Any, ...]:
        la = cfg.linear_attention
        assert la is not None
        hk, dk = la.num_key_heads, la.key_head_dim
        rv = la.value_dim // hk  # one group's value rows
        if which in ("b", "a"):
            r = la.num_value_heads // hk
            g = t.reshape(hk, 2 * r, t.shape[-1])
            return (g[:, :r], g[:, r:])
        g = t.reshape(hk, 2 * dk + 2 * rv, t.shape[-1])
        return (g[:, :dk], g[:, dk:2 * dk], g[:, 2 * dk:2 * dk + rv], g[:, 2 * dk + rv:])

    def relayout(t: Any, cfg: ModelConfig) -> Any:
        parts = [p.reshape(-1, t.shape[-1]) for p in split(t, cfg)]
        if which == "qkv":  # [q of every group | k of every group | v of every group]
            rows = sum(p.shape[0] for p in parts[:3])
            out = t.new_empty((rows, t.shape[-1]))
            start = 0
            for p in parts[:3]:
                out[start:start + p.shape[0]] = p
                start += p.shape[0]
            return out
        return {"z": parts[-1], "b": parts[0], "a": parts[-1]}[which]

    def shape(cfg: ModelConfig, is_bias: bool) -> tuple[int, ...]:
        la = cfg.linear_attention
        assert la is not None
        rows = 2 * la.num_value_heads if which in ("b", "a") else 2 * la.key_dim + 2 * la.value_dim
        return (rows, cfg.hidden_size)

    return Part(source, relayout, fused_shape=shape,
                fused="b and a" if which in ("b", "a") else "q, k, v and z")


def checkpoint_layer(cfg: ModelConfig, i: int) -> dict[str, Part]:
    p = f"model.layers.{i}"
    out = mixer_parts(cfg, i)
    if cfg.is_linear_layer(i):
        la = f"{p}.linear_attn"
        out[f"{la}.in_proj_qkv.weight"] = _group_part(f"{la}.in_proj_qkvz.weight", "qkv")
        out[f"{la}.in_proj_z.weight"] = _group_part(f"{la}.in_proj_qkvz.weight", "z")
        out[f"{la}.in_proj_b.weight"] = _group_part(f"{la}.in_proj_ba.weight", "b")
        out[f"{la}.in_proj_a.weight"] = _group_part(f"{la}.in_proj_ba.weight", "a")
    if cfg.is_moe_layer(i):
        out.update(moe_parts(cfg, i))
    else:
        out.update({f"{p}.mlp.{m}.weight": Part(f"{p}.mlp.{m}.weight")
                    for m in ("gate_proj", "up_proj", "down_proj")})
    return out


def gguf_fields(meta: Any) -> dict[str, Any]:
    fields = dict(hybrid_gguf_fields(meta), **gguf_moe_fields(meta))
    return fields


GGUF = GGUFNames(arch="qwen3next", config_fields=gguf_fields,
                 layer={**GGUF_HYBRID_LAYER, **GGUF_MOE, **GGUF_DENSE_MLP,
                        "ssm_ba.weight": "linear_attn.in_proj_ba.weight"},
                 globals=GGUF_GLOBALS, experts=GGUF_EXPERTS, norm_shift=1.0,
                 norm_shift_skip=("ssm_norm.weight",), relayout=gguf_relayout(tiled=False))


# checkpoint_globals: Qwen3.5's (imported from qwen3_5), the same global tensors
FAMILY = Family(
    architecture=ARCHITECTURE, summary=__doc__, hf_config_class=HF_CONFIG_CLASS,
    config_fields=config_fields, hf_config=hf_config, presets=PRESETS,
    checkpoint_globals=CHECKPOINT_GLOBALS, checkpoint_layer=checkpoint_layer,
    checkpoint_skip=CHECKPOINT_SKIP, gguf=GGUF, norm_weight_offset=NORM_WEIGHT_OFFSET)

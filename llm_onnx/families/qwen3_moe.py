"""Qwen3-MoE: Qwen3 attention with a sparse MLP: a softmax router over the experts, top-k,
renormalised when ``norm_topk_prob``, SwiGLU experts (ONNX Runtime's MoE / QMoE)."""

from __future__ import annotations

from typing import Any

from llm_onnx.errors import ConfigError
from llm_onnx.families.family import Family
from llm_onnx.families.layouts import GGUFNames
from llm_onnx.families.llama import GGUF_GLOBALS, base_hf_config
from llm_onnx.families.qwen3 import GGUF_QWEN3_LAYER, qwen3_gguf_fields
from llm_onnx.families.qwen3 import config_fields as qwen3_fields
from llm_onnx.modeling.config import AttentionConfig, ModelConfig, MoEConfig

ARCHITECTURE = "Qwen3MoeForCausalLM"
HF_CONFIG_CLASS = "Qwen3MoeConfig"

QWEN3_30B_A3B = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=151_936, hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
    num_key_value_heads=4, head_dim=128, intermediate_size=6144, rope_theta=1_000_000.0,
    rms_norm_eps=1e-6, max_position_embeddings=40_960, tie_word_embeddings=False,
    attention=AttentionConfig(qk_norm=True),
    moe=MoEConfig(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                  norm_topk_prob=True),
)
# E=4, K=2 with renormalisation.
QWEN3_MOE_TINY = QWEN3_30B_A3B.replace(
    vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, intermediate_size=128, max_position_embeddings=256,
    moe=MoEConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True),
)
PRESETS = {"qwen3_30b_a3b": QWEN3_30B_A3B, "qwen3_moe_tiny": QWEN3_MOE_TINY}
HF_REPOS = {"qwen3_30b_a3b": "Qwen/Qwen3-30B-A3B"}


def config_fields(hf: Any) -> dict[str, Any]:
    num_experts = hf.get("num_experts", hf.get("num_local_experts"))
    if num_experts is None:
        raise ConfigError(f"{hf.source}: missing field 'num_experts' needed by {ARCHITECTURE}.")
    return dict(qwen3_fields(hf), moe=MoEConfig(
        num_experts=num_experts, num_experts_per_tok=hf.require("num_experts_per_tok"),
        moe_intermediate_size=hf.require("moe_intermediate_size"),
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        decoder_sparse_step=hf.get("decoder_sparse_step", 1) or 1,
        mlp_only_layers=tuple(hf.get("mlp_only_layers") or ())))


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    moe = cfg.moe
    assert moe is not None
    return dict(base_hf_config(cfg), num_experts=moe.num_experts,
                num_experts_per_tok=moe.num_experts_per_tok,
                moe_intermediate_size=moe.moe_intermediate_size, norm_topk_prob=moe.norm_topk_prob,
                decoder_sparse_step=moe.decoder_sparse_step,
                mlp_only_layers=list(moe.mlp_only_layers))


def gguf_fields(meta: Any) -> dict[str, Any]:
    return dict(qwen3_gguf_fields(meta), moe=MoEConfig(
        num_experts=int(meta.need("expert_count")),
        num_experts_per_tok=int(meta.need("expert_used_count")),
        moe_intermediate_size=int(meta.need("expert_feed_forward_length")), norm_topk_prob=True))


GGUF = GGUFNames(arch="qwen3moe", config_fields=gguf_fields,
                 layer={**GGUF_QWEN3_LAYER, "ffn_gate_inp.weight": "mlp.gate.weight"},
                 globals=GGUF_GLOBALS,
                 experts={"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj",
                          "ffn_down_exps.weight": "down_proj"})


FAMILY = Family(
    architecture=ARCHITECTURE, summary=__doc__, hf_config_class=HF_CONFIG_CLASS,
    config_fields=config_fields, hf_config=hf_config, presets=PRESETS, hf_repos=HF_REPOS,
    gguf=GGUF)

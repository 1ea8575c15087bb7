"""Qwen3 (dense): Llama plus a per-head RMSNorm on q and k before RoPE, and an explicit
head_dim (Qwen3-0.6B has 128, not hidden / heads)."""

from __future__ import annotations

from typing import Any

from llm_onnx.families.family import Family
from llm_onnx.families.layouts import GGUFNames
from llm_onnx.families.llama import (
    GGUF_GLOBALS,
    GGUF_LAYER,
    base_fields,
    base_hf_config,
    gguf_fields,
)
from llm_onnx.modeling.config import AttentionConfig, ModelConfig

ARCHITECTURE = "Qwen3ForCausalLM"
HF_CONFIG_CLASS = "Qwen3Config"
# the bare model (no LM head): embedding models such as Qwen3-Embedding, read with --task embed
ALIASES = ("Qwen3Model",)

QWEN3_8B = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=151_936, hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, intermediate_size=12_288, rope_theta=1_000_000.0,
    rms_norm_eps=1e-6, max_position_embeddings=40_960, tie_word_embeddings=False,
    attention=AttentionConfig(qk_norm=True),
)
QWEN3_TINY = QWEN3_8B.replace(
    vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, intermediate_size=128, max_position_embeddings=256,
)
PRESETS = {"qwen3_8b": QWEN3_8B, "qwen3_tiny": QWEN3_TINY}
HF_REPOS = {"qwen3_8b": "Qwen/Qwen3-8B"}


def config_fields(hf: Any) -> dict[str, Any]:
    hf.refuse(use_sliding_window=True)
    return dict(base_fields(hf), qk_norm=True)


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    return base_hf_config(cfg)


# Qwen3: the q/k norms, llama.cpp's attn_q_norm / attn_k_norm
GGUF_QWEN3_LAYER = {**GGUF_LAYER, "attn_q_norm.weight": "self_attn.q_norm.weight",
                    "attn_k_norm.weight": "self_attn.k_norm.weight"}


def qwen3_gguf_fields(meta: Any) -> dict[str, Any]:
    return dict(gguf_fields(meta), qk_norm=True)


GGUF = GGUFNames(arch="qwen3", config_fields=qwen3_gguf_fields, layer=GGUF_QWEN3_LAYER,
                 globals=GGUF_GLOBALS)


FAMILY = Family(
    architecture=ARCHITECTURE, summary=__doc__, hf_config_class=HF_CONFIG_CLASS,
    config_fields=config_fields, hf_config=hf_config, presets=PRESETS, hf_repos=HF_REPOS,
    gguf=GGUF, aliases=ALIASES)

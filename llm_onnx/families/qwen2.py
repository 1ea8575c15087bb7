"""Qwen2 and Qwen2.5 (dense): Llama plus biases on the q, k and v projections (none on o_proj or
the MLP). Sliding-window attention (``use_sliding_window``, off in every published Qwen2.5
checkpoint) is refused; its ``sliding_window`` value is otherwise ignored, as transformers does."""

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

ARCHITECTURE = "Qwen2ForCausalLM"
HF_CONFIG_CLASS = "Qwen2Config"
# the bare model (no LM head): embedding models such as Qwen3-Embedding, read with --task embed
ALIASES = ("Qwen2Model",)

QWEN2_5_7B = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=152_064, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
    num_key_value_heads=4, head_dim=128, intermediate_size=18_944, rope_theta=1_000_000.0,
    rms_norm_eps=1e-6, max_position_embeddings=32_768, tie_word_embeddings=False,
    attention=AttentionConfig(attention_bias=True),
)
# head_dim != hidden / heads and kv heads < heads expose layout bugs; biases on q/k/v only.
QWEN2_TINY = QWEN2_5_7B.replace(
    vocab_size=256, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, intermediate_size=96, max_position_embeddings=256,
)
PRESETS = {"qwen2_5_7b": QWEN2_5_7B, "qwen2_tiny": QWEN2_TINY}
HF_REPOS = {"qwen2_5_7b": "Qwen/Qwen2.5-7B-Instruct"}


def config_fields(hf: Any) -> dict[str, Any]:
    hf.refuse(use_sliding_window=True)
    return dict(base_fields(hf), attention_bias=True)


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    return dict(base_hf_config(cfg), use_sliding_window=False)


def qwen2_gguf_fields(meta: Any) -> dict[str, Any]:
    return dict(gguf_fields(meta), attention_bias=True)


# llama.cpp's qwen2 files use Llama's names (attn_q.bias, ...) without permuting q/k rows.
GGUF = GGUFNames(arch="qwen2", config_fields=qwen2_gguf_fields, layer=GGUF_LAYER,
                 globals=GGUF_GLOBALS)


FAMILY = Family(
    architecture=ARCHITECTURE, summary=__doc__, hf_config_class=HF_CONFIG_CLASS,
    config_fields=config_fields, hf_config=hf_config, presets=PRESETS, hf_repos=HF_REPOS,
    gguf=GGUF, aliases=ALIASES)

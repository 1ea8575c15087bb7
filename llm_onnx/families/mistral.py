"""Mistral: Llama with sliding-window attention (each query sees its last ``sliding_window``
keys, itself included), which ONNX Runtime's GroupQueryAttention does with
``local_window_size``."""

from __future__ import annotations

from typing import Any

from llm_onnx.families.family import Family
from llm_onnx.families.llama import base_fields, base_hf_config
from llm_onnx.modeling.config import ModelConfig

ARCHITECTURE = "MistralForCausalLM"
HF_CONFIG_CLASS = "MistralConfig"
# the bare model (no LM head): embedding models such as Qwen3-Embedding, read with --task embed
ALIASES = ("MistralModel",)

MISTRAL_7B = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=32_000, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, intermediate_size=14_336,
    max_position_embeddings=32_768, rope_theta=10_000.0, rms_norm_eps=1e-5,
    tie_word_embeddings=False, sliding_window=4096,
)
# A window of 4 keys: prompts of a dozen tokens already slide it.
MISTRAL_TINY = MISTRAL_7B.replace(
    vocab_size=256, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, intermediate_size=96, max_position_embeddings=256,
    sliding_window=4,
)
PRESETS = {"mistral_7b": MISTRAL_7B, "mistral_tiny": MISTRAL_TINY}
HF_REPOS = {"mistral_7b": "mistralai/Mistral-7B-v0.1"}


def config_fields(hf: Any) -> dict[str, Any]:
    return dict(base_fields(hf), sliding_window=hf.get("sliding_window"))


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    return dict(base_hf_config(cfg), sliding_window=cfg.sliding_window)


FAMILY = Family(
    architecture=ARCHITECTURE, summary=__doc__, hf_config_class=HF_CONFIG_CLASS,
    config_fields=config_fields, hf_config=hf_config, presets=PRESETS, hf_repos=HF_REPOS,
    aliases=ALIASES)

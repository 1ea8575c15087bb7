"""Falcon (7B style): RoPE, multi-query attention (one kv head), attention and MLP in parallel
from one shared LayerNorm, a plain exact-GELU MLP, no biases. Its checkpoints use BLOOM's names;
q/k/v are fused [all q heads | k | v] with multi-query, per head otherwise. Falcon-40B/180B
(``new_decoder_architecture``) and Falcon-RW (``alibi``) are refused."""

from __future__ import annotations

from typing import Any

from llm_onnx.families.bloom import bloom_like_layer
from llm_onnx.families.family import Family
from llm_onnx.families.layouts import Part
from llm_onnx.families.llama import rope_fields
from llm_onnx.modeling.config import MLPConfig, ModelConfig, NormConfig, ResidualConfig

ARCHITECTURE = "FalconForCausalLM"
HF_CONFIG_CLASS = "FalconConfig"

FALCON_7B = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=65_024, hidden_size=4544, num_hidden_layers=32, num_attention_heads=71,
    num_key_value_heads=1, head_dim=64, intermediate_size=18_176, max_position_embeddings=2048,
    rope_theta=10_000.0, hidden_act="gelu", tie_word_embeddings=True,
    mlp=MLPConfig(gated_mlp=False), norm=NormConfig(norm_type="layer", layer_norm_epsilon=1e-5),
    residual=ResidualConfig(topology="parallel"),
)
FALCON_TINY = FALCON_7B.replace(
    vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=1, head_dim=16, intermediate_size=256, max_position_embeddings=128,
)
PRESETS = {"falcon_7b": FALCON_7B, "falcon_tiny": FALCON_TINY}
HF_REPOS = {"falcon_7b": "tiiuae/falcon-7b"}


def config_fields(hf: Any) -> dict[str, Any]:
    hf.refuse(new_decoder_architecture=True, alibi=True)
    hidden = hf.get("hidden_size") or hf.require("n_embed")
    heads = hf.require("num_attention_heads")
    bias = bool(hf.get("bias", False))
    return dict(
        vocab_size=hf.require("vocab_size"), hidden_size=hidden,
        num_hidden_layers=hf.require("num_hidden_layers"), num_attention_heads=heads,
        num_key_value_heads=1 if hf.get("multi_query", True) else heads,
        head_dim=hidden // heads, intermediate_size=hf.get("ffn_hidden_size") or 4 * hidden,
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        hidden_act=hf.get("activation", "gelu"), gated_mlp=False, norm_type="layer",
        layer_norm_epsilon=float(hf.get("layer_norm_epsilon", 1e-5)),
        topology="parallel" if hf.get("parallel_attn", True) else "pre",
        attention_bias=bias, o_proj_bias=bias, mlp_bias=bias,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        **rope_fields(hf),
    )


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    return dict(architectures=[cfg.architecture], bos_token_id=None, eos_token_id=None,
                vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                num_hidden_layers=cfg.num_hidden_layers,
                num_attention_heads=cfg.num_attention_heads,
                multi_query=cfg.num_key_value_heads == 1, new_decoder_architecture=False,
                parallel_attn=cfg.residual.topology == "parallel", alibi=False,
                bias=cfg.attention.attention_bias,
                ffn_hidden_size=cfg.intermediate_size, activation=cfg.hidden_act,
                max_position_embeddings=cfg.max_position_embeddings, rope_theta=cfg.rope_theta,
                layer_norm_epsilon=cfg.norm.layer_norm_epsilon,
                tie_word_embeddings=cfg.tie_word_embeddings)


CHECKPOINT_GLOBALS = {"model.embed_tokens.weight": "word_embeddings.weight",
                      "model.norm.weight": "ln_f.weight", "model.norm.bias": "ln_f.bias"}


def checkpoint_layer(cfg: ModelConfig, i: int) -> dict[str, Part]:
    return bloom_like_layer(cfg, i, per_head=cfg.num_key_value_heads > 1)


FAMILY = Family(
    architecture=ARCHITECTURE, summary=__doc__, hf_config_class=HF_CONFIG_CLASS,
    config_fields=config_fields, hf_config=hf_config, presets=PRESETS, hf_repos=HF_REPOS,
    checkpoint_globals=CHECKPOINT_GLOBALS, checkpoint_layer=checkpoint_layer)

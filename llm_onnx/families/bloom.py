"""BLOOM: ALiBi instead of RoPE (a per-head linear attention bias), LayerNorm (also right after
the embedding), a plain GELU (tanh) MLP, biases, multi-head attention. Its checkpoints fuse
q/k/v per head: rows (heads, 3, head_dim)."""

from __future__ import annotations

from typing import Any

from llm_onnx.families.family import Family
from llm_onnx.families.layouts import QKV, Part, fused_qkv_shape, per_head_part
from llm_onnx.modeling.config import (
    AttentionConfig,
    EmbeddingConfig,
    MLPConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
)

ARCHITECTURE = "BloomForCausalLM"
HF_CONFIG_CLASS = "BloomConfig"

BLOOM_560M = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=250_880, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
    num_key_value_heads=16, head_dim=64, intermediate_size=4096, max_position_embeddings=2048,
    hidden_act="gelu_new", tie_word_embeddings=True,
    attention=AttentionConfig(attention_bias=True, o_proj_bias=True),
    mlp=MLPConfig(gated_mlp=False, mlp_bias=True),
    norm=NormConfig(norm_type="layer", layer_norm_epsilon=1e-5),
    positions=PositionConfig(position_embedding_type="alibi"),
    embedding=EmbeddingConfig(embedding_layernorm=True),
)
# 6 heads: not a power of two, so the second series of ALiBi slopes is used too. Untied: a tiny
# random BLOOM with a tied head only ever repeats its last token (the embedding LayerNorm makes
# the token's own embedding dominate the logits), which would make greedy comparisons vacuous.
BLOOM_TINY = BLOOM_560M.replace(
    vocab_size=256, hidden_size=96, num_hidden_layers=2, num_attention_heads=6,
    num_key_value_heads=6, head_dim=16, intermediate_size=384, tie_word_embeddings=False,
)
PRESETS = {"bloom_560m": BLOOM_560M, "bloom_tiny": BLOOM_TINY}
HF_REPOS = {"bloom_560m": "bigscience/bloom-560m"}


def config_fields(hf: Any) -> dict[str, Any]:
    hf.refuse(apply_residual_connection_post_layernorm=True)
    hidden = hf.get("hidden_size") or hf.require("n_embed")
    heads = hf.require("n_head")
    return dict(
        vocab_size=hf.require("vocab_size"), hidden_size=hidden,
        num_hidden_layers=hf.require("n_layer"), num_attention_heads=heads,
        num_key_value_heads=heads, head_dim=hidden // heads, intermediate_size=4 * hidden,
        # ALiBi has no table of positions; BLOOM was trained on 2048-token sequences.
        max_position_embeddings=2048,
        hidden_act="gelu_new",  # BloomGelu is the tanh approximation
        gated_mlp=False, position_embedding_type="alibi", norm_type="layer",
        layer_norm_epsilon=float(hf.get("layer_norm_epsilon", 1e-5)), embedding_layernorm=True,
        attention_bias=True, o_proj_bias=True, mlp_bias=True,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
    )


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    if cfg.intermediate_size != 4 * cfg.hidden_size:
        raise ValueError("BLOOM's MLP is 4 x hidden_size wide.")
    return dict(architectures=[cfg.architecture], bos_token_id=None, eos_token_id=None,
                vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                n_layer=cfg.num_hidden_layers, n_head=cfg.num_attention_heads,
                layer_norm_epsilon=cfg.norm.layer_norm_epsilon,
                tie_word_embeddings=cfg.tie_word_embeddings)


CHECKPOINT_GLOBALS = {"model.embed_tokens.weight": "word_embeddings.weight",
                      "model.embed_layernorm.weight": "word_embeddings_layernorm.weight",
                      "model.embed_layernorm.bias": "word_embeddings_layernorm.bias",
                      "model.norm.weight": "ln_f.weight", "model.norm.bias": "ln_f.bias"}


def checkpoint_layer(cfg: ModelConfig, i: int) -> dict[str, Part]:
    """BLOOM's layer names (Falcon's too, with its own q/k/v layout)."""
    return bloom_like_layer(cfg, i, per_head=True)


def bloom_like_layer(cfg: ModelConfig, i: int, per_head: bool) -> dict[str, Part]:
    from llm_onnx.families.layouts import concat_part

    h, p = f"h.{i}", f"model.layers.{i}"
    out = {}
    for kind in ("weight", "bias"):
        for which, proj in enumerate(QKV):
            relayout = per_head_part(which) if per_head else concat_part(which, transposed=False)
            out[f"{p}.self_attn.{proj}.{kind}"] = Part(
                f"{h}.self_attention.query_key_value.{kind}", relayout,
                fused_qkv_shape(transposed=False))
        out[f"{p}.self_attn.o_proj.{kind}"] = Part(f"{h}.self_attention.dense.{kind}")
        out[f"{p}.mlp.up_proj.{kind}"] = Part(f"{h}.mlp.dense_h_to_4h.{kind}")
        out[f"{p}.mlp.down_proj.{kind}"] = Part(f"{h}.mlp.dense_4h_to_h.{kind}")
        out[f"{p}.input_layernorm.{kind}"] = Part(f"{h}.input_layernorm.{kind}")
        out[f"{p}.post_attention_layernorm.{kind}"] = Part(f"{h}.post_attention_layernorm.{kind}")
    return out


FAMILY = Family(
    architecture=ARCHITECTURE, summary=__doc__, hf_config_class=HF_CONFIG_CLASS,
    config_fields=config_fields, hf_config=hf_config, presets=PRESETS, hf_repos=HF_REPOS,
    checkpoint_globals=CHECKPOINT_GLOBALS, checkpoint_layer=checkpoint_layer)

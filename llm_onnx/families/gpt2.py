"""GPT-2: learned absolute positions, LayerNorm, a plain GELU (tanh) MLP, biases on every
projection, multi-head attention. Its checkpoints use Conv1D weights (stored (in, out)) and one
fused q/k/v tensor laid out [q | k | v]."""

from __future__ import annotations

from typing import Any

from llm_onnx.families.family import Family
from llm_onnx.families.layouts import QKV, Part, concat_part, fused_qkv_shape, transpose
from llm_onnx.modeling.config import (
    AttentionConfig,
    MLPConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
)

ARCHITECTURE = "GPT2LMHeadModel"
HF_CONFIG_CLASS = "GPT2Config"

GPT2 = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=50_257, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
    num_key_value_heads=12, head_dim=64, intermediate_size=3072, max_position_embeddings=1024,
    hidden_act="gelu_new", tie_word_embeddings=True,
    attention=AttentionConfig(attention_bias=True, o_proj_bias=True),
    mlp=MLPConfig(gated_mlp=False, mlp_bias=True),
    norm=NormConfig(norm_type="layer", layer_norm_epsilon=1e-5),
    positions=PositionConfig(position_embedding_type="learned"),
)
# Multi-head attention fixes head_dim = hidden / heads here; n_inner != 4 * hidden.
GPT2_TINY = GPT2.replace(
    vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, head_dim=16, intermediate_size=96, max_position_embeddings=128,
)
PRESETS = {"gpt2": GPT2, "gpt2_tiny": GPT2_TINY}
HF_REPOS = {"gpt2": "openai-community/gpt2"}


def config_fields(hf: Any) -> dict[str, Any]:
    hf.refuse(scale_attn_by_inverse_layer_idx=True, add_cross_attention=True,
              scale_attn_weights=False)
    hidden = hf.require("n_embd")
    heads = hf.require("n_head")
    return dict(
        vocab_size=hf.require("vocab_size"), hidden_size=hidden,
        num_hidden_layers=hf.require("n_layer"), num_attention_heads=heads,
        num_key_value_heads=heads, head_dim=hidden // heads,
        intermediate_size=hf.get("n_inner") or 4 * hidden,
        max_position_embeddings=hf.require("n_positions"),
        hidden_act=hf.get("activation_function", "gelu_new"), gated_mlp=False,
        position_embedding_type="learned", norm_type="layer",
        layer_norm_epsilon=float(hf.get("layer_norm_epsilon", 1e-5)),
        attention_bias=True, o_proj_bias=True, mlp_bias=True,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
    )


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    return dict(architectures=[cfg.architecture], bos_token_id=None, eos_token_id=None,
                vocab_size=cfg.vocab_size, n_embd=cfg.hidden_size, n_layer=cfg.num_hidden_layers,
                n_head=cfg.num_attention_heads, n_inner=cfg.intermediate_size,
                n_positions=cfg.max_position_embeddings, activation_function=cfg.hidden_act,
                layer_norm_epsilon=cfg.norm.layer_norm_epsilon,
                tie_word_embeddings=cfg.tie_word_embeddings)


CHECKPOINT_GLOBALS = {"model.embed_tokens.weight": "wte.weight",
                      "model.embed_positions.weight": "wpe.weight",
                      "model.norm.weight": "ln_f.weight", "model.norm.bias": "ln_f.bias"}
# The causal-mask buffers some GPT-2 checkpoints hold
CHECKPOINT_SKIP = r"^(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)$"


def checkpoint_layer(cfg: ModelConfig, i: int) -> dict[str, Part]:
    h, p = f"h.{i}", f"model.layers.{i}"
    out = {}
    for kind in ("weight", "bias"):
        for which, proj in enumerate(QKV):
            out[f"{p}.self_attn.{proj}.{kind}"] = Part(
                f"{h}.attn.c_attn.{kind}", concat_part(which, transposed=True),
                fused_qkv_shape(transposed=True))
        t = transpose if kind == "weight" else None
        out[f"{p}.self_attn.o_proj.{kind}"] = Part(f"{h}.attn.c_proj.{kind}", t)
        out[f"{p}.mlp.up_proj.{kind}"] = Part(f"{h}.mlp.c_fc.{kind}", t)
        out[f"{p}.mlp.down_proj.{kind}"] = Part(f"{h}.mlp.c_proj.{kind}", t)
        out[f"{p}.input_layernorm.{kind}"] = Part(f"{h}.ln_1.{kind}")
        out[f"{p}.post_attention_layernorm.{kind}"] = Part(f"{h}.ln_2.{kind}")
    return out


FAMILY = Family(
    architecture=ARCHITECTURE, summary=__doc__, hf_config_class=HF_CONFIG_CLASS,
    config_fields=config_fields, hf_config=hf_config, presets=PRESETS, hf_repos=HF_REPOS,
    checkpoint_globals=CHECKPOINT_GLOBALS, checkpoint_layer=checkpoint_layer,
    checkpoint_skip=CHECKPOINT_SKIP)

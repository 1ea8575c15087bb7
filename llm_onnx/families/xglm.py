"""XGLM: fixed sinusoidal positions (tensor2tensor's [sin | cos] table, read at position + 2, as
fairseq did, with row ``pad_token_id`` zeroed as transformers does: pad_token_id 2 zeroes
position 0's row, the usual 1 a row no position reads), token embeddings scaled by
sqrt(d_model), pre-LN LayerNorm with a final norm, a plain GELU MLP, biases on every
projection, multi-head attention, tied embeddings. The family this project carries for
sinusoidal positions: the classic choice teaching material compares with learned (GPT-2, OPT)
and rotary ones."""

from __future__ import annotations

import math
from typing import Any

from llm_onnx.errors import ConfigError
from llm_onnx.families.family import Family
from llm_onnx.families.layouts import Part, fairseq_layer
from llm_onnx.modeling.config import (
    AttentionConfig,
    EmbeddingConfig,
    MLPConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
)

ARCHITECTURE = "XGLMForCausalLM"
HF_CONFIG_CLASS = "XGLMConfig"

XGLM_1_7B = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=256_008, hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
    num_key_value_heads=16, head_dim=128, intermediate_size=8192, max_position_embeddings=2048,
    hidden_act="gelu", tie_word_embeddings=True,
    attention=AttentionConfig(attention_bias=True, o_proj_bias=True),
    mlp=MLPConfig(gated_mlp=False, mlp_bias=True),
    norm=NormConfig(norm_type="layer", layer_norm_epsilon=1e-5),
    positions=PositionConfig(position_embedding_type="sinusoidal", position_offset=2,
                             position_padding_idx=1),
    embedding=EmbeddingConfig(embedding_multiplier=math.sqrt(2048)),
)
XGLM_TINY = XGLM_1_7B.replace(
    vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, head_dim=16, intermediate_size=96, max_position_embeddings=128,
    embedding_multiplier=math.sqrt(64),
)
PRESETS = {"xglm_1_7b": XGLM_1_7B, "xglm_tiny": XGLM_TINY}
HF_REPOS = {"xglm_1_7b": "facebook/xglm-1.7B"}


OFFSET = 2  # position p reads row p + 2 of the table


def padding_row(hf: Any, rows: int) -> int | None:
    """The row of the position table transformers zeroes: its padding_idx, the config's
    pad_token_id (1 when the field is absent, XGLMConfig's default; none when it is null), a
    negative one counted from the end of the table (rows = context + 2), as torch indexes it."""
    pad = hf.data["pad_token_id"] if "pad_token_id" in hf.data else 1
    if pad is None:
        return None
    if not isinstance(pad, int) or isinstance(pad, bool) or not -rows <= pad < rows:
        raise ConfigError(f"{hf.source}: pad_token_id={pad!r} is not a row of XGLM's position "
                          f"table of {rows} rows (max_position_embeddings + {OFFSET}), which "
                          "transformers zeroes; it cannot build this model either.")
    return pad % rows


def config_fields(hf: Any) -> dict[str, Any]:
    hf.refuse(add_cross_attention=True)
    hidden = hf.require("d_model")
    heads = hf.require("attention_heads")
    context = hf.get("max_position_embeddings", 2048)
    return dict(
        vocab_size=hf.require("vocab_size"), hidden_size=hidden,
        num_hidden_layers=hf.require("num_layers"), num_attention_heads=heads,
        num_key_value_heads=heads, head_dim=hidden // heads,
        intermediate_size=hf.require("ffn_dim"),
        max_position_embeddings=context,
        hidden_act=hf.get("activation_function", "gelu"), gated_mlp=False,
        position_embedding_type="sinusoidal", position_offset=OFFSET,
        position_padding_idx=padding_row(hf, context + OFFSET),
        embedding_multiplier=math.sqrt(hidden) if hf.get("scale_embedding", True) else 1.0,
        norm_type="layer", layer_norm_epsilon=1e-5,  # nn.LayerNorm's default; no config field
        attention_bias=True, o_proj_bias=True, mlp_bias=True,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
    )


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    return dict(architectures=[cfg.architecture], bos_token_id=None, eos_token_id=None,
                pad_token_id=cfg.positions.position_padding_idx, vocab_size=cfg.vocab_size,
                d_model=cfg.hidden_size,
                num_layers=cfg.num_hidden_layers, attention_heads=cfg.num_attention_heads,
                ffn_dim=cfg.intermediate_size, max_position_embeddings=cfg.max_position_embeddings,
                activation_function=cfg.hidden_act,
                scale_embedding=cfg.embedding.embedding_multiplier != 1.0,
                tie_word_embeddings=cfg.tie_word_embeddings)


CHECKPOINT_GLOBALS = {"model.embed_tokens.weight": "model.embed_tokens.weight",
                      "model.norm.weight": "model.layer_norm.weight",
                      "model.norm.bias": "model.layer_norm.bias"}


def checkpoint_layer(cfg: ModelConfig, i: int) -> dict[str, Part]:
    return fairseq_layer(f"model.layers.{i}", f"model.layers.{i}")


FAMILY = Family(
    architecture=ARCHITECTURE, summary=__doc__, hf_config_class=HF_CONFIG_CLASS,
    config_fields=config_fields, hf_config=hf_config, presets=PRESETS, hf_repos=HF_REPOS,
    checkpoint_globals=CHECKPOINT_GLOBALS, checkpoint_layer=checkpoint_layer)

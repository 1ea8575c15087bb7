"""OPT: learned absolute positions read with an offset of 2, LayerNorm, a ReLU MLP, biases on
every projection, multi-head attention, tied embeddings. OPT-350m is the post-LN variant
(``do_layer_norm_before=False``: x = norm(x + f(x)) after each sub-block, no final norm) with
embeddings narrower than its layers (``word_embed_proj_dim`` 512, ``project_in`` /
``project_out``); the other sizes are pre-LN like GPT-2. Configs without LayerNorm affine
parameters (``layer_norm_elementwise_affine=false``) or without biases are refused."""

from __future__ import annotations

from typing import Any

from llm_onnx.families.family import Family
from llm_onnx.families.layouts import Part, fairseq_layer
from llm_onnx.modeling.config import (
    AttentionConfig,
    MLPConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
)

ARCHITECTURE = "OPTForCausalLM"
HF_CONFIG_CLASS = "OPTConfig"

OPT_125M = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=50_272, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
    num_key_value_heads=12, head_dim=64, intermediate_size=3072, max_position_embeddings=2048,
    hidden_act="relu", tie_word_embeddings=True,
    attention=AttentionConfig(attention_bias=True, o_proj_bias=True),
    mlp=MLPConfig(gated_mlp=False, mlp_bias=True),
    norm=NormConfig(norm_type="layer", layer_norm_epsilon=1e-5),
    positions=PositionConfig(position_embedding_type="learned", position_offset=2),
)
OPT_350M = OPT_125M.replace(
    hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
    head_dim=64, intermediate_size=4096, topology="post", embed_dim=512,
)
# The post-LN variant with its projections first (the tests run the first tiny preset through
# every rung); the pre-LN one through the torch rungs. Multi-head: head_dim = hidden / heads.
# Its embeddings are wider than the layers here (OPT-350m's are narrower; the projections are
# the same code either way): through project_out and a 32-wide head the tests' random weights
# give logits of a third of the other families' spread, too flat for the fp16 and quantized rungs
# to mean much.
OPT_350M_TINY = OPT_350M.replace(
    vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, head_dim=16, intermediate_size=96, max_position_embeddings=128,
    embed_dim=128,
)
OPT_TINY = OPT_125M.replace(
    vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, head_dim=16, intermediate_size=96, max_position_embeddings=128,
)
PRESETS = {"opt_125m": OPT_125M, "opt_350m": OPT_350M, "opt_350m_tiny": OPT_350M_TINY,
           "opt_tiny": OPT_TINY}
HF_REPOS = {"opt_125m": "facebook/opt-125m", "opt_350m": "facebook/opt-350m"}


def config_fields(hf: Any) -> dict[str, Any]:
    hf.refuse(layer_norm_elementwise_affine=False, enable_bias=False,
              _remove_final_layer_norm=True)
    hidden = hf.require("hidden_size")
    heads = hf.require("num_attention_heads")
    embed = hf.get("word_embed_proj_dim", hidden)
    return dict(
        vocab_size=hf.require("vocab_size"), hidden_size=hidden,
        num_hidden_layers=hf.require("num_hidden_layers"), num_attention_heads=heads,
        num_key_value_heads=heads, head_dim=hidden // heads,
        intermediate_size=hf.require("ffn_dim"),
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        hidden_act=hf.get("activation_function", "relu"), gated_mlp=False,
        position_embedding_type="learned", position_offset=2, norm_type="layer",
        layer_norm_epsilon=1e-5,  # OPT's nn.LayerNorm default; config.json has no field for it
        attention_bias=True, o_proj_bias=True, mlp_bias=True,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        topology="pre" if hf.get("do_layer_norm_before", True) else "post",
        embed_dim=embed if embed != hidden else None,
    )


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    return dict(architectures=[cfg.architecture], bos_token_id=None, eos_token_id=None,
                pad_token_id=None, vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                num_hidden_layers=cfg.num_hidden_layers,
                num_attention_heads=cfg.num_attention_heads, ffn_dim=cfg.intermediate_size,
                max_position_embeddings=cfg.max_position_embeddings,
                activation_function=cfg.hidden_act, do_layer_norm_before=cfg.residual.topology != "post",
                word_embed_proj_dim=cfg.embed_width, enable_bias=True,
                tie_word_embeddings=cfg.tie_word_embeddings)


CHECKPOINT_GLOBALS = {"model.embed_tokens.weight": "model.decoder.embed_tokens.weight",
                      "model.embed_positions.weight": "model.decoder.embed_positions.weight",
                      "model.project_in.weight": "model.decoder.project_in.weight",
                      "model.project_out.weight": "model.decoder.project_out.weight",
                      "model.norm.weight": "model.decoder.final_layer_norm.weight",
                      "model.norm.bias": "model.decoder.final_layer_norm.bias"}


def checkpoint_layer(cfg: ModelConfig, i: int) -> dict[str, Part]:
    # Pre-LN: the two norms come before attention and before the MLP; post-LN: after each.
    return fairseq_layer(f"model.decoder.layers.{i}", f"model.layers.{i}")


FAMILY = Family(
    architecture=ARCHITECTURE, summary=__doc__, hf_config_class=HF_CONFIG_CLASS,
    config_fields=config_fields, hf_config=hf_config, presets=PRESETS, hf_repos=HF_REPOS,
    checkpoint_globals=CHECKPOINT_GLOBALS, checkpoint_layer=checkpoint_layer)

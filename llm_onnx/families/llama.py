"""Llama (Llama 3, SmolLM2): the reference family the decoder's names and defaults follow.

RoPE (with Llama 3's frequency scaling), RMSNorm, a SwiGLU MLP, grouped-query attention, no
biases unless ``attention_bias`` / ``mlp_bias``. Checkpoints already use the decoder's tensor
names; GGUF files (llama.cpp's ``llama``) interleave q/k rows, which the reader undoes.
"""

from __future__ import annotations

from typing import Any

from llm_onnx.families.family import Family
from llm_onnx.families.layouts import GGUFNames
from llm_onnx.modeling.config import ModelConfig

ARCHITECTURE = "LlamaForCausalLM"
HF_CONFIG_CLASS = "LlamaConfig"
# the bare model (no LM head): embedding models such as Qwen3-Embedding, read with --task embed
ALIASES = ("LlamaModel",)

LLAMA3_8B = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=128_256, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, intermediate_size=14_336, rope_theta=500_000.0,
    rms_norm_eps=1e-5, max_position_embeddings=8192, tie_word_embeddings=False,
)
SMOLLM2_135M = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=49_152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, head_dim=64, intermediate_size=1536, rope_theta=100_000.0,
    rms_norm_eps=1e-5, max_position_embeddings=8192, tie_word_embeddings=True,
)
# Tiny test shapes. head_dim != hidden/heads and kv heads < heads expose layout bugs;
# one tied, one untied.
LLAMA_TINY = LLAMA3_8B.replace(
    vocab_size=256, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, intermediate_size=96, max_position_embeddings=256,
)
SMOLLM2_TINY = SMOLLM2_135M.replace(
    vocab_size=256, hidden_size=48, num_hidden_layers=2, num_attention_heads=6,
    num_key_value_heads=2, head_dim=16, intermediate_size=64, max_position_embeddings=256,
)
PRESETS = {"llama3_8b": LLAMA3_8B, "smollm2_135m": SMOLLM2_135M, "llama_tiny": LLAMA_TINY,
           "smollm2_tiny": SMOLLM2_TINY}
HF_REPOS = {"llama3_8b": "meta-llama/Meta-Llama-3-8B",
            "smollm2_135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}


def rope_fields(hf: Any) -> dict[str, Any]:
    """rope_theta and rope_scaling from either the classic fields or transformers 5's
    rope_parameters."""
    from llm_onnx.errors import ConfigError

    params = hf.get("rope_parameters") or {}
    theta = hf.get("rope_theta", params.get("rope_theta", 10_000.0))
    scaling = hf.get("rope_scaling")
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if scaling is not None:
        scaling = dict(scaling)
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type == "default":
            scaling = None
        elif rope_type not in ("linear", "llama3", "yarn"):
            raise ConfigError(f"{hf.source}: rope_scaling type '{rope_type}' is not supported "
                              f"for {hf.architecture}; supported: linear, llama3, yarn.")
    return {"rope_theta": float(theta), "rope_scaling": scaling}


def base_fields(hf: Any) -> dict[str, Any]:
    """The config.json fields every Llama-like family shares (Mistral, Qwen2, Qwen3 start here)."""
    hidden = hf.require("hidden_size")
    heads = hf.require("num_attention_heads")
    return dict(
        vocab_size=hf.require("vocab_size"), hidden_size=hidden,
        num_hidden_layers=hf.require("num_hidden_layers"), num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hidden // heads,
        intermediate_size=hf.require("intermediate_size"),
        max_position_embeddings=hf.get("max_position_embeddings", 4096),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        hidden_act=hf.get("hidden_act", "silu"),
        attention_bias=bool(hf.get("attention_bias", False)),
        partial_rotary_factor=float(hf.get("partial_rotary_factor", 1.0)),
        **rope_fields(hf),
    )


def config_fields(hf: Any) -> dict[str, Any]:
    fields = base_fields(hf)
    fields["o_proj_bias"] = fields["attention_bias"]  # Llama's attention_bias covers o_proj too
    fields["mlp_bias"] = bool(hf.get("mlp_bias", False))
    return fields


def base_hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """The transformers config.json of a Llama-like ModelConfig."""
    return dict(
        architectures=[cfg.architecture], vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size, max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        tie_word_embeddings=cfg.tie_word_embeddings, attention_bias=cfg.attention.attention_bias,
        hidden_act=cfg.hidden_act,
    )


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    return dict(base_hf_config(cfg), mlp_bias=cfg.mlp.mlp_bias)


# llama.cpp's names: blk.N.<suffix> -> model.layers.N.<canonical suffix>
GGUF_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
GGUF_GLOBALS = {"token_embd.weight": "model.embed_tokens.weight",
                "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def gguf_fields(meta: Any) -> dict[str, Any]:
    """ModelConfig fields from GGUF metadata (``meta.need``/``meta.get`` take keys without the
    ``<arch>.`` prefix)."""
    hidden, heads = int(meta.need("embedding_length")), int(meta.need("attention.head_count"))
    return dict(
        vocab_size=meta.vocab_size(), hidden_size=hidden,
        num_hidden_layers=int(meta.need("block_count")), num_attention_heads=heads,
        num_key_value_heads=int(meta.get("attention.head_count_kv") or heads),
        head_dim=int(meta.get("attention.key_length") or hidden // heads),
        intermediate_size=int(meta.get("feed_forward_length") or 1),
        max_position_embeddings=int(meta.need("context_length")),
        rms_norm_eps=float(meta.need("attention.layer_norm_rms_epsilon")),
        rope_theta=float(meta.get("rope.freq_base") or 10_000.0),
        tie_word_embeddings="output.weight" not in meta.tensor_names,
    )


GGUF = GGUFNames(arch="llama", config_fields=gguf_fields, layer=GGUF_LAYER,
                 globals=GGUF_GLOBALS, unpermute_qk=True)


FAMILY = Family(
    architecture=ARCHITECTURE, summary=__doc__, hf_config_class=HF_CONFIG_CLASS,
    config_fields=config_fields, hf_config=hf_config, presets=PRESETS, hf_repos=HF_REPOS,
    gguf=GGUF, aliases=ALIASES)

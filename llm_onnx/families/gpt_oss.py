"""gpt-oss (``GptOssForCausalLM``, OpenAI's gpt-oss-20b and gpt-oss-120b): Llama's decoder with
these differences:

- attention: biases on q, k, v and o; a learned **sink** logit per query head joins every
  softmax over the keys (softmax over [scores, sink], the sink's share dropped);
  ``layer_types`` alternate sliding-window (128 keys) and full attention, the first sliding;
- RoPE with YaRN (base 150 000, factor 32 over an original 4096 positions, beta_fast 32,
  beta_slow 1, the correction range not truncated), cos and sin times 0.1 ln(32) + 1;
- a mixture of experts in every layer: a router with a bias, the top 4 experts, a softmax over
  their four logits (the renormalised top 4 of the full softmax); experts with biases whose
  gate/up rows interleave (g0, u0, g1, u1, ...), gate clamped to at most ``swiglu_limit`` (7)
  and up to +-7, out = (up + 1) * gate * sigmoid(1.702 gate).

Checkpoints: transformers' (``mlp.router``, the stacked ``mlp.experts.gate_up_proj`` (E, D, 2I)
and ``down_proj`` (E, I, D) with their ``*_bias``) or OpenAI's released ones, whose experts are
MXFP4 (``*_blocks``, ``*_scales``: checkpoints/mxfp4.py decodes them exactly, an expert at a
time). GGUF: llama.cpp's ``gpt-oss`` (gate and up split, MXFP4 experts). The chat format
(harmony) is the tokenizer's and the runtime's business, not this module's.
"""

from __future__ import annotations

from typing import Any

from llm_onnx.errors import ConfigError
from llm_onnx.families.family import Family
from llm_onnx.families.layouts import GGUFNames, Part
from llm_onnx.families.llama import (
    GGUF_GLOBALS,
    GGUF_LAYER,
    base_fields,
    base_hf_config,
    gguf_fields,
)
from llm_onnx.modeling.config import AttentionConfig, ModelConfig, MoEConfig

ARCHITECTURE = "GptOssForCausalLM"
HF_CONFIG_CLASS = "GptOssConfig"

# transformers' GptOssConfig default when a config.json names no RoPE scaling (the released
# files name this one)
YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False, "original_max_position_embeddings": 4096}


def alternating_layers(layers: int) -> tuple[str, ...]:
    """gpt-oss's pattern: even layers sliding, odd layers full."""
    return tuple("full_attention" if i % 2 else "sliding_attention" for i in range(layers))


def _moe(experts: int, width: int, k: int = 4, limit: float = 7.0,
         alpha: float = 1.702) -> MoEConfig:
    return MoEConfig(num_experts=experts, num_experts_per_tok=k, moe_intermediate_size=width,
                     norm_topk_prob=True, bias=True, swiglu_alpha=alpha, swiglu_beta=1.0,
                     swiglu_limit=limit)


# openai/gpt-oss-120b's config.json (transformers' GptOssConfig defaults are this model's)
GPT_OSS_120B = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=201_088, hidden_size=2880, num_hidden_layers=36, num_attention_heads=64,
    num_key_value_heads=8, head_dim=64, intermediate_size=2880, max_position_embeddings=131_072,
    rms_norm_eps=1e-5, rope_theta=150_000.0, rope_scaling=YARN, tie_word_embeddings=False,
    sliding_window=128, layer_types=alternating_layers(36),
    attention=AttentionConfig(attention_bias=True, o_proj_bias=True, attention_sinks=True),
    moe=_moe(128, 2880),
)
# openai/gpt-oss-20b: 24 layers, 32 experts; the rest as the 120b
GPT_OSS_20B = GPT_OSS_120B.replace(num_hidden_layers=24, layer_types=alternating_layers(24),
                                   moe=_moe(32, 2880))
# Two layers (sliding, full) with a window of 4 keys, so the tests' 5- and 9-token prompts
# slide it; 4 experts, top 2 (the test checkpoints set num_experts_per_tok); a swiglu_limit of
# 0.5, so that the clamps bite at random weights' small activations (7 never would); the
# vendor's YaRN, whose ramp covers dimensions 4-9 of the 16 frequencies at head_dim 32.
GPT_OSS_TINY = GPT_OSS_20B.replace(
    vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, intermediate_size=32, max_position_embeddings=256,
    sliding_window=4, layer_types=alternating_layers(2),
    moe=_moe(4, 32, k=2, limit=0.5),
)
PRESETS = {"gpt_oss_20b": GPT_OSS_20B, "gpt_oss_120b": GPT_OSS_120B, "gpt_oss_tiny": GPT_OSS_TINY}
HF_REPOS = {"gpt_oss_20b": "openai/gpt-oss-20b", "gpt_oss_120b": "openai/gpt-oss-120b"}


def config_fields(hf: Any) -> dict[str, Any]:
    quant = hf.get("quantization_config")
    if quant is not None and (not isinstance(quant, dict) or quant.get("quant_method") != "mxfp4"):
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        raise ConfigError(f"{hf.source}: quantization_config.quant_method {method!r} is not "
                          f"supported for {ARCHITECTURE}; supported: mxfp4 (the released "
                          "checkpoints) or none.")
    data = dict(hf.data)
    if data.get("rope_scaling") is None and data.get("rope_parameters") is None:
        data["rope_scaling"] = YARN  # transformers' default for gpt-oss
    elif data.get("rope_parameters") is not None and "rope_type" not in data["rope_parameters"]:
        data["rope_parameters"] = {**YARN, **data["rope_parameters"]}
    hf = type(hf)(data, hf.source)
    fields = base_fields(hf)
    bias = bool(hf.get("attention_bias", True))
    num_experts = hf.get("num_local_experts", hf.get("num_experts"))
    if num_experts is None:
        raise ConfigError(f"{hf.source}: missing field 'num_local_experts' needed by "
                          f"{ARCHITECTURE}.")
    width = hf.require("intermediate_size")
    layers = fields["num_hidden_layers"]
    types = hf.get("layer_types")
    window = hf.get("sliding_window", 128)
    return dict(
        fields, head_dim=hf.get("head_dim", 64), rms_norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        max_position_embeddings=hf.get("max_position_embeddings", 131_072),
        attention_bias=bias, o_proj_bias=bias, attention_sinks=True,
        sliding_window=window,
        layer_types=tuple(types) if types else alternating_layers(layers),
        moe=_moe(num_experts, width, hf.get("num_experts_per_tok", hf.get("experts_per_token", 4)),
                 float(hf.get("swiglu_limit", 7.0)), float(hf.get("swiglu_alpha", 1.702))),
    )


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    moe = cfg.moe
    assert moe is not None
    fields = base_hf_config(cfg)
    theta = fields.pop("rope_theta")
    return dict(fields, intermediate_size=moe.moe_intermediate_size,
                num_local_experts=moe.num_experts, num_experts_per_tok=moe.num_experts_per_tok,
                swiglu_limit=moe.swiglu_limit, swiglu_alpha=moe.swiglu_alpha,
                sliding_window=cfg.sliding_window, layer_types=list(cfg.layer_types or ()),
                rope_parameters={**(cfg.rope_scaling or {"rope_type": "default"}),
                                 "rope_theta": theta},
                attention_bias=cfg.attention.attention_bias, bos_token_id=None, eos_token_id=None,
                pad_token_id=None)


# ----------------------------------------------------------------------------- checkpoint names


def _stacked(source: str, e: int, rows: str) -> Part:
    """Expert e's gate, up (the even, odd columns of gate_up_proj (E, D, 2I)) or down
    ((E, I, D)) weight, transposed to (out, in); or, for a ``*_bias`` source, its bias."""
    is_bias = source.endswith("_bias")

    def relayout(t: Any, cfg: ModelConfig) -> Any:
        x = t[e]  # an MXFP4Experts decodes this expert alone
        if rows == "gate":
            x = x[0::2] if is_bias else x[:, 0::2]
        elif rows == "up":
            x = x[1::2] if is_bias else x[:, 1::2]
        return x if is_bias else x.t()

    def shape(cfg: ModelConfig, _: bool) -> tuple[int, ...]:
        moe = cfg.moe
        assert moe is not None
        d, i, n = cfg.hidden_size, moe.moe_intermediate_size, moe.num_experts
        if is_bias:
            return (n, d) if rows == "down" else (n, 2 * i)
        return (n, i, d) if rows == "down" else (n, d, 2 * i)

    return Part(source, relayout, fused_shape=shape, fused="the experts' projections")


CHECKPOINT_GLOBALS = {"model.embed_tokens.weight": "model.embed_tokens.weight",
                      "model.norm.weight": "model.norm.weight"}


def checkpoint_layer(cfg: ModelConfig, i: int) -> dict[str, Part]:
    p = f"model.layers.{i}"
    out = {f"{p}.{n}": Part(f"{p}.{n}") for n in (
        "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.sinks")}
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        for kind in ("weight", "bias"):
            out[f"{p}.self_attn.{proj}.{kind}"] = Part(f"{p}.self_attn.{proj}.{kind}")
    for kind in ("weight", "bias"):
        out[f"{p}.mlp.gate.{kind}"] = Part(f"{p}.mlp.router.{kind}")
    moe = cfg.moe
    assert moe is not None
    ex = f"{p}.mlp.experts"
    for e in range(moe.num_experts):
        for rows in ("gate", "up"):
            out[f"{ex}.{e}.{rows}_proj.weight"] = _stacked(f"{ex}.gate_up_proj", e, rows)
            out[f"{ex}.{e}.{rows}_proj.bias"] = _stacked(f"{ex}.gate_up_proj_bias", e, rows)
        out[f"{ex}.{e}.down_proj.weight"] = _stacked(f"{ex}.down_proj", e, "down")
        out[f"{ex}.{e}.down_proj.bias"] = _stacked(f"{ex}.down_proj_bias", e, "down")
    return out


# ----------------------------------------------------------------------------- GGUF


def gpt_oss_gguf_fields(meta: Any) -> dict[str, Any]:
    """llama.cpp's gpt-oss metadata: Llama's fields, the experts' width, the window (even layers
    sliding, llama.cpp's pattern 2 unless the file lists one) and YaRN."""
    fields = gguf_fields(meta)
    layers = fields["num_hidden_layers"]
    pattern = meta.get("attention.sliding_window_pattern")
    if isinstance(pattern, list):
        types = tuple("sliding_attention" if p else "full_attention" for p in pattern)
    else:
        n = int(pattern or 2)
        types = tuple("sliding_attention" if i % n < n - 1 else "full_attention"
                      for i in range(layers))
    scaling = None
    if meta.get("rope.scaling.type") == "yarn":
        scaling = dict(YARN, factor=float(meta.need("rope.scaling.factor")),
                       original_max_position_embeddings=int(
                           meta.need("rope.scaling.original_context_length")))
        for key, name in (("beta_fast", "rope.scaling.yarn_beta_fast"),
                          ("beta_slow", "rope.scaling.yarn_beta_slow")):
            if meta.get(name) is not None:
                scaling[key] = float(meta.get(name))
    width = int(meta.need("expert_feed_forward_length"))
    return dict(
        fields, intermediate_size=width, rope_theta=float(meta.get("rope.freq_base") or 150_000.0),
        rope_scaling=scaling, attention_bias=True, o_proj_bias=True, attention_sinks=True,
        sliding_window=int(meta.need("attention.sliding_window")), layer_types=types,
        # llama.cpp's SWIGLU_OAI_MOE: alpha 1.702 and limit 7 are constants of its kernel
        moe=_moe(int(meta.need("expert_count")), width, int(meta.need("expert_used_count"))))


GGUF = GGUFNames(
    arch="gpt-oss", config_fields=gpt_oss_gguf_fields, globals=GGUF_GLOBALS,
    layer={**{k: v for k, v in GGUF_LAYER.items() if not k.startswith("ffn_")},
           "attn_output.bias": "self_attn.o_proj.bias",
           "post_attention_norm.weight": "post_attention_layernorm.weight",
           "attn_sinks.weight": "self_attn.sinks",
           "ffn_gate_inp.weight": "mlp.gate.weight", "ffn_gate_inp.bias": "mlp.gate.bias"},
    experts={"ffn_gate_exps.weight": "gate_proj.weight", "ffn_up_exps.weight": "up_proj.weight",
             "ffn_down_exps.weight": "down_proj.weight", "ffn_gate_exps.bias": "gate_proj.bias",
             "ffn_up_exps.bias": "up_proj.bias", "ffn_down_exps.bias": "down_proj.bias"})


FAMILY = Family(
    architecture=ARCHITECTURE, summary=__doc__, hf_config_class=HF_CONFIG_CLASS,
    config_fields=config_fields, hf_config=hf_config, presets=PRESETS, hf_repos=HF_REPOS,
    checkpoint_globals=CHECKPOINT_GLOBALS, checkpoint_layer=checkpoint_layer, gguf=GGUF)

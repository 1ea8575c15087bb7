"""Qwen3.5 and Qwen3.6 (dense, ``Qwen3_5ForCausalLM``): a hybrid of Gated DeltaNet linear
attention (three layers of every four, a recurrent state per row) and gated full attention
(every fourth layer, a KV cache). Differences from Qwen3:

- ``layer_types`` names each layer ``linear_attention`` or ``full_attention``
  (``full_attention_interval``, 4 by default, when a config lists none);
- linear-attention layers (``linear_attn``): in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, a
  causal depthwise conv1d with SiLU over q, k, v, L2-normalised q and k, decay
  g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), the gated delta rule, an RMSNorm
  gated by silu(z) (scaling by w), out_proj; key heads may be fewer than value heads;
- full-attention layers: q_proj emits each head's query and an output gate; output *
  sigmoid(gate); QK-norm; partial rotary (0.25 of head_dim); the multimodal RoPE sections reduce
  to ordinary RoPE for text;
- the layer norms, the final norm and the q/k norms store w and scale by (1 + w), as Gemma's do
  (read here as the plain RMSNorm of 1 + w).

Checkpoints: the text-only class, or ``Qwen3_5ForConditionalGeneration`` with the text fields
under ``text_config`` and the text weights under ``model.language_model.``, and the vision tower
under ``model.visual.`` (qwen_vision.py: read beside the text model unless exported
``--text-only``; no DeepStack); the multi-token-prediction head (``mtp.``) is never loaded.
GGUF: llama.cpp's ``qwen35``, whose converter re-orders the value heads (tiled) and stores
-exp(A_log); both are undone on reading. Qwen3.5-MoE and Qwen3-Next build on this module
(qwen3_5_moe.py, qwen3_next.py)."""

from __future__ import annotations

from typing import Any

from llm_onnx.errors import CheckpointError, ConfigError
from llm_onnx.families.family import Family
from llm_onnx.families.gemma3 import plus_one
from llm_onnx.families.layouts import GGUFNames, Part
from llm_onnx.families.llama import GGUF_GLOBALS
from llm_onnx.families.qwen_vision import vision_fields
from llm_onnx.modeling.config import AttentionConfig, LinearAttentionConfig, ModelConfig
from llm_onnx.modeling.vision_config import VisionConfig

ARCHITECTURE = "Qwen3_5ForCausalLM"
HF_CONFIG_CLASS = "Qwen3_5TextConfig"
ALIASES = ("Qwen3_5ForConditionalGeneration",)  # the released checkpoints: text under text_config
NORM_WEIGHT_OFFSET = 1.0  # its layer, final and q/k norms multiply by (1 + the stored weight)
CHECKPOINT_NESTED = ("model.", "model.language_model.")  # the released checkpoints' text weights
CHECKPOINT_SKIP = r"^(model\.visual\.|mtp\.)"  # the vision tower (read apart) and the MTP head
IMAGE_TOKEN_ID = 248_056  # <|image_pad|> (transformers' default)
MROPE_SECTION = (11, 11, 10)


def interval_layers(layers: int, interval: int = 4) -> tuple[str, ...]:
    """Every ``interval``-th layer full attention, the others linear attention."""
    return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention"
                 for i in range(layers))


# transformers' default Qwen3_5TextConfig: the shape of Qwen3.5-9B (RoPE base as the released
# checkpoints set it, 1e7; transformers' generic default is 1e4)
QWEN3_5_9B = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=248_320, hidden_size=4096, num_hidden_layers=32, num_attention_heads=16,
    num_key_value_heads=4, head_dim=256, intermediate_size=12_288, rope_theta=10_000_000.0,
    partial_rotary_factor=0.25, rms_norm_eps=1e-6, max_position_embeddings=262_144,
    tie_word_embeddings=False, layer_types=interval_layers(32),
    attention=AttentionConfig(qk_norm=True, attention_output_gate=True),
    linear_attention=LinearAttentionConfig(num_key_heads=16, num_value_heads=32, key_head_dim=128,
                                           value_head_dim=128, conv_kernel=4),
)
# A linear and a full layer (every second: the tiny presets of every family have two or three
# layers), two value heads per key head, head_dim 64 so that the quarter-width rotary (16) is
# one GroupQueryAttention takes, d_k != d_v.
QWEN3_5_TINY = QWEN3_5_9B.replace(
    vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=64, intermediate_size=128, max_position_embeddings=256,
    rope_theta=10_000.0, layer_types=interval_layers(2, 2),
    linear_attention=LinearAttentionConfig(num_key_heads=2, num_value_heads=4, key_head_dim=16,
                                           value_head_dim=32, conv_kernel=4),
)
PRESETS = {"qwen3_5_9b": QWEN3_5_9B, "qwen3_5_tiny": QWEN3_5_TINY}
HF_REPOS = {"qwen3_5_9b": "Qwen/Qwen3.5-9B"}


# ----------------------------------------------------------------------------- config.json


def text_config(hf: Any) -> Any:
    """The text model's fields: ``text_config`` of a multimodal config, else the config itself."""
    nested = hf.get("text_config")
    if nested is None:
        return hf
    if not isinstance(nested, dict):
        raise ConfigError(f"{hf.source}: text_config must be an object.")
    return type(hf)(dict(nested, architectures=[hf.architecture]), f"{hf.source} (text_config)")


def _rope(hf: Any) -> dict[str, Any]:
    """RoPE base and rotary fraction from ``rope_parameters`` (transformers 5) or the top-level
    fields of older configs. Text positions make the multimodal sections ordinary RoPE."""
    params = hf.get("rope_parameters") or {}
    kind = params.get("rope_type", (hf.get("rope_scaling") or {}).get("rope_type", "default"))
    if kind not in ("default", None):
        raise ConfigError(f"{hf.source}: rope_type '{kind}' is not supported for "
                          f"{hf.architecture}; supported: default.")
    return dict(rope_theta=float(params.get("rope_theta", hf.get("rope_theta", 10_000.0))),
                partial_rotary_factor=float(params.get("partial_rotary_factor",
                                                       hf.get("partial_rotary_factor", 0.25))))


def hybrid_fields(hf: Any) -> dict[str, Any]:
    """The fields Qwen3.5, Qwen3.5-MoE and Qwen3-Next share (``hf``: the text config)."""
    layers = hf.require("num_hidden_layers")
    types = hf.get("layer_types")
    if types is None:
        types = interval_layers(layers, hf.get("full_attention_interval", 4))
    unknown = sorted(set(types) - {"linear_attention", "full_attention"})
    if unknown:
        raise ConfigError(f"{hf.source}: layer_types names '{unknown[0]}', which "
                          f"{hf.architecture} does not have; known: linear_attention, "
                          "full_attention.")
    if len(types) != layers:
        raise ConfigError(f"{hf.source}: layer_types lists {len(types)} layers, "
                          f"num_hidden_layers is {layers}.")
    hf.refuse(attn_output_gate=False)
    heads = hf.require("num_attention_heads")
    return dict(
        vocab_size=hf.require("vocab_size"), hidden_size=hf.require("hidden_size"),
        num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.require("head_dim"),
        max_position_embeddings=hf.get("max_position_embeddings", 32_768),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        hidden_act=hf.get("hidden_act", "silu"), attention_bias=bool(hf.get("attention_bias", False)),
        qk_norm=True, attention_output_gate=True, layer_types=tuple(types), **_rope(hf),
        linear_attention=LinearAttentionConfig(
            num_key_heads=hf.require("linear_num_key_heads"),
            num_value_heads=hf.require("linear_num_value_heads"),
            key_head_dim=hf.require("linear_key_head_dim"),
            value_head_dim=hf.require("linear_value_head_dim"),
            conv_kernel=hf.get("linear_conv_kernel_dim", 4)),
    )


def config_fields(hf: Any) -> dict[str, Any]:
    hf = text_config(hf)
    return dict(hybrid_fields(hf), intermediate_size=hf.require("intermediate_size"))


def vision_config(hf: Any) -> VisionConfig | None:
    """The tower of a ``Qwen3_5ForConditionalGeneration`` (and its MoE sibling's)."""
    return vision_fields(hf, default_section=MROPE_SECTION, default_image_token=IMAGE_TOKEN_ID,
                         deepstack=False)


def hybrid_hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """The transformers text config of a Qwen3.5-like ModelConfig."""
    la = cfg.linear_attention
    assert la is not None and cfg.layer_types is not None
    rotary = cfg.rotary_dim // 2
    return dict(
        architectures=[cfg.architecture], vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_word_embeddings, hidden_act=cfg.hidden_act,
        attention_bias=cfg.attention.attention_bias, layer_types=list(cfg.layer_types),
        linear_num_key_heads=la.num_key_heads, linear_num_value_heads=la.num_value_heads,
        linear_key_head_dim=la.key_head_dim, linear_value_head_dim=la.value_head_dim,
        linear_conv_kernel_dim=la.conv_kernel,
        rope_parameters=dict(rope_type="default", rope_theta=cfg.rope_theta,
                             partial_rotary_factor=cfg.partial_rotary_factor,
                             mrope_section=[rotary - 2 * (rotary // 4), rotary // 4, rotary // 4],
                             mrope_interleaved=True),
    )


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    return dict(hybrid_hf_config(cfg), intermediate_size=cfg.intermediate_size)


# ----------------------------------------------------------------------------- checkpoints

NORMS = ("input_layernorm", "post_attention_layernorm")
LINEAR_TENSORS = ("in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight",
                  "out_proj.weight", "conv1d.weight", "A_log", "dt_bias", "norm.weight")
CHECKPOINT_GLOBALS = {"model.embed_tokens.weight": "model.embed_tokens.weight",
                      "model.norm.weight": Part("model.norm.weight", plus_one)}


def mixer_parts(cfg: ModelConfig, i: int) -> dict[str, Part]:
    """A layer's norms and its attention or linear attention (the MLP is the caller's)."""
    p = f"model.layers.{i}"
    out = {f"{p}.{n}.weight": Part(f"{p}.{n}.weight", plus_one) for n in NORMS}
    if cfg.is_linear_layer(i):
        out.update({f"{p}.linear_attn.{t}": Part(f"{p}.linear_attn.{t}") for t in LINEAR_TENSORS})
    else:
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[f"{p}.self_attn.{proj}.weight"] = Part(f"{p}.self_attn.{proj}.weight")
        for norm in ("q_norm", "k_norm"):
            out[f"{p}.self_attn.{norm}.weight"] = Part(f"{p}.self_attn.{norm}.weight", plus_one)
    return out


def checkpoint_layer(cfg: ModelConfig, i: int) -> dict[str, Part]:
    p = f"model.layers.{i}"
    out = mixer_parts(cfg, i)
    out.update({f"{p}.mlp.{m}.weight": Part(f"{p}.mlp.{m}.weight")
                for m in ("gate_proj", "up_proj", "down_proj")})
    return out


# ----------------------------------------------------------------------------- GGUF


def hybrid_gguf_fields(meta: Any) -> dict[str, Any]:
    """llama.cpp's qwen35 / qwen35moe / qwen3next metadata. ``block_count`` includes the
    multi-token-prediction layers (``nextn_predict_layers``), which are not read; which layers
    are recurrent comes from ``attention.recurrent_layers`` or ``full_attention_interval``."""
    blocks = int(meta.need("block_count")) - int(meta.get("nextn_predict_layers") or 0)
    recurrent = meta.get("attention.recurrent_layers")
    if recurrent is not None:
        types = tuple("linear_attention" if r else "full_attention" for r in recurrent[:blocks])
    else:
        types = interval_layers(blocks, int(meta.get("full_attention_interval") or 4))
    heads = int(meta.need("attention.head_count"))
    head_dim = int(meta.need("attention.key_length"))
    rotary = int(meta.get("rope.dimension_count") or head_dim // 4)
    value_heads = int(meta.need("ssm.time_step_rank"))
    return dict(
        vocab_size=meta.vocab_size(), hidden_size=int(meta.need("embedding_length")),
        num_hidden_layers=blocks, num_attention_heads=heads,
        num_key_value_heads=int(meta.get("attention.head_count_kv") or heads), head_dim=head_dim,
        intermediate_size=int(meta.get("feed_forward_length") or 1),
        max_position_embeddings=int(meta.need("context_length")),
        rms_norm_eps=float(meta.need("attention.layer_norm_rms_epsilon")),
        rope_theta=float(meta.get("rope.freq_base") or 10_000.0),
        partial_rotary_factor=rotary / head_dim,
        tie_word_embeddings="output.weight" not in meta.tensor_names,
        qk_norm=True, attention_output_gate=True, layer_types=types,
        linear_attention=LinearAttentionConfig(
            num_key_heads=int(meta.need("ssm.group_count")), num_value_heads=value_heads,
            key_head_dim=int(meta.need("ssm.state_size")),
            value_head_dim=int(meta.need("ssm.inner_size")) // value_heads,
            conv_kernel=int(meta.need("ssm.conv_kernel"))),
    )


def _untile(t: Any, cfg: ModelConfig, dim: int, per_head: int) -> Any:
    """llama.cpp's qwen35 converter orders value heads tiled ([g0v0, g1v0, ..., g0v1, ...]) so
    that ggml can repeat the key heads; undo it ([g0v0, g0v1, ..., g1v0, ...]), along ``dim``
    (``per_head`` entries a value head)."""
    la = cfg.linear_attention
    assert la is not None
    hk, r = la.num_key_heads, la.num_value_heads // la.num_key_heads
    t = t.movedim(dim, 0)
    rest = t.shape[1:]
    t = t.reshape(r, hk, per_head, *rest).transpose(0, 1).reshape(hk * r * per_head, *rest)
    return t.movedim(0, dim)


def gguf_relayout(tiled: bool) -> Any:
    """GGUF tensors of the linear-attention layers back in the checkpoint's form."""

    def relayout(gname: str, t: Any, cfg: ModelConfig) -> Any:
        la = cfg.linear_attention
        assert la is not None
        suffix = gname.split(".", 2)[-1]
        if suffix == "ssm_a":  # -exp(A_log)
            if not t.is_meta and (t >= 0).any():
                raise CheckpointError(f"{gname}: ssm_a must be negative (-exp(A_log)).")
            t = (-t.float()).log()
        if suffix == "ssm_conv1d.weight":
            t = t.reshape(t.shape[0], 1, t.shape[-1])  # (C, K) -> (C, 1, K)
        if not tiled:
            return t
        if suffix == "attn_qkv.weight" or suffix == "ssm_conv1d.weight":  # only the value rows
            k = 2 * la.key_dim
            out = t.clone()
            out[k:] = _untile(t[k:], cfg, 0, la.value_head_dim)
            return out
        if suffix in ("attn_gate.weight",):
            return _untile(t, cfg, 0, la.value_head_dim)
        if suffix in ("ssm_beta.weight", "ssm_alpha.weight", "ssm_a", "ssm_dt.bias"):
            return _untile(t, cfg, 0, 1)
        if suffix == "ssm_out.weight":  # (D, value_dim): the columns
            return _untile(t, cfg, 1, la.value_head_dim)
        return t

    return relayout


GGUF_HYBRID_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight",
    "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_beta.weight": "linear_attn.in_proj_b.weight",
    "ssm_alpha.weight": "linear_attn.in_proj_a.weight",
    "ssm_conv1d.weight": "linear_attn.conv1d.weight", "ssm_a": "linear_attn.A_log",
    "ssm_dt.bias": "linear_attn.dt_bias", "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight",
}
GGUF_DENSE_MLP = {"ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
                  "ffn_down.weight": "mlp.down_proj.weight"}


def gguf_fields(meta: Any) -> dict[str, Any]:
    return dict(hybrid_gguf_fields(meta), intermediate_size=int(meta.need("feed_forward_length")))


# Norms are stored as 1 + w by the converter, except the gated norm of the linear layers.
GGUF = GGUFNames(arch="qwen35", config_fields=gguf_fields,
                 layer={**GGUF_HYBRID_LAYER, **GGUF_DENSE_MLP}, globals=GGUF_GLOBALS,
                 norm_shift=1.0, norm_shift_skip=("ssm_norm.weight",),
                 relayout=gguf_relayout(tiled=True))


FAMILY = Family(
    architecture=ARCHITECTURE, summary=__doc__, hf_config_class=HF_CONFIG_CLASS,
    config_fields=config_fields, hf_config=hf_config, presets=PRESETS, hf_repos=HF_REPOS,
    checkpoint_globals=CHECKPOINT_GLOBALS, checkpoint_layer=checkpoint_layer,
    checkpoint_skip=CHECKPOINT_SKIP, gguf=GGUF, norm_weight_offset=NORM_WEIGHT_OFFSET,
    aliases=ALIASES, checkpoint_nested=CHECKPOINT_NESTED, vision_config=vision_config)

"""Gemma 4 (text, ``Gemma4ForCausalLM``; ``Gemma4ForConditionalGeneration``'s text model): Gemma
3's layer (four norms, q/k RMSNorm, GeGLU with tanh GELU, embeddings times sqrt(hidden), sliding
and full layers by ``layer_types``, an optional final soft-cap), with these differences:

- norms multiply by w, not (1 + w); values get a weightless RMSNorm per head (``v_norm``);
  the attention's score scale is 1 (the q/k norms do the scaling);
- full layers have their own head size (``global_head_dim``) and, with ``attention_k_eq_v``,
  their own KV head count (``num_global_key_value_heads``) and no v_proj (the key projection,
  before k_norm and RoPE, is the value); their RoPE is "proportional": a base of 1e6 over the
  whole head with only the first ``partial_rotary_factor`` of the frequencies non-zero;
  sliding layers rotate the whole head with base 1e4;
- the last ``num_kv_shared_layers`` layers compute no keys or values: each attends over the
  cache of the last earlier layer of its kind, which owns the buffer (the graphs give them
  none); with ``use_double_wide_mlp`` their MLPs are twice as wide (E2B);
- per-layer embeddings (E2B, E4B): a second token table [vocab, layers x P] and a projection
  of the token embedding give each layer a (P,) input, gated into the layer after its MLP;
- every layer's output is multiplied by a stored ``layer_scalar``;
- 26B-A4B (``enable_moe_block``): beside the dense MLP, 128 GeGLU experts (top 8) read the
  residual stream through their own norm; the router reads RMSNorm(x) times a learned scale
  over sqrt(hidden), renormalises its top-k softmax and scales each weight by a learned
  per-expert factor; each branch has its own post-norm before their sum.

Checkpoints: the text-only class, or the multimodal one with its text fields under
``text_config`` and text weights under ``model.language_model.``; the vision and audio towers
(``model.vision_tower.``, ``model.audio_tower.``, ``model.embed_vision.``,
``model.embed_audio.``) are skipped by name; the vision tower and its embedder are read apart
(gemma_vision.py) unless exported ``--text-only``. GGUF: llama.cpp's ``gemma4`` (the experts
fused as ``ffn_gate_up_exps``, as its converter writes transformers' stacked tensor, or apart as
``ffn_gate_exps`` and ``ffn_up_exps``, which llama.cpp's loader also takes and its converter
writes from per-expert checkpoints). Refused: bidirectional attention ("all"), RoPE other
than default / proportional, a per-layer vocabulary unlike the token vocabulary.
"""

from __future__ import annotations

import math
from typing import Any

from llm_onnx.errors import CheckpointError, ConfigError
from llm_onnx.families.family import Family
from llm_onnx.families.gemma_vision import gemma4_vision_fields
from llm_onnx.families.layouts import GGUFNames, Part
from llm_onnx.modeling.config import (
    AttentionConfig,
    EmbeddingConfig,
    MLPConfig,
    ModelConfig,
    MoEConfig,
    PositionConfig,
    ResidualConfig,
)
from llm_onnx.modeling.gemma_vision_config import Gemma4VisionConfig
from llm_onnx.modeling.shapes import layer_shapes

ARCHITECTURE = "Gemma4ForCausalLM"
HF_CONFIG_CLASS = "Gemma4TextConfig"
ALIASES = ("Gemma4ForConditionalGeneration",)  # the released checkpoints
CHECKPOINT_NESTED = ("model.", "model.language_model.")
CHECKPOINT_SKIP = (r"^model\.(vision_tower|audio_tower|embed_vision|embed_audio)\.")


def pattern_layers(layers: int, pattern: int) -> tuple[str, ...]:
    """Every ``pattern``-th layer full, the others sliding; the last layer always full (as
    transformers forces it)."""
    types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
             for i in range(layers)]
    types[-1] = "full_attention"
    return tuple(types)


def proportional(factor: float = 0.25) -> dict[str, Any]:
    """The full layers' RoPE: partial_rotary_factor of the frequencies over the whole head."""
    return {"rope_type": "proportional", "partial_rotary_factor": factor}


# google/gemma-4-26B-A4B-it's text_config
GEMMA4_26B_A4B = ModelConfig(
    architecture=ARCHITECTURE,
    vocab_size=262_144, hidden_size=2816, num_hidden_layers=30, num_attention_heads=16,
    num_key_value_heads=8, head_dim=256, intermediate_size=2112, max_position_embeddings=262_144,
    rms_norm_eps=1e-6, rope_theta=1_000_000.0, rope_scaling=proportional(),
    hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True, sliding_window=1024,
    layer_types=pattern_layers(30, 6), final_logit_softcapping=30.0,
    attention=AttentionConfig(qk_norm=True, attention_scale=1.0, value_norm=True,
                              global_head_dim=512, num_global_key_value_heads=2,
                              attention_k_eq_v=True),
    mlp=MLPConfig(enable_moe_block=True),
    residual=ResidualConfig(topology="sandwich", layer_scalar=True),
    positions=PositionConfig(rope_local_theta=10_000.0),
    embedding=EmbeddingConfig(embedding_multiplier=math.sqrt(2816)),
    moe=MoEConfig(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=704),
)
# google/gemma-4-31B-it: dense, 60 layers
GEMMA4_31B = GEMMA4_26B_A4B.replace(
    hidden_size=5376, num_hidden_layers=60, num_attention_heads=32, num_key_value_heads=16,
    intermediate_size=21_504, embedding_multiplier=math.sqrt(5376),
    layer_types=pattern_layers(60, 6), num_global_key_value_heads=4, enable_moe_block=False,
    moe=None)
# google/gemma-4-E4B-it: per-layer embeddings, the last 18 layers KV-shared, one KV head count
GEMMA4_E4B = GEMMA4_31B.replace(
    hidden_size=2560, num_hidden_layers=42, num_attention_heads=8, num_key_value_heads=2,
    intermediate_size=10_240, max_position_embeddings=131_072,
    embedding_multiplier=math.sqrt(2560), sliding_window=512, layer_types=pattern_layers(42, 6),
    num_global_key_value_heads=None, attention_k_eq_v=False, num_kv_shared_layers=18,
    hidden_size_per_layer_input=256)
# google/gemma-4-E2B-it: 35 layers (4 sliding, 1 full), the last 20 KV-shared with MLPs twice
# as wide, one KV head
GEMMA4_E2B = GEMMA4_E4B.replace(
    hidden_size=1536, num_hidden_layers=35, num_key_value_heads=1, intermediate_size=6144,
    embedding_multiplier=math.sqrt(1536), layer_types=pattern_layers(35, 5),
    num_kv_shared_layers=20, use_double_wide_mlp=True)
# Four layers (sliding, full, sliding, full), a window of 4 keys (the tests' 9-token prompts
# slide it), head sizes 16 and 32 (RoPE inside GroupQueryAttention: the full layers' tables
# span 32 with half the frequencies zero), keys that are values with one KV head on the full
# layers, the last two layers KV-shared with doubled MLPs, per-layer embeddings of 8 and four
# experts (top 2) beside the MLP: every switch at once. Variants with each off:
# tests/export/test_config_fuzz.py (test_gemma4_switches, and the fuzz's draws).
GEMMA4_TINY = GEMMA4_26B_A4B.replace(
    vocab_size=256, hidden_size=48, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, intermediate_size=64, max_position_embeddings=256,
    embedding_multiplier=math.sqrt(48), sliding_window=4, layer_types=pattern_layers(4, 2),
    rope_scaling=proportional(0.5), final_logit_softcapping=3.0, global_head_dim=32,
    num_global_key_value_heads=1, num_kv_shared_layers=2, use_double_wide_mlp=True,
    hidden_size_per_layer_input=8,
    moe=MoEConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32))
PRESETS = {"gemma4_e2b": GEMMA4_E2B, "gemma4_e4b": GEMMA4_E4B,
           "gemma4_26b_a4b": GEMMA4_26B_A4B, "gemma4_31b": GEMMA4_31B,
           "gemma4_tiny": GEMMA4_TINY}
HF_REPOS = {"gemma4_e2b": "google/gemma-4-E2B-it", "gemma4_e4b": "google/gemma-4-E4B-it",
            "gemma4_26b_a4b": "google/gemma-4-26B-A4B-it", "gemma4_31b": "google/gemma-4-31B-it"}


def _rope(hf: Any) -> tuple[float, float, dict[str, Any] | None]:
    """(full layers' base, sliding layers' base, full layers' scaling) from rope_parameters."""
    params = hf.get("rope_parameters") or {}
    full = params.get("full_attention") or {"rope_type": "proportional",
                                            "partial_rotary_factor": 0.25,
                                            "rope_theta": 1_000_000.0}
    sliding = params.get("sliding_attention") or {"rope_type": "default", "rope_theta": 10_000.0}
    if sliding.get("rope_type", "default") != "default":
        raise ConfigError(f"{hf.source}: sliding layers' rope_type "
                          f"{sliding.get('rope_type')!r} is not supported for {ARCHITECTURE}; "
                          "supported: default.")
    kind = full.get("rope_type", "default")
    if kind not in ("default", "proportional"):
        raise ConfigError(f"{hf.source}: full layers' rope_type {kind!r} is not supported for "
                          f"{ARCHITECTURE}; supported: default, proportional.")
    scaling = None
    factor, share = float(full.get("factor", 1.0)), float(full.get("partial_rotary_factor", 1.0))
    if kind == "proportional" and (factor != 1.0 or share != 1.0):
        scaling = dict(proportional(share), **({"factor": factor} if factor != 1.0 else {}))
    return (float(full.get("rope_theta", 1_000_000.0)),
            float(sliding.get("rope_theta", 10_000.0)), scaling)


def _global_shape(hf: Any, types: tuple[str, ...]) -> tuple[int, int | None]:
    """The full layers' head size and KV heads (None: the sliding layers'). transformers' own
    ``per_layer_config`` (5.23 and later write it instead of ``global_head_dim``) is the whole
    truth when present: a full layer it leaves out, or a field it leaves out, takes the model's
    (so ``{}`` means one head size for all). Else the vendors' ``global_head_dim`` (absent:
    transformers' default, 512; null: the model's ``head_dim``) and
    ``num_global_key_value_heads`` (read only with attention_k_eq_v, as transformers does)."""
    overrides = hf.layer_overrides()
    if "per_layer_config" in hf.data:
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        stray = sorted(i for i, o in overrides.items() if i not in full and o)
        if stray:
            raise ConfigError(f"{hf.source}: per_layer_config overrides sliding layer(s) "
                              f"{stray}; {ARCHITECTURE}'s sliding layers share one shape.")
        base = hf.get("head_dim", 256)
        shapes = {(int(overrides.get(i, {}).get("head_dim") or base),
                   overrides.get(i, {}).get("num_key_value_heads")) for i in full}
        if len(shapes) != 1:
            raise ConfigError(f"{hf.source}: per_layer_config must give the full-attention "
                              "layers one head size and KV head count.")
        head_dim, heads = shapes.pop()
        return head_dim, int(heads) if heads is not None else None
    heads = hf.get("num_global_key_value_heads") if hf.get("attention_k_eq_v", False) else None
    if "global_head_dim" in hf.data and hf.data["global_head_dim"] is None:
        return int(hf.get("head_dim", 256)), int(heads) if heads is not None else None
    return int(hf.get("global_head_dim", 512)), int(heads) if heads is not None else None


def config_fields(hf: Any) -> dict[str, Any]:
    hf = hf.text()
    if hf.get("use_bidirectional_attention") == "all":
        raise ConfigError(f"{hf.source}: use_bidirectional_attention=\"all\" is not supported "
                          f"for {ARCHITECTURE} (a causal LM attends causally).")
    hidden, layers = hf.require("hidden_size"), hf.require("num_hidden_layers")
    heads = hf.require("num_attention_heads")
    types = hf.get("layer_types")
    types = tuple(types) if types else pattern_layers(layers, 6)
    if types[-1] != "full_attention":  # transformers forces it (with a warning)
        types = (*types[:-1], "full_attention")
    theta, local_theta, scaling = _rope(hf)
    global_head_dim, global_kv = _global_shape(hf, types)
    kv = hf.get("num_key_value_heads") or heads
    vocab = hf.require("vocab_size")
    # absent: transformers' default (256); null or 0: none
    per_layer = hf.data.get("hidden_size_per_layer_input", 256) or 0
    if per_layer and hf.get("vocab_size_per_layer_input", 262_144) != vocab:
        raise ConfigError(f"{hf.source}: vocab_size_per_layer_input "
                          f"{hf.get('vocab_size_per_layer_input', 262_144)} differs from "
                          f"vocab_size {vocab}; not supported for {ARCHITECTURE}.")
    moe = None
    if hf.get("enable_moe_block", False):
        moe = MoEConfig(num_experts=hf.require("num_experts"),
                        num_experts_per_tok=hf.require("top_k_experts"),
                        moe_intermediate_size=hf.require("moe_intermediate_size"))
    bias = bool(hf.get("attention_bias", False))
    head_dim = hf.get("head_dim") or hidden // heads
    return dict(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
        intermediate_size=hf.require("intermediate_size"),
        max_position_embeddings=hf.get("max_position_embeddings", 131_072),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=theta, rope_local_theta=local_theta, rope_scaling=scaling,
        hidden_act=hf.get("hidden_activation", "gelu_pytorch_tanh"), qk_norm=True,
        attention_bias=bias, o_proj_bias=bias,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
        embedding_multiplier=math.sqrt(hidden), attention_scale=1.0, topology="sandwich",
        sliding_window=hf.get("sliding_window", 512), layer_types=types,
        final_logit_softcapping=hf.get("final_logit_softcapping"),
        global_head_dim=global_head_dim if global_head_dim != head_dim else None,
        num_global_key_value_heads=global_kv if global_kv not in (None, kv) else None,
        attention_k_eq_v=bool(hf.get("attention_k_eq_v", False)), value_norm=True,
        num_kv_shared_layers=int(hf.get("num_kv_shared_layers", 0)),
        hidden_size_per_layer_input=int(per_layer), layer_scalar=True,
        enable_moe_block=moe is not None, moe=moe,
        use_double_wide_mlp=bool(hf.get("use_double_wide_mlp", False)),
    )


def vision_config(hf: Any) -> Gemma4VisionConfig | None:
    """The vision tower and embedder of a ``Gemma4ForConditionalGeneration`` (the audio tower
    is not read)."""
    return gemma4_vision_fields(hf, hf.text())


def hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """Gemma4TextConfig's fields for ``cfg`` (transformers takes global_head_dim and
    num_global_key_value_heads as arguments and writes per_layer_config)."""
    scaling = cfg.rope_scaling or {"rope_type": "proportional", "partial_rotary_factor": 1.0}
    moe, att = cfg.moe, cfg.attention
    out = dict(
        architectures=[ARCHITECTURE], vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        hidden_activation=cfg.hidden_act, max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=cfg.tie_word_embeddings,
        attention_bias=att.attention_bias, sliding_window=cfg.sliding_window,
        layer_types=list(cfg.layer_types or ()),
        final_logit_softcapping=cfg.final_logit_softcapping,
        rope_parameters={
            "sliding_attention": {"rope_type": "default",
                                  "rope_theta": cfg.positions.rope_local_theta},
            "full_attention": dict(scaling, rope_theta=cfg.rope_theta)},
        global_head_dim=att.global_head_dim or cfg.head_dim,
        attention_k_eq_v=att.attention_k_eq_v,
        num_kv_shared_layers=att.num_kv_shared_layers,
        hidden_size_per_layer_input=cfg.embedding.hidden_size_per_layer_input,
        vocab_size_per_layer_input=cfg.vocab_size,
        use_double_wide_mlp=cfg.mlp.use_double_wide_mlp,
        enable_moe_block=cfg.mlp.enable_moe_block,
        num_experts=moe.num_experts if moe else None,
        top_k_experts=moe.num_experts_per_tok if moe else None,
        moe_intermediate_size=moe.moe_intermediate_size if moe else None,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if att.num_global_key_value_heads is not None:
        out["num_global_key_value_heads"] = att.num_global_key_value_heads
    return out


# Canonical names are transformers' own; a table is declared only so that the multimodal
# checkpoints' nesting (CHECKPOINT_NESTED) and skipped towers apply.
CHECKPOINT_GLOBALS = {name: name for name in ("model.embed_tokens.weight", "model.norm.weight",
                                              "model.embed_tokens_per_layer.weight",
                                              "model.per_layer_model_projection.weight",
                                              "model.per_layer_projection_norm.weight")}


def checkpoint_layer(cfg: ModelConfig, i: int) -> dict[str, Part]:
    return {name: Part(name) for name in layer_shapes(cfg, i)}



# ----------------------------------------------------------------------------- GGUF


def _per_layer(value: Any, layers: int) -> list[int]:
    """A GGUF key that is a number or one number per layer, as a list."""
    return [int(v) for v in value] if isinstance(value, list) else [int(value)] * layers


def gemma4_gguf_fields(meta: Any) -> dict[str, Any]:
    """ModelConfig fields from llama.cpp's gemma4 metadata: the sliding pattern (one flag per
    layer), the full layers' head size (``attention.key_length``) and the sliding ones'
    (``key_length_swa``), KV heads per layer (a number or one per layer), the shared layers, the
    per-layer embeddings' width, the MLP width per layer (E2B's doubled shared layers), the
    experts; the full layers' proportional RoPE share from ``rope_freqs`` (1 for the rotating
    pairs, 1e30 for the others); keys that are values where full layers have no attn_v."""
    hidden, heads = int(meta.need("embedding_length")), int(meta.need("attention.head_count"))
    layers = int(meta.need("block_count"))
    swa = meta.need("attention.sliding_window_pattern")
    if not isinstance(swa, list) or len(swa) != layers:
        raise CheckpointError(f"{meta.path}: gemma4.attention.sliding_window_pattern must give "
                              f"one flag for each of the {layers} layers.")
    types = tuple("sliding_attention" if f else "full_attention" for f in swa)
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    head_full = int(meta.need("attention.key_length"))
    head_swa = int(meta.get("attention.key_length_swa") or head_full)
    kv = _per_layer(meta.get("attention.head_count_kv") or heads, layers)
    kv_swa = kv[sliding[0]] if sliding else kv[full[0]]
    kv_full = kv[full[0]]
    ff = _per_layer(meta.need("feed_forward_length"), layers)
    shared = int(meta.get("attention.shared_kv_layers") or 0)
    k_eq_v = bool(full) and f"blk.{full[0]}.attn_v.weight" not in meta.tensor_names \
        and f"blk.{full[0]}.attn_k.weight" in meta.tensor_names
    freqs = meta.floats("rope_freqs.weight")
    share = (sum(1 for f in freqs if f < 1e10) / len(freqs)) if freqs else 0.25
    experts = meta.get("expert_count")
    moe = None
    if experts:
        moe = MoEConfig(num_experts=int(experts), num_experts_per_tok=int(meta.need(
            "expert_used_count")), moe_intermediate_size=int(meta.need(
                "expert_feed_forward_length")))
    softcap = meta.get("final_logit_softcapping")
    return dict(
        vocab_size=meta.vocab_size(), hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_swa, head_dim=head_swa,
        intermediate_size=ff[0], max_position_embeddings=int(meta.need("context_length")),
        rms_norm_eps=float(meta.need("attention.layer_norm_rms_epsilon")),
        rope_theta=float(meta.get("rope.freq_base") or 1_000_000.0),
        rope_local_theta=float(meta.get("rope.freq_base_swa") or 10_000.0),
        rope_scaling=proportional(share) if share != 1.0 else None,
        hidden_act="gelu_pytorch_tanh", qk_norm=True,
        tie_word_embeddings="output.weight" not in meta.tensor_names,
        embedding_multiplier=math.sqrt(hidden), attention_scale=1.0, topology="sandwich",
        sliding_window=int(meta.need("attention.sliding_window")), layer_types=types,
        final_logit_softcapping=float(softcap) if softcap else None,
        global_head_dim=head_full if head_full != head_swa else None,
        num_global_key_value_heads=kv_full if kv_full != kv_swa else None,
        attention_k_eq_v=k_eq_v, value_norm=True, num_kv_shared_layers=shared,
        hidden_size_per_layer_input=int(meta.get("embedding_length_per_layer_input") or 0),
        layer_scalar=True, enable_moe_block=moe is not None, moe=moe,
        use_double_wide_mlp=len(set(ff)) > 1)


GGUF = GGUFNames(
    arch="gemma4", config_fields=gemma4_gguf_fields,
    globals={"token_embd.weight": "model.embed_tokens.weight",
             "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight",
             "per_layer_token_embd.weight": "model.embed_tokens_per_layer.weight",
             "per_layer_model_proj.weight": "model.per_layer_model_projection.weight",
             "per_layer_proj_norm.weight": "model.per_layer_projection_norm.weight"},
    layer={"attn_norm.weight": "input_layernorm.weight",
           "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
           "attn_v.weight": "self_attn.v_proj.weight",
           "attn_output.weight": "self_attn.o_proj.weight",
           "attn_q_norm.weight": "self_attn.q_norm.weight",
           "attn_k_norm.weight": "self_attn.k_norm.weight",
           "post_attention_norm.weight": "post_attention_layernorm.weight",
           "ffn_norm.weight": "pre_feedforward_layernorm.weight",
           "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
           "ffn_down.weight": "mlp.down_proj.weight",
           "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
           "ffn_gate_inp.weight": "router.proj.weight", "ffn_gate_inp.scale": "router.scale",
           "ffn_down_exps.scale": "router.per_expert_scale",
           # the experts as transformers stacks them: (E, 2I, D) rows [gate | up], (E, D, I)
           "ffn_gate_up_exps.weight": "experts.gate_up_proj",
           "ffn_down_exps.weight": "experts.down_proj",
           "pre_ffw_norm_2.weight": "pre_feedforward_layernorm_2.weight",
           "post_ffw_norm_1.weight": "post_feedforward_layernorm_1.weight",
           "post_ffw_norm_2.weight": "post_feedforward_layernorm_2.weight",
           "layer_output_scale.weight": "layer_scalar",
           "inp_gate.weight": "per_layer_input_gate.weight",
           "proj.weight": "per_layer_projection.weight",
           "post_norm.weight": "post_per_layer_input_norm.weight"},
    # the experts' gate and up apart, (E, I, D) each, as llama.cpp also reads them
    joined={"experts.gate_up_proj": (("ffn_gate_exps.weight", "ffn_up_exps.weight"), 1)})


FAMILY = Family(
    architecture=ARCHITECTURE, summary=__doc__, hf_config_class=HF_CONFIG_CLASS,
    config_fields=config_fields, hf_config=hf_config, presets=PRESETS, hf_repos=HF_REPOS,
    checkpoint_globals=CHECKPOINT_GLOBALS, checkpoint_layer=checkpoint_layer,
    checkpoint_skip=CHECKPOINT_SKIP, gguf=GGUF, aliases=ALIASES,
    checkpoint_nested=CHECKPOINT_NESTED, vision_config=vision_config,
    per_layer_fields=("head_dim", "num_key_value_heads"))

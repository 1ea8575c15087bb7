"""A GGUF of a Qwen3-MoE, Qwen3.5/3.6-MoE, gpt-oss, Gemma 4 or SmolLM3 config with random weights,
for llama.cpp's speed on the same shape.

Every matrix (embedding, attention, the linear attention's projections, experts, shared expert,
dense MLP, LM head) is written in one quantized type, Q4_0 or Q8_0 ("pure", as `llama-quantize
--pure` makes it; llama-quantize's default mix would give the LM head Q6_K). What llama.cpp's
converter and llama-quantize keep in float32 stays F32: vectors (norms, the linear attention's
ssm_a and ssm_dt), the routers (ffn_gate_inp, and the shared expert's (1, D) gate) and the
depthwise conv (ssm_conv1d). Quantized blocks are random: codes uniform, block scales uniform in
0.004-0.008 (about what N(0, 0.02) weights quantize to). The float tensors have sane values: norms
1 (the converter stores the (1 + w) norms as 1 + w), routers N(0, 0.02), ssm_a = -exp(N(0, 0.5))
(negative, as -exp(A_log) is), ssm_dt 1, the conv N(0, 0.2); so nothing is NaN and the file has the
real one's size. Tensors are streamed one at a time (the largest, Q8_0's embedding of Qwen3.6, is
540 MB). Tensor names and metadata keys are gguf-py's own tables.

Architectures, by the config's:
  Qwen3MoeForCausalLM     llama.cpp's ``qwen3moe`` (Qwen3-30B-A3B)
  Qwen3_5MoeForCausalLM   ``qwen35moe`` (Qwen3.5/3.6-35B-A3B): Gated DeltaNet layers (attn_qkv,
                          attn_gate, ssm_beta, ssm_alpha, ssm_conv1d (C, K), ssm_dt.bias, ssm_a,
                          ssm_norm, ssm_out) and gated full-attention layers (attn_q of 2 x heads
                          x head_dim: query and gate), q/k norms, a post-attention norm, a shared
                          expert with its (1, D) gate; metadata ssm.* (conv_kernel, state_size =
                          d_k, group_count = key heads, time_step_rank = value heads, inner_size =
                          value heads x d_v), full_attention_interval, attention.recurrent_layers,
                          rope.dimension_count (the rotary width), rope.dimension_sections (the
                          multimodal RoPE sections [11, 11, 10] padded to 4, which llama.cpp
                          requires), expert_shared_feed_forward_length. No multi-token-prediction
                          block (llama.cpp does not load it by default; neither does llm-onnx).
                          llama.cpp takes d_v = d_k (ssm.state_size); the file records d_v
                          through inner_size, so configs with d_v != d_k (the tiny preset) are
                          readable by llm-onnx but not by llama.cpp.

  GptOssForCausalLM       ``gpt-oss`` (gpt-oss-20b, -120b): the experts in MXFP4 as llama.cpp's
                          converter writes OpenAI's files (gate and up split, GGML's 17-byte
                          blocks: an e8m0 scale, then 16 bytes of e2m1 codes, random; scales
                          119-120, about what N(0, 0.02) weights take), whatever ``qtype`` says;
                          ``qtype`` is the other matrices' (attention, embedding, LM head). Biases
                          (q/k/v/o, router, experts) and the sinks float32; metadata
                          attention.sliding_window and YaRN (rope.scaling.*).

  Gemma4ForCausalLM       ``gemma4`` (Gemma 4 26B-A4B; a config without per-layer embeddings or
                          shared layers): per layer its own head size and KV heads (the full
                          layers' keys are their values: no attn_v), q/k norms, the four Gemma
                          norms and the experts' three, the dense MLP beside the experts (fused
                          ffn_gate_up_exps, as llama.cpp's converter writes transformers' stacked
                          tensor), the router's scale (ffn_gate_inp.scale) and the per-expert
                          scale (ffn_down_exps.scale) 1, layer_output_scale 1, rope_freqs (1 for
                          the full layers' rotating pairs, 1e30 for the others); metadata: the
                          sliding flags per layer, both head sizes, KV heads per layer, both RoPE
                          bases, the window, the soft cap. Tied embeddings: no output tensor.

  SmolLM3ForCausalLM      ``smollm3`` (SmolLM3-3B): dense, Llama's layer (attn_norm, attn_q/k/v/
                          output, ffn_norm, ffn_gate/up/down) and Llama's keys, as the converter
                          writes it (its LlamaModel: rope.dimension_count = head_dim, vocab_size).
                          Tied embeddings: no output.weight (llama.cpp reuses token_embd). No key
                          says which layers are NoPE: llama.cpp makes every fourth one so
                          (n_no_rope_layer_step = 4, fixed), so a config with another pattern
                          (the tiny preset's interval 2) or a sliding window is refused.

Without tied embeddings (every preset but SmolLM3's and Gemma 4's) the LM head is output.weight.

The vocabulary is a SentencePiece-style ("llama") list of as many tokens: <unk>, <s>, </s>, the
256 byte tokens, then "▁t<i>"; prompts are sent as token ids, so no text is tokenized.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from llm_onnx.families.smollm3 import nope_every
from llm_onnx.modeling.config import ModelConfig

BLOCK = 32  # Q4_0 and Q8_0: 32 weights a block, one float16 scale
QUANT_TYPES = {"Q4_0": gguf.GGMLQuantizationType.Q4_0, "Q8_0": gguf.GGMLQuantizationType.Q8_0}
ARCHS = {"Qwen3MoeForCausalLM": gguf.MODEL_ARCH.QWEN3MOE,
         "Qwen3_5MoeForCausalLM": gguf.MODEL_ARCH.QWEN35MOE,
         "GptOssForCausalLM": gguf.MODEL_ARCH.GPT_OSS,
         "Gemma4ForCausalLM": gguf.MODEL_ARCH.GEMMA4,
         "SmolLM3ForCausalLM": gguf.MODEL_ARCH.SMOLLM3}
MROPE_SECTIONS = [11, 11, 10, 0]  # Qwen3.5's mrope_section, padded to 4 as the converter writes it

# How a tensor is filled: "q" quantized (random blocks); the rest float32.
QUANTIZED, NORM, ROUTER, SSM_A, SSM_DT, CONV = "q", "norm", "router", "ssm_a", "ssm_dt", "conv"
ROPE_FREQS = "rope_freqs"  # Gemma 4: 1 for the full layers' rotating pairs, 1e30 for the others
MXFP4, BIAS = "mxfp4", "bias"  # gpt-oss: its experts' type whatever qtype is; its biases


def gguf_arch(cfg: ModelConfig) -> gguf.MODEL_ARCH:
    """llama.cpp's architecture of ``cfg``; ValueError for one this module does not write or a
    config llama.cpp's architecture cannot express."""
    if cfg.architecture not in ARCHS:
        raise ValueError(f"no random GGUF for {cfg.architecture}; known: {', '.join(ARCHS)}")
    arch = ARCHS[cfg.architecture]
    if arch == gguf.MODEL_ARCH.SMOLLM3:
        every_fourth = nope_every(cfg.num_hidden_layers, 4)
        if cfg.positions.no_rope_layers != every_fourth or cfg.sliding_window is not None:
            raise ValueError(
                f"llama.cpp's smollm3 takes every fourth layer as NoPE (no_rope_layers "
                f"{list(every_fourth)} for {cfg.num_hidden_layers} layers) and slides no window; "
                f"a GGUF cannot record this config's no_rope_layers "
                f"{list(cfg.positions.no_rope_layers or ())} and sliding_window "
                f"{cfg.sliding_window}.")
    return arch


def tensor_shapes(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...], str]]:
    """(GGUF name, shape as numpy holds it (rows last = the input dimension), fill) in llama.cpp's
    order; fill is QUANTIZED or how the float32 tensor is filled."""
    arch = gguf_arch(cfg)
    d, hd, v = cfg.hidden_size, cfg.head_dim, cfg.vocab_size
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    T = gguf.MODEL_TENSOR

    def name(t, bid=None, suffix=".weight") -> str:
        assert t in gguf.MODEL_TENSORS[arch], t
        return gguf.TENSOR_NAMES[t].format(bid=bid) + suffix

    out = [(name(T.TOKEN_EMBD), (v, d), QUANTIZED)]
    if arch == gguf.MODEL_ARCH.GEMMA4:
        full = cfg.attention.global_head_dim or cfg.head_dim
        if any(cfg.layer_window(i) is None for i in range(cfg.num_hidden_layers)):
            # read by full layers only: llama.cpp refuses a file with a tensor it does not read
            out = [(name(T.ROPE_FREQS), (full // 2,), ROPE_FREQS)] + out
        out += [t for b in range(cfg.num_hidden_layers) for t in _gemma4_layer(cfg, b, name)]
        out.append((name(T.OUTPUT_NORM), (d,), NORM))
        if not cfg.tie_word_embeddings:
            out.append((name(T.OUTPUT), (v, d), QUANTIZED))
        return out
    for b in range(cfg.num_hidden_layers):
        if arch == gguf.MODEL_ARCH.GPT_OSS:
            out += _gpt_oss_layer(cfg, b, name)
            continue
        if cfg.moe is None:  # SmolLM3: Llama's dense layer
            i = cfg.intermediate_size
            layer = [(T.ATTN_NORM, (d,), NORM), (T.ATTN_Q, (q, d), QUANTIZED),
                     (T.ATTN_K, (kv, d), QUANTIZED), (T.ATTN_V, (kv, d), QUANTIZED),
                     (T.ATTN_OUT, (d, q), QUANTIZED), (T.FFN_NORM, (d,), NORM),
                     (T.FFN_GATE, (i, d), QUANTIZED), (T.FFN_UP, (i, d), QUANTIZED),
                     (T.FFN_DOWN, (d, i), QUANTIZED)]
        elif arch == gguf.MODEL_ARCH.QWEN3MOE:
            layer = [(T.ATTN_NORM, (d,), NORM), (T.ATTN_Q, (q, d), QUANTIZED),
                     (T.ATTN_K, (kv, d), QUANTIZED), (T.ATTN_V, (kv, d), QUANTIZED),
                     (T.ATTN_OUT, (d, q), QUANTIZED), (T.ATTN_Q_NORM, (hd,), NORM),
                     (T.ATTN_K_NORM, (hd,), NORM), (T.FFN_NORM, (d,), NORM), *_experts(cfg)]
        else:
            layer = [(T.ATTN_NORM, (d,), NORM), (T.ATTN_POST_NORM, (d,), NORM)]
            layer += _linear_attention(cfg) if cfg.is_linear_layer(b) else [
                (T.ATTN_Q, (2 * q, d), QUANTIZED),  # each head's query, then its output gate
                (T.ATTN_K, (kv, d), QUANTIZED), (T.ATTN_V, (kv, d), QUANTIZED),
                (T.ATTN_OUT, (d, q), QUANTIZED), (T.ATTN_Q_NORM, (hd,), NORM),
                (T.ATTN_K_NORM, (hd,), NORM)]
            s = cfg.moe.shared_expert_intermediate_size
            layer += _experts(cfg) + [(T.FFN_GATE_INP_SHEXP, (1, d), ROUTER),
                                      (T.FFN_GATE_SHEXP, (s, d), QUANTIZED),
                                      (T.FFN_UP_SHEXP, (s, d), QUANTIZED),
                                      (T.FFN_DOWN_SHEXP, (d, s), QUANTIZED)]
        for t, shape, fill in layer:
            suffix = "" if t == T.SSM_A else ".bias" if t == T.SSM_DT else ".weight"
            out.append((name(t, b, suffix), shape, fill))
    out.append((name(T.OUTPUT_NORM), (d,), NORM))
    if not cfg.tie_word_embeddings:  # tied: llama.cpp's LM head is token_embd
        out.append((name(T.OUTPUT), (v, d), QUANTIZED))
    return out


def _experts(cfg: ModelConfig) -> list[tuple[gguf.MODEL_TENSOR, tuple[int, ...], str]]:
    """A Qwen3-MoE / Qwen3.5-MoE layer's router and experts (E, rows, cols)."""
    assert cfg.moe is not None
    d, e, i = cfg.hidden_size, cfg.moe.num_experts, cfg.moe.moe_intermediate_size
    T = gguf.MODEL_TENSOR
    return [(T.FFN_GATE_INP, (e, d), ROUTER), (T.FFN_GATE_EXP, (e, i, d), QUANTIZED),
            (T.FFN_UP_EXP, (e, i, d), QUANTIZED), (T.FFN_DOWN_EXP, (e, d, i), QUANTIZED)]


def _gpt_oss_layer(cfg: ModelConfig, b: int, name) -> list[tuple[str, tuple[int, ...], str]]:
    """A gpt-oss layer as llama.cpp's converter writes it (its names: post_attention_norm,
    attn_sinks, biases beside the weights, the experts split into gate and up)."""
    assert cfg.moe is not None
    d, hd, h = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads
    q, kv = h * hd, cfg.num_key_value_heads * hd
    e, i = cfg.moe.num_experts, cfg.moe.moe_intermediate_size
    T = gguf.MODEL_TENSOR
    out = [(name(T.ATTN_NORM, b), (d,), NORM), (name(T.ATTN_POST_NORM, b), (d,), NORM)]
    for t, rows, cols in ((T.ATTN_Q, q, d), (T.ATTN_K, kv, d), (T.ATTN_V, kv, d),
                          (T.ATTN_OUT, d, q)):
        out += [(name(t, b), (rows, cols), QUANTIZED), (name(t, b, ".bias"), (rows,), BIAS)]
    out += [(name(T.ATTN_SINKS, b), (h,), ROUTER), (name(T.FFN_GATE_INP, b), (e, d), ROUTER),
            (name(T.FFN_GATE_INP, b, ".bias"), (e,), BIAS)]
    for t, rows, cols in ((T.FFN_GATE_EXP, i, d), (T.FFN_UP_EXP, i, d), (T.FFN_DOWN_EXP, d, i)):
        out += [(name(t, b), (e, rows, cols), MXFP4), (name(t, b, ".bias"), (e, rows), BIAS)]
    return out


def _gemma4_layer(cfg: ModelConfig, b: int, name) -> list[tuple[str, tuple[int, ...], str]]:
    """A Gemma 4 layer as llama.cpp's converter writes it (llama_model_gemma4's tensors)."""
    moe = cfg.moe
    assert moe is not None
    d, hd, kv = cfg.hidden_size, cfg.layer_head_dim(b), cfg.layer_kv_heads(b)
    q, e, i = cfg.num_attention_heads * hd, moe.num_experts, moe.moe_intermediate_size
    ff = cfg.layer_intermediate(b)
    T = gguf.MODEL_TENSOR
    out = [(name(T.ATTN_NORM, b), (d,), NORM), (name(T.ATTN_Q, b), (q, d), QUANTIZED),
           (name(T.ATTN_K, b), (kv * hd, d), QUANTIZED)]
    if not cfg.layer_k_eq_v(b):
        out.append((name(T.ATTN_V, b), (kv * hd, d), QUANTIZED))
    out += [(name(T.ATTN_OUT, b), (d, q), QUANTIZED), (name(T.ATTN_Q_NORM, b), (hd,), NORM),
            (name(T.ATTN_K_NORM, b), (hd,), NORM), (name(T.ATTN_POST_NORM, b), (d,), NORM),
            (name(T.LAYER_OUT_SCALE, b), (1,), NORM), (name(T.FFN_PRE_NORM, b), (d,), NORM),
            (name(T.FFN_GATE, b), (ff, d), QUANTIZED), (name(T.FFN_UP, b), (ff, d), QUANTIZED),
            (name(T.FFN_DOWN, b), (d, ff), QUANTIZED), (name(T.FFN_POST_NORM, b), (d,), NORM),
            (name(T.FFN_GATE_INP, b), (e, d), ROUTER),
            (name(T.FFN_GATE_INP, b, ".scale"), (d,), NORM),
            (name(T.FFN_PRE_NORM_2, b), (d,), NORM), (name(T.FFN_POST_NORM_1, b), (d,), NORM),
            (name(T.FFN_POST_NORM_2, b), (d,), NORM),
            (name(T.FFN_GATE_UP_EXP, b), (e, 2 * i, d), QUANTIZED),
            (name(T.FFN_DOWN_EXP, b), (e, d, i), QUANTIZED),
            (name(T.FFN_DOWN_EXP, b, ".scale"), (e,), NORM)]
    return out


def _add_gemma4_metadata(writer: gguf.GGUFWriter, cfg: ModelConfig) -> None:
    """What llama.cpp's Gemma4Model converter writes beyond the common keys."""
    n = cfg.num_hidden_layers
    assert cfg.layer_types is not None and cfg.sliding_window is not None
    full = cfg.attention.global_head_dim or cfg.head_dim
    writer.add_sliding_window(cfg.sliding_window)
    writer.add_sliding_window_pattern([t == "sliding_attention" for t in cfg.layer_types])
    writer.add_shared_kv_layers(cfg.attention.num_kv_shared_layers)
    writer.add_embedding_length_per_layer_input(cfg.embedding.hidden_size_per_layer_input)
    writer.add_head_count_kv([cfg.layer_kv_heads(b) for b in range(n)])
    writer.add_key_length(full)
    writer.add_value_length(full)
    writer.add_key_length_swa(cfg.head_dim)
    writer.add_value_length_swa(cfg.head_dim)
    writer.add_rope_dimension_count(full)
    writer.add_rope_dimension_count_swa(cfg.head_dim)
    writer.add_rope_freq_base_swa(cfg.positions.rope_local_theta or 10_000.0)
    if cfg.final_logit_softcapping:
        writer.add_final_logit_softcapping(cfg.final_logit_softcapping)


def _rope_freqs(cfg: ModelConfig, pairs: int) -> np.ndarray:
    """Gemma 4's rope_freqs: 1 for the full layers' rotating pairs, 1e30 (no rotation) after."""
    share = (cfg.rope_scaling or {}).get("partial_rotary_factor", 1.0)
    rotating = int((cfg.attention.global_head_dim or cfg.head_dim) * share / 2)
    return np.array([1.0] * rotating + [1e30] * (pairs - rotating), np.float32)


def _random_mxfp4(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random GGML MXFP4 blocks (a scale byte, then 16 bytes of codes) of a tensor, as bytes."""
    *lead, cols = shape
    blocks = int(np.prod(lead, dtype=np.int64)) * (cols // BLOCK)
    out = rng.integers(0, 256, (blocks, 17), dtype=np.uint8)
    out[:, 0] = rng.integers(119, 121, blocks, dtype=np.uint8)
    return out.reshape(*lead, cols // BLOCK * 17)


def _add_gpt_oss_metadata(writer: gguf.GGUFWriter, cfg: ModelConfig) -> None:
    """What llama.cpp's converter writes for gpt-oss beyond the MoE keys."""
    assert cfg.sliding_window is not None and cfg.rope_scaling is not None
    writer.add_sliding_window(cfg.sliding_window)
    scaling = cfg.rope_scaling
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(scaling["factor"])
    writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
    writer.add_rope_scaling_yarn_beta_fast(scaling["beta_fast"])
    writer.add_rope_scaling_yarn_beta_slow(scaling["beta_slow"])


def _linear_attention(cfg: ModelConfig) -> list[tuple[gguf.MODEL_TENSOR, tuple[int, ...], str]]:
    """A Gated DeltaNet layer's tensors (value heads in the converter's tiled order: with random
    weights the order is immaterial)."""
    la = cfg.linear_attention
    assert la is not None
    d, hv = cfg.hidden_size, la.num_value_heads
    T = gguf.MODEL_TENSOR
    return [(T.ATTN_QKV, (la.conv_dim, d), QUANTIZED), (T.ATTN_GATE, (la.value_dim, d), QUANTIZED),
            (T.SSM_BETA, (hv, d), QUANTIZED), (T.SSM_ALPHA, (hv, d), QUANTIZED),
            (T.SSM_CONV1D, (la.conv_dim, la.conv_kernel), CONV), (T.SSM_DT, (hv,), SSM_DT),
            (T.SSM_A, (hv,), SSM_A), (T.SSM_NORM, (la.value_head_dim,), NORM),
            (T.SSM_OUT, (d, la.value_dim), QUANTIZED)]


def stored_quantized(shape: tuple[int, ...], fill: str) -> bool:
    """Quantized tensors whose rows are not whole blocks (only tiny test shapes have them) stay
    float32, as llama-quantize falls back to a float type for them."""
    return fill == QUANTIZED and shape[-1] % BLOCK == 0


def _random_blocks(shape: tuple[int, ...], qtype: str, rng: np.random.Generator) -> np.ndarray:
    """Random Q4_0 / Q8_0 blocks of a tensor, as bytes (..., cols / 32 * block bytes)."""
    *lead, cols = shape
    blocks = int(np.prod(lead, dtype=np.int64)) * (cols // BLOCK)
    code_bytes = BLOCK // 2 if qtype == "Q4_0" else BLOCK
    out = np.empty((blocks, 2 + code_bytes), np.uint8)
    out[:, :2] = rng.uniform(0.004, 0.008, blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = rng.integers(0, 256, (blocks, code_bytes), dtype=np.uint8)
    return out.reshape(*lead, cols // BLOCK * (2 + code_bytes))


def _random_float(shape: tuple[int, ...], fill: str, rng: np.random.Generator) -> np.ndarray:
    if fill == BIAS:
        return np.zeros(shape, np.float32)
    if fill in (NORM, SSM_DT):
        return np.ones(shape, np.float32)
    if fill == SSM_A:
        return -np.exp(rng.normal(0.0, 0.5, shape)).astype(np.float32)
    scale = {ROUTER: 0.02, CONV: 0.2, QUANTIZED: 0.02}[fill]
    return (rng.standard_normal(shape, np.float32) * scale).astype(np.float32)


def _add_vocabulary(writer: gguf.GGUFWriter, vocab: int) -> None:
    specials = ["<unk>", "<s>", "</s>"]
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{n}" for n in range(vocab - len(tokens))]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] \
        + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (vocab - 259)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 259 + [-float(n) for n in range(vocab - 259)])
    writer.add_token_types([int(t) for t in types])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)


def _add_hybrid_metadata(writer: gguf.GGUFWriter, cfg: ModelConfig) -> None:
    """What llama.cpp's converter writes for Qwen3.5-MoE beyond Qwen3-MoE's keys."""
    la, moe = cfg.linear_attention, cfg.moe
    assert la is not None and moe is not None and cfg.layer_types is not None
    writer.add_ssm_conv_kernel(la.conv_kernel)
    writer.add_ssm_state_size(la.key_head_dim)
    writer.add_ssm_group_count(la.num_key_heads)
    writer.add_ssm_time_step_rank(la.num_value_heads)
    writer.add_ssm_inner_size(la.value_dim)
    # the interval is llama.cpp's fallback when recurrent_layers is absent; the layer kinds
    # themselves are written as recurrent_layers (a config cut to --layers keeps its pattern)
    full = cfg.attention_layers
    writer.add_full_attention_interval(full[0] + 1 if full else 4)
    writer.add_array(f"{writer.arch}.attention.recurrent_layers",
                     [cfg.is_linear_layer(n) for n in range(cfg.num_hidden_layers)])
    writer.add_rope_dimension_count(cfg.rotary_dim)
    writer.add_rope_dimension_sections(MROPE_SECTIONS)
    writer.add_expert_shared_feed_forward_length(moe.shared_expert_intermediate_size)


def write_random_gguf(cfg: ModelConfig, qtype: str, path: Path, seed: int = 0) -> Path:
    """``cfg`` (an architecture of ARCHS) as a GGUF of random ``qtype`` ("Q4_0" | "Q8_0")
    blocks."""
    assert qtype in QUANT_TYPES
    arch = gguf_arch(cfg)
    gemma4 = arch == gguf.MODEL_ARCH.GEMMA4
    if gemma4 and (cfg.embedding.hidden_size_per_layer_input or cfg.shares_kv):
        raise ValueError("random Gemma 4 GGUFs are written for configs without per-layer "
                         "embeddings or shared layers (26B-A4B's form)")

    rng = np.random.default_rng(seed)
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(tmp), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name(f"random {cfg.architecture} {cfg.num_hidden_layers} layers {qtype}")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0 if qtype == "Q4_0"
                         else gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    if not gemma4:  # (Gemma 4: per layer kind, below)
        writer.add_head_count_kv(cfg.num_key_value_heads)
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(cfg.rope_theta)
    if cfg.moe is not None:
        writer.add_expert_count(cfg.moe.num_experts)
        writer.add_expert_used_count(cfg.moe.num_experts_per_tok)
        writer.add_expert_feed_forward_length(cfg.moe.moe_intermediate_size)
    if arch == gguf.MODEL_ARCH.SMOLLM3:  # convert_hf_to_gguf's LlamaModel writes the rotary width
        writer.add_rope_dimension_count(cfg.head_dim)
    if arch == gguf.MODEL_ARCH.QWEN35MOE:
        _add_hybrid_metadata(writer, cfg)
    if arch == gguf.MODEL_ARCH.GPT_OSS:
        _add_gpt_oss_metadata(writer, cfg)
    if gemma4:
        _add_gemma4_metadata(writer, cfg)
    writer.add_vocab_size(cfg.vocab_size)
    _add_vocabulary(writer, cfg.vocab_size)
    raw = QUANT_TYPES[qtype]
    block_bytes = gguf.GGML_QUANT_SIZES[raw][1]
    shapes = tensor_shapes(cfg)
    for name, shape, fill in shapes:
        if fill == MXFP4:
            byte_shape = (*shape[:-1], shape[-1] // BLOCK * 17)
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8),
                                   int(np.prod(byte_shape, dtype=np.int64)),
                                   raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        elif stored_quantized(shape, fill):
            byte_shape = (*shape[:-1], shape[-1] // BLOCK * block_bytes)
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8),
                                   int(np.prod(byte_shape, dtype=np.int64)), raw_dtype=raw)
        else:
            writer.add_tensor_info(name, shape, np.dtype(np.float32),
                                   int(np.prod(shape, dtype=np.int64)) * 4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, shape, fill in shapes:
        if fill == MXFP4:
            data = _random_mxfp4(shape, rng)
        elif stored_quantized(shape, fill):
            data = _random_blocks(shape, qtype, rng)
        elif fill == ROPE_FREQS:
            data = _rope_freqs(cfg, shape[0])
        else:
            data = _random_float(shape, fill, rng)
        writer.write_tensor_data(data)
        del data
    writer.close()
    tmp.replace(path)
    return path

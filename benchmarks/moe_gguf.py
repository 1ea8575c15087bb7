"""A GGUF of a Qwen3-MoE config with random weights, for llama.cpp's speed on the same shape.

Every matrix (embedding, attention, experts, LM head) is written in one quantized type, Q4_0 or
Q8_0 ("pure", as `llama-quantize --pure` makes it; llama-quantize's default mix would give the LM
head Q6_K); norms and routers stay F32, as llama-quantize leaves them. Blocks are random: codes
uniform, block scales uniform in 0.004-0.008 (about what N(0, 0.02) weights quantize to), so
nothing is NaN and the file has the real one's size. Tensors are streamed one at a time (the
largest, Q8_0's embedding, is 330 MB). Tensor names and metadata keys are gguf-py's own tables
(what llama.cpp's converter writes for Qwen3MoeForCausalLM).

The vocabulary is a SentencePiece-style ("llama") list of as many tokens: <unk>, <s>, </s>, the
256 byte tokens, then "▁t<i>"; prompts are sent as token ids, so no text is tokenized.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from llm_onnx.model.config import ModelConfig

BLOCK = 32  # Q4_0 and Q8_0: 32 weights a block, one float16 scale
QUANT_TYPES = {"Q4_0": gguf.GGMLQuantizationType.Q4_0, "Q8_0": gguf.GGMLQuantizationType.Q8_0}


def tensor_shapes(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...], bool]]:
    """(GGUF name, shape as numpy holds it (rows last = the input dimension), quantized?) in
    llama.cpp's order."""
    assert cfg.moe is not None
    d, hd, v = cfg.hidden_size, cfg.head_dim, cfg.vocab_size
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    e, i = cfg.moe.num_experts, cfg.moe.moe_intermediate_size
    arch = gguf.MODEL_ARCH.QWEN3MOE
    names = gguf.TENSOR_NAMES

    def name(t, bid=None) -> str:
        assert t in gguf.MODEL_TENSORS[arch], t
        return names[t].format(bid=bid) + ".weight"

    T = gguf.MODEL_TENSOR
    out = [(name(T.TOKEN_EMBD), (v, d), True)]
    for b in range(cfg.num_hidden_layers):
        out += [(name(T.ATTN_NORM, b), (d,), False), (name(T.ATTN_Q, b), (q, d), True),
                (name(T.ATTN_K, b), (kv, d), True), (name(T.ATTN_V, b), (kv, d), True),
                (name(T.ATTN_OUT, b), (d, q), True), (name(T.ATTN_Q_NORM, b), (hd,), False),
                (name(T.ATTN_K_NORM, b), (hd,), False), (name(T.FFN_NORM, b), (d,), False),
                (name(T.FFN_GATE_INP, b), (e, d), False),
                (name(T.FFN_GATE_EXP, b), (e, i, d), True), (name(T.FFN_UP_EXP, b), (e, i, d), True),
                (name(T.FFN_DOWN_EXP, b), (e, d, i), True)]
    out += [(name(T.OUTPUT_NORM), (d,), False), (name(T.OUTPUT), (v, d), True)]
    return out


def _random_blocks(shape: tuple[int, ...], qtype: str, rng: np.random.Generator) -> np.ndarray:
    """Random Q4_0 / Q8_0 blocks of a tensor, as bytes (..., cols / 32 * block bytes)."""
    *lead, cols = shape
    blocks = int(np.prod(lead, dtype=np.int64)) * (cols // BLOCK)
    code_bytes = BLOCK // 2 if qtype == "Q4_0" else BLOCK
    out = np.empty((blocks, 2 + code_bytes), np.uint8)
    out[:, :2] = rng.uniform(0.004, 0.008, blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = rng.integers(0, 256, (blocks, code_bytes), dtype=np.uint8)
    return out.reshape(*lead, cols // BLOCK * (2 + code_bytes))


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


def write_random_gguf(cfg: ModelConfig, qtype: str, path: Path, seed: int = 0) -> Path:
    """``cfg`` (a Qwen3-MoE config) as a GGUF of random ``qtype`` ("Q4_0" | "Q8_0") blocks."""
    assert cfg.moe is not None and qtype in QUANT_TYPES
    rng = np.random.default_rng(seed)
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(tmp), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN3MOE])
    writer.add_name(f"random {cfg.architecture} {cfg.num_hidden_layers} layers {qtype}")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0 if qtype == "Q4_0"
                         else gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_expert_count(cfg.moe.num_experts)
    writer.add_expert_used_count(cfg.moe.num_experts_per_tok)
    writer.add_expert_feed_forward_length(cfg.moe.moe_intermediate_size)
    writer.add_vocab_size(cfg.vocab_size)
    _add_vocabulary(writer, cfg.vocab_size)
    raw = QUANT_TYPES[qtype]
    block_bytes = gguf.GGML_QUANT_SIZES[raw][1]
    shapes = tensor_shapes(cfg)
    for name, shape, quantized in shapes:
        if quantized:
            byte_shape = (*shape[:-1], shape[-1] // BLOCK * block_bytes)
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8),
                                   int(np.prod(byte_shape, dtype=np.int64)), raw_dtype=raw)
        else:
            writer.add_tensor_info(name, shape, np.dtype(np.float32),
                                   int(np.prod(shape, dtype=np.int64)) * 4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, shape, quantized in shapes:
        if quantized:
            data = _random_blocks(shape, qtype, rng)
        elif name.endswith("ffn_gate_inp.weight"):
            data = (rng.standard_normal(shape, np.float32) * 0.02).astype(np.float32)
        else:
            data = np.ones(shape, np.float32)
        writer.write_tensor_data(data)
        del data
    writer.close()
    tmp.replace(path)
    return path

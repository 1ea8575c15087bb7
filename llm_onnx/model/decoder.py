"""The decoder: one configurable module family for every supported family (llm_onnx/families/).

The older families differ from Llama by flags of the config, each one line here or in the
modules it is built of: LayerNorm instead of RMSNorm, a plain GELU or ReLU MLP instead of
SwiGLU, learned absolute positions (GPT-2, OPT with its offset), a fixed sinusoidal table (XGLM)
or ALiBi (BLOOM) instead of RoPE, a LayerNorm after the embedding (BLOOM), attention and MLP in
parallel from one norm (Falcon), a sliding attention window (Mistral), post-LN layers and
embeddings narrower than the layers (OPT-350m). Qwen3.5's linear-attention layers (Gated
DeltaNet) take the place of attention in the layers ``layer_types`` names so.

This module is the stack (the layers, the embeddings, the head); its parts live beside it:

    layers.py     Linear, RMSNorm, LayerNorm
    attention.py  Attention, and attention_form (which form ONNX Runtime runs for a config)
    mlp.py        MLP, and Qwen3-MoE's SparseMoE over stacked Experts (and a shared expert)
    linear_attention.py  GatedDeltaNet, the linear-attention layer of Qwen3.5 and Qwen3-Next
    positions.py  the computed position tables (RoPE's caches, XGLM's sinusoidal table)

The model is a pure function

    forward(input_ids, seqlens_k, total_sequence_length, past) -> (logits, *present)

with no cache buffers of its own, so prefill and decode are the same code traced with different
shapes. ``past`` is [key_0, value_0, key_1, value_1, ...], each (B, Hkv, P, D) (see ops.py for the
position conventions); a linear-attention layer's pair is its conv state (B, K-1, C) and its
recurrent state (B, Hv, dk, dv) instead, which ``valid_tokens`` (B,) says how far to advance. Module attributes copy Hugging Face's names, so checkpoints load by name and
ONNX initializers read ``model.layers.0.self_attn.q_proj...``.

Precision: the residual stream, norms, router softmax and logits stay fp32; projections and
attention run in ``dtype`` (fp32 or fp16). With fp32 every cast below is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from llm_onnx.model import ops
from llm_onnx.model.attention import Attention
from llm_onnx.model.config import ModelConfig
from llm_onnx.model.layers import Linear, make_norm
from llm_onnx.model.linear_attention import GatedDeltaNet, state_shapes
from llm_onnx.model.mlp import MLP, SparseMoE
from llm_onnx.model.positions import RotaryCache, SinusoidalPositions, local_rope


@dataclass(frozen=True)
class Fusion:
    """Which computations run fused. Same math either way; the parity tests run both.

    rotary: RoPE inside GroupQueryAttention (else a separate RotaryEmbedding op);
    qkv: q, k and v projections as one matmul; gate_up: the MLP's gate and up as one matmul;
    plain_attention: attention in plain ONNX ops instead of GroupQueryAttention (for the head
    sizes its kernel refuses: see attention_form), RoPE then always a separate op.
    """

    rotary: bool = True
    qkv: bool = False
    gate_up: bool = False
    plain_attention: bool = False


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int, dtype: torch.dtype, fusion: Fusion) -> None:
        super().__init__()
        self.dtype = dtype
        self.parallel = cfg.parallel_attn
        self.shared_norm = cfg.parallel_attn and cfg.parallel_attn_shared_norm
        self.post_norm = cfg.post_layernorm
        self.sandwich = cfg.sandwich_norm
        self.input_layernorm = make_norm(cfg, cfg.hidden_size)
        self.linear = cfg.is_linear_layer(index)
        if self.linear:  # Qwen3.5: Gated DeltaNet in place of attention
            self.linear_attn = GatedDeltaNet(cfg, dtype)
        else:
            self.self_attn = Attention(cfg, dtype, fusion.rotary, fusion.qkv, index,
                                       fusion.plain_attention)
        if not self.shared_norm:
            self.post_attention_layernorm = make_norm(cfg, cfg.hidden_size)
        if self.sandwich:  # Gemma 3
            self.pre_feedforward_layernorm = make_norm(cfg, cfg.hidden_size)
            self.post_feedforward_layernorm = make_norm(cfg, cfg.hidden_size)
        self.mlp = (SparseMoE(cfg, dtype, fusion.gate_up) if cfg.is_moe_layer(index)
                    else MLP(cfg, dtype, fusion.gate_up))

    def mix(self, h: Tensor, seqlens_k: Tensor, total: Tensor, cos: Tensor | None,
            sin: Tensor | None, positions: Tensor, past_key: Tensor, past_value: Tensor,
            bias: Tensor | None, valid: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """The layer's attention, or its linear attention (past_key, past_value: its states)."""
        if self.linear:
            assert valid is not None
            return self.linear_attn(h, valid, past_key, past_value)
        return self.self_attn(h, seqlens_k, total, cos, sin, positions, past_key, past_value,
                              bias)

    def forward(self, branch: Tensor | None, residual: Tensor, seqlens_k: Tensor, total: Tensor,
                cos: Tensor | None, sin: Tensor | None, positions: Tensor, past_key: Tensor,
                past_value: Tensor, bias: Tensor | None = None, valid: Tensor | None = None,
                ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """branch: what the previous layer adds to the residual stream (None: nothing);
        residual: the fp32 stream. Returns (branch, residual, present key, present value)."""
        if self.post_norm:  # OPT-350m: x = norm(x + attn(x)); x = norm(x + mlp(x))
            if branch is not None:  # layer 0: the position embeddings
                residual = residual + branch.float()
            attn, pk, pv = self.mix(residual.to(self.dtype), seqlens_k, total, cos, sin,
                                    positions, past_key, past_value, bias, valid)
            h, _ = self.input_layernorm.add(attn.float(), residual)
            out, _ = self.post_attention_layernorm.add(self.mlp(h.to(self.dtype)).float(), h)
            return None, out, pk, pv
        if branch is None:
            h = self.input_layernorm(residual)
        else:
            h, residual = self.input_layernorm.add(branch.float(), residual)
        attn, pk, pv = self.mix(h.to(self.dtype), seqlens_k, total, cos, sin, positions,
                                past_key, past_value, bias, valid)
        if self.sandwich:  # Gemma 3: x += norm(attn(norm(x))); x += norm(mlp(norm(x)))
            h, residual = self.pre_feedforward_layernorm.add(
                self.post_attention_layernorm(attn.float()), residual)
            return self.post_feedforward_layernorm(self.mlp(h.to(self.dtype)).float()), residual, pk, pv
        if self.parallel:  # Falcon / GPT-J: x + attn(ln(x)) + mlp(ln(x)), one norm or two
            if not self.shared_norm:
                h = self.post_attention_layernorm(residual)
            return attn.float() + self.mlp(h.to(self.dtype)).float(), residual, pk, pv
        h, residual = self.post_attention_layernorm.add(attn.float(), residual)
        return self.mlp(h.to(self.dtype)), residual, pk, pv


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, fusion: Fusion,
                 max_positions: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.embed_width, dtype=dtype)
        self.embed_tokens.weight.requires_grad_(False)
        if cfg.embed_dim is not None:  # OPT-350m: embeddings narrower than the layers
            self.project_in = Linear(cfg.embed_dim, cfg.hidden_size, False, dtype)
            self.project_out = Linear(cfg.hidden_size, cfg.embed_dim, False, dtype)
        if cfg.position_embedding_type == "rope":
            self.rotary = RotaryCache(cfg, max_positions, dtype)
            if cfg.rope_local_theta is not None:  # Gemma 3's sliding layers
                self.rotary_local = RotaryCache(local_rope(cfg), max_positions, dtype)
        if cfg.position_embedding_type == "learned":  # GPT-2, OPT: a table of absolute positions
            self.embed_positions = nn.Embedding(cfg.max_position_embeddings + cfg.position_offset,
                                                cfg.hidden_size, dtype=torch.float32)
            self.embed_positions.weight.requires_grad_(False)
        if cfg.position_embedding_type == "sinusoidal":  # XGLM
            self.embed_positions = SinusoidalPositions(
                cfg.max_position_embeddings + cfg.position_offset, cfg.hidden_size,
                cfg.position_padding_idx)
        if cfg.embedding_layernorm:  # BLOOM
            self.embed_layernorm = make_norm(cfg, cfg.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, dtype, fusion) for i in range(cfg.num_hidden_layers))
        if not cfg.post_layernorm:
            self.norm = make_norm(cfg, cfg.hidden_size)


@dataclass
class LayerInputs:
    """What flows into the layers: the branch the previous layer adds to the residual stream
    (None at first, or the position embeddings), the fp32 residual stream, the positions, each
    row's last index, the RoPE tables (global, local; None without RoPE), ALiBi's bias and the
    tokens each row really runs (linear-attention layers advance their state over those only)."""

    branch: Tensor | None
    residual: Tensor
    positions: Tensor
    last: Tensor
    rope: tuple[Tensor | None, Tensor | None]
    local: tuple[Tensor | None, Tensor | None]
    bias: Tensor | None
    valid: Tensor | None = None


class Decoder(nn.Module):
    """A decoder-only causal LM (see the module docstring for the forward contract)."""

    def __init__(self, cfg: ModelConfig, *, dtype: torch.dtype = torch.float32,
                 fusion: Fusion | None = None, max_positions: int | None = None,
                 head: bool = True) -> None:
        super().__init__()
        self.config = cfg
        self.dtype = dtype
        self.fusion = fusion or Fusion()
        self.max_positions = max_positions or cfg.max_position_embeddings
        self.model = DecoderModel(cfg, dtype, self.fusion, self.max_positions)
        if head:  # (an embedding model has none: EmbeddingDecoder)
            self.lm_head = Linear(cfg.embed_width, cfg.vocab_size, False, dtype)
            if cfg.tie_word_embeddings:
                self.lm_head.weight = self.model.embed_tokens.weight
        self.alibi_slopes = (ops.alibi_slopes(cfg.num_attention_heads)
                             if cfg.position_embedding_type == "alibi" else [])

    def embed(self, input_ids: Tensor, seqlens_k: Tensor, total_sequence_length: Tensor,
              valid_tokens: Tensor | None = None) -> LayerInputs:
        """Everything before the layers: the residual stream and what every layer takes."""
        cfg, m = self.config, self.model
        positions, last = ops.device_positions(input_ids, seqlens_k)
        rope = local = (None, None)
        if cfg.position_embedding_type == "rope":
            rope = (m.rotary.cos_cache, m.rotary.sin_cache)
            if cfg.rope_local_theta is not None:
                local = (m.rotary_local.cos_cache, m.rotary_local.sin_cache)
        residual = m.embed_tokens(input_ids).float()  # (B, T, D) fp32 residual stream
        if cfg.embedding_multiplier != 1.0:  # XGLM: sqrt(d_model)
            residual = residual * cfg.embedding_multiplier
        if cfg.embed_dim is not None:  # OPT-350m
            residual = m.project_in(residual.to(self.dtype)).float()
        branch: Tensor | None = None
        if cfg.position_embedding_type in ("learned", "sinusoidal"):  # added by layer 0
            branch = m.embed_positions(positions + cfg.position_offset if cfg.position_offset
                                       else positions)
        if cfg.embedding_layernorm:  # BLOOM
            residual = m.embed_layernorm(residual)
        bias = None
        if cfg.position_embedding_type == "alibi":  # BLOOM: one bias for all layers
            bias = ops.alibi_bias(input_ids, total_sequence_length, self.alibi_slopes).to(self.dtype)
        valid = None
        if cfg.linear_attention is not None:  # default: up to each row's last new token
            valid = (last + 1).to(torch.int32) if valid_tokens is None else valid_tokens
        return LayerInputs(branch, residual, positions, last, rope, local, bias, valid)

    def run_layer(self, i: int, x: LayerInputs, seqlens_k: Tensor, total_sequence_length: Tensor,
                  past_key: Tensor, past_value: Tensor) -> tuple[Tensor, Tensor]:
        """Layer ``i`` on ``x``, which it advances (branch, residual); returns its present KV."""
        cos, sin = x.local if self.config.layer_is_local(i) else x.rope
        x.branch, x.residual, pk, pv = self.model.layers[i](
            x.branch, x.residual, seqlens_k, total_sequence_length, cos, sin, x.positions,
            past_key, past_value, x.bias, x.valid)
        return pk, pv

    def forward(self, input_ids: Tensor, seqlens_k: Tensor, total_sequence_length: Tensor,
                *past: Tensor, last_only: bool = False, logits_window: Tensor | None = None,
                valid_tokens: Tensor | None = None) -> tuple[Tensor, ...]:
        """Logits (B, T, V) fp32 (or (B, 1, V) at each row's last new token when ``last_only``)
        and the updated caches, in the order of ``past``.

        ``logits_window`` (with ``last_only``): a (W,) tensor whose length alone counts: the
        logits of each row's last W new tokens, (B, W, V) (a speculative verify step reads the
        k + 1 it ran; W = 1 is ``last_only``).

        ``valid_tokens`` (B,) int32 (models with linear-attention layers): how many of its T new
        tokens each row really runs; the others (padding, a row riding along in a batched
        step) leave its states as they were. Default: up to each row's last new token."""
        cfg, m = self.config, self.model
        h, last, present = self.hidden_states(input_ids, seqlens_k, total_sequence_length, *past,
                                              valid_tokens=valid_tokens)
        if last_only and logits_window is not None:  # each row's last W new tokens
            # W on the device from the values (as ops.device_positions does for T): a host value
            # in device arithmetic would make ONNX Runtime copy it over, ruling out CUDA graphs.
            w = torch.arange(logits_window.shape[0], device=h.device, dtype=torch.int64)
            count = (logits_window * 0 + 1).sum()
            index = (last[:, None] + 1 - count + w[None, :]).clamp_min(0)
            h = h.gather(1, index[:, :, None].expand(-1, -1, h.shape[-1]))  # (B, W, D)
        elif last_only:  # row b's last new token (clamped for padded decode rows)
            h = h.gather(1, last[:, None, None].expand(-1, 1, h.shape[-1]))  # (B, 1, D)
        if cfg.embed_dim is not None:
            h = m.project_out(h.to(self.dtype))
        logits = self.lm_head(h.to(self.dtype)).float()  # type: ignore[operator]
        if cfg.final_logit_softcapping is not None:  # Gemma
            cap = cfg.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return (logits, *present)

    def hidden_states(self, input_ids: Tensor, seqlens_k: Tensor, total_sequence_length: Tensor,
                      *past: Tensor, valid_tokens: Tensor | None = None,
                      ) -> tuple[Tensor, Tensor, list[Tensor]]:
        """The final hidden states (B, T, D) fp32, after the final norm (the LM head's input),
        each row's last new index (B,) and the updated caches, in the order of ``past``."""
        x = self.embed(input_ids, seqlens_k, total_sequence_length, valid_tokens)
        present: list[Tensor] = []
        for i in range(len(self.model.layers)):
            present += self.run_layer(i, x, seqlens_k, total_sequence_length, past[2 * i],
                                      past[2 * i + 1])
        if self.config.post_layernorm:  # the last layer's output is already normalized
            return x.residual, x.last, present
        assert x.branch is not None
        h, _ = self.model.norm.add(x.branch.float(), x.residual)
        return h, x.last, present

    def new_layer_cache(self, i: int, batch: int, length: int) -> list[Tensor]:
        """Layer ``i``'s two zeroed state tensors (see new_cache)."""
        cfg = self.config
        if cfg.is_linear_layer(i):
            assert cfg.linear_attention is not None
            return [torch.zeros((batch, *shape)) for shape in state_shapes(cfg.linear_attention)]
        shape = (batch, cfg.num_key_value_heads, length, cfg.head_dim)
        return [torch.zeros(shape, dtype=self.dtype) for _ in range(2)]

    def new_cache(self, batch: int, length: int) -> list[Tensor]:
        """Zeroed KV buffers (B, Hkv, length, D) for every layer (a linear-attention layer's
        states, float32, instead), in the order forward expects."""
        return [t for i in range(self.config.num_hidden_layers)
                for t in self.new_layer_cache(i, batch, length)]

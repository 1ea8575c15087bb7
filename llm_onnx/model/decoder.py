"""The decoder: one configurable module family for every supported family (llm_onnx/families/).

The older families differ from Llama by flags of the config, each one line here: LayerNorm instead
of RMSNorm, a plain GELU or ReLU MLP instead of SwiGLU, learned absolute positions (GPT-2, OPT with
its offset), a fixed sinusoidal table (XGLM) or ALiBi (BLOOM) instead of RoPE, a LayerNorm after the embedding (BLOOM), attention
and MLP in parallel from one norm (Falcon), a sliding attention window (Mistral), post-LN layers
and embeddings narrower than the layers (OPT-350m).

The model is a pure function

    forward(input_ids, seqlens_k, total_sequence_length, past) -> (logits, *present)

with no cache buffers of its own, so prefill and decode are the same code traced with different
shapes. ``past`` is [key_0, value_0, key_1, value_1, ...], each (B, Hkv, P, D) (see ops.py for the
position conventions). Module attributes copy Hugging Face's names, so checkpoints load by name and
ONNX initializers read ``model.layers.0.self_attn.q_proj...``.

Precision: the residual stream, norms, router softmax and logits stay fp32; projections and
attention run in ``dtype`` (fp32 or fp16). With fp32 every cast below is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from llm_onnx.model import ops
from llm_onnx.model.config import ModelConfig
from llm_onnx.model.rope import rope_cache, sinusoidal_table


class Linear(nn.Module):
    """y = x W^T + b with Hugging Face's (out, in) weight layout."""

    def __init__(self, n_in: int, n_out: int, bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features, self.out_features = n_in, n_out
        self.weight = nn.Parameter(torch.empty(n_out, n_in, dtype=dtype), requires_grad=False)
        self.bias = (nn.Parameter(torch.empty(n_out, dtype=dtype), requires_grad=False)
                     if bias else None)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


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


@dataclass(frozen=True)
class AttentionForm:
    """How a config's attention is exported: GroupQueryAttention with RoPE inside (the fused
    kernel, fastest), GroupQueryAttention with RoPE as its own op, or plain ONNX ops. ``why``
    says what ruled out the faster forms (None for the fused one)."""

    name: str  # "fused" | "rotary outside" | "plain"
    why: str | None = None

    @property
    def rotary_inside(self) -> bool:
        return self.name == "fused"

    @property
    def plain(self) -> bool:
        return self.name == "plain"


def attention_form(cfg: ModelConfig) -> AttentionForm:
    """The fastest attention ONNX Runtime (1.31) runs for ``cfg`` on the CPU: its
    GroupQueryAttention refuses a head size that is not a multiple of 16, and RoPE inside it a
    rotary width whose half is not a multiple of 8 (measured; see docs/export.md)."""
    if cfg.head_dim % 16:
        return AttentionForm("plain", f"head_dim {cfg.head_dim} is not a multiple of 16, which "
                                      "ONNX Runtime's GroupQueryAttention requires")
    half = cfg.rotary_dim // 2
    if cfg.position_embedding_type == "rope" and half % 8:
        return AttentionForm("rotary outside",
                             f"the rotary width {cfg.rotary_dim} (head_dim {cfg.head_dim} x "
                             f"partial_rotary_factor {cfg.partial_rotary_factor:g}) halves to "
                             f"{half}, not a multiple of 8, which GroupQueryAttention's RoPE "
                             "requires")
    return AttentionForm("fused")


class RMSNorm(nn.Module):
    """RMSNorm with fp32 statistics and an fp32 weight; ``add`` fuses the residual sum before it."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width), requires_grad=False)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return ops.rms_norm(x, self.weight, self.eps)

    def add(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        """(norm(x + residual), x + residual)."""
        return ops.add_rms_norm(x, residual, self.weight, self.eps)


class LayerNorm(nn.Module):
    """LayerNorm with fp32 statistics, weight and bias; ``add`` fuses the residual sum before it."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(width), requires_grad=False)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return ops.layer_norm(x, self.weight, self.bias, self.eps)

    def add(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        """(norm(x + residual), x + residual)."""
        return ops.add_layer_norm(x, residual, self.weight, self.bias, self.eps)


def make_norm(cfg: ModelConfig, width: int) -> RMSNorm | LayerNorm:
    if cfg.norm_type == "layer":  # GPT-2, BLOOM, Falcon
        return LayerNorm(width, cfg.layer_norm_epsilon)
    return RMSNorm(width, cfg.rms_norm_eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, fused_rotary: bool,
                 fuse_qkv: bool, layer: int = 0, plain: bool = False) -> None:
        super().__init__()
        self.num_heads, self.kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.q_width, self.kv_width = self.num_heads * self.head_dim, self.kv_heads * self.head_dim
        d = cfg.hidden_size
        self.fuse_qkv = fuse_qkv
        if fuse_qkv:  # one matmul; rows q, then k, then v (GQA's packed QKV layout)
            self.qkv_proj = Linear(d, self.q_width + 2 * self.kv_width, cfg.attention_bias, dtype)
        else:
            self.q_proj = Linear(d, self.q_width, cfg.attention_bias, dtype)
            self.k_proj = Linear(d, self.kv_width, cfg.attention_bias, dtype)
            self.v_proj = Linear(d, self.kv_width, cfg.attention_bias, dtype)
        self.o_proj = Linear(self.q_width, d, cfg.o_proj_bias, dtype)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:  # Qwen3: RMSNorm over each head's q and k, before RoPE
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.scale = cfg.attention_scale or self.head_dim ** -0.5
        # Mistral: each query sees its last `sliding_window` keys, itself included, which is what
        # GroupQueryAttention's local_window_size means (measured: see ops.attention_ref).
        # Gemma 3: only its sliding layers.
        self.window = cfg.layer_window(layer) or -1
        self.rope = cfg.position_embedding_type == "rope"
        self.plain = plain
        self.fused_rotary = fused_rotary and self.rope and not plain

    def forward(self, x: Tensor, seqlens_k: Tensor, total: Tensor, cos: Tensor | None,
                sin: Tensor | None, positions: Tensor, past_key: Tensor, past_value: Tensor,
                bias: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """bias: ALiBi's (1, H, T, S) attention bias, or None."""
        b, t, _ = x.shape
        k: Tensor | None
        v: Tensor | None
        if self.fuse_qkv:
            q, k, v = self.qkv_proj(x), None, None  # (B, T, H*D + 2*Hkv*D)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)  # (B, T, H*D), (B, T, Hkv*D) x2
        if self.qk_norm or (self.rope and not self.fused_rotary) or self.plain:
            if k is None:
                # Slices, not split(): torch.split exports as SplitToSequence, which has no
                # CUDA kernel in ONNX Runtime (the node would run on the CPU).
                qw, kw = self.q_width, self.kv_width
                q, k, v = q[..., :qw], q[..., qw:qw + kw], q[..., qw + kw:]
            if self.qk_norm:
                q = self.q_norm(q.reshape(b, t, self.num_heads, self.head_dim)).reshape(b, t, -1)
                k = self.k_norm(k.reshape(b, t, self.kv_heads, self.head_dim)).reshape(b, t, -1)
                q, k = q.to(x.dtype), k.to(x.dtype)
        if self.rope and not self.fused_rotary:
            assert k is not None and v is not None and cos is not None and sin is not None
            q = ops.rotary_embedding(q, positions, cos, sin, self.num_heads, False)
            k = ops.rotary_embedding(k, positions, cos, sin, self.kv_heads, False)
        if self.plain:
            assert k is not None and v is not None
            out, pk, pv = ops.plain_attention(
                q, k, v, past_key, past_value, seqlens_k, total, positions, self.num_heads,
                self.kv_heads, self.scale, self.window, bias)
            return self.o_proj(out), pk, pv
        if not self.fused_rotary:
            cos = sin = None  # RoPE applied above, or none at all (learned positions, ALiBi)
        out, pk, pv = ops.group_query_attention(
            q, k, v, past_key, past_value, seqlens_k, total, cos, sin,
            self.num_heads, self.kv_heads, self.scale, self.window, False, bias)
        return self.o_proj(out), pk, pv


# hidden_act (transformers' names) -> function. The tanh variants are one formula written three
# ways; BLOOM's BloomGelu is that formula too.
_ACT = {"silu": F.silu, "gelu": ops.gelu, "gelu_new": ops.fast_gelu,
        "gelu_pytorch_tanh": ops.fast_gelu, "gelu_fast": ops.fast_gelu, "relu": F.relu}


class MLP(nn.Module):
    """Gated (SwiGLU): down(silu(gate(x)) * up(x)), gate and up possibly one matmul (rows gate,
    then up). Plain (GPT-2, BLOOM, Falcon): down(gelu(up(x)))."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, fuse_gate_up: bool) -> None:
        super().__init__()
        d, i = cfg.hidden_size, cfg.intermediate_size
        self.gated = cfg.gated_mlp
        self.fuse_gate_up = fuse_gate_up and cfg.gated_mlp
        if self.fuse_gate_up:
            self.gate_up_proj = Linear(d, 2 * i, cfg.mlp_bias, dtype)
        elif self.gated:
            self.gate_proj = Linear(d, i, cfg.mlp_bias, dtype)
        if not self.fuse_gate_up:
            self.up_proj = Linear(d, i, cfg.mlp_bias, dtype)
        self.down_proj = Linear(i, d, cfg.mlp_bias, dtype)
        self.act = _ACT[cfg.hidden_act]

    def forward(self, x: Tensor) -> Tensor:
        if not self.gated:
            return self.down_proj(self.act(self.up_proj(x)))
        if self.fuse_gate_up and self.act is F.silu:
            return self.down_proj(ops.swiglu(self.gate_up_proj(x)))  # one Split, not a sequence
        if self.fuse_gate_up:
            gate_up = self.gate_up_proj(x)  # sliced, not chunk(): see Attention.forward
            half = gate_up.shape[-1] // 2
            gate, up = gate_up[..., :half], gate_up[..., half:]
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(self.act(gate) * up)


class Experts(nn.Module):
    """All experts of a layer stacked in ORT's MoE layout.

    gate_up_proj (E, 2I, D) with gate and up rows interleaved (g0, u0, g1, u1, ...);
    down_proj (E, D, I). Loaders build these from Hugging Face's per-expert tensors.
    """

    def __init__(self, num_experts: int, d: int, i: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * i, d, dtype=dtype),
                                         requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(num_experts, d, i, dtype=dtype), requires_grad=False)

    def forward(self, x: Tensor, router_logits: Tensor, k: int, normalize: bool) -> Tensor:
        """x (N, D), router_logits (N, E) -> (N, D)."""
        return ops.moe(x, router_logits, self.gate_up_proj, self.down_proj, k, normalize)


class SparseMoE(nn.Module):
    """Qwen3-MoE MLP: fp32 softmax router over E experts, top-k, optional renormalisation."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        moe = cfg.moe
        assert moe is not None
        self.top_k, self.normalize = moe.num_experts_per_tok, moe.norm_topk_prob
        self.gate = Linear(cfg.hidden_size, moe.num_experts, False, dtype)  # router
        self.experts = Experts(moe.num_experts, cfg.hidden_size, moe.moe_intermediate_size, dtype)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        flat = x.reshape(b * t, d)  # (N, D)
        logits = self.gate(flat).float()  # (N, E), router in fp32
        out = self.experts(flat, logits.to(flat.dtype), self.top_k, self.normalize)
        return out.reshape(b, t, d)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int, dtype: torch.dtype, fusion: Fusion) -> None:
        super().__init__()
        self.dtype = dtype
        self.parallel = cfg.parallel_attn
        self.shared_norm = cfg.parallel_attn and cfg.parallel_attn_shared_norm
        self.post_norm = cfg.post_layernorm
        self.sandwich = cfg.sandwich_norm
        self.input_layernorm = make_norm(cfg, cfg.hidden_size)
        self.self_attn = Attention(cfg, dtype, fusion.rotary, fusion.qkv, index,
                                   fusion.plain_attention)
        if not self.shared_norm:
            self.post_attention_layernorm = make_norm(cfg, cfg.hidden_size)
        if self.sandwich:  # Gemma 3
            self.pre_feedforward_layernorm = make_norm(cfg, cfg.hidden_size)
            self.post_feedforward_layernorm = make_norm(cfg, cfg.hidden_size)
        self.mlp = (SparseMoE(cfg, dtype) if cfg.is_moe_layer(index)
                    else MLP(cfg, dtype, fusion.gate_up))

    def forward(self, branch: Tensor | None, residual: Tensor, seqlens_k: Tensor, total: Tensor,
                cos: Tensor | None, sin: Tensor | None, positions: Tensor, past_key: Tensor,
                past_value: Tensor, bias: Tensor | None = None,
                ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """branch: what the previous layer adds to the residual stream (None: nothing);
        residual: the fp32 stream. Returns (branch, residual, present key, present value)."""
        if self.post_norm:  # OPT-350m: x = norm(x + attn(x)); x = norm(x + mlp(x))
            if branch is not None:  # layer 0: the position embeddings
                residual = residual + branch.float()
            attn, pk, pv = self.self_attn(residual.to(self.dtype), seqlens_k, total, cos, sin,
                                          positions, past_key, past_value, bias)
            h, _ = self.input_layernorm.add(attn.float(), residual)
            out, _ = self.post_attention_layernorm.add(self.mlp(h.to(self.dtype)).float(), h)
            return None, out, pk, pv
        if branch is None:
            h = self.input_layernorm(residual)
        else:
            h, residual = self.input_layernorm.add(branch.float(), residual)
        attn, pk, pv = self.self_attn(h.to(self.dtype), seqlens_k, total, cos, sin, positions,
                                      past_key, past_value, bias)
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


def local_rope(cfg: ModelConfig) -> ModelConfig:
    """The config whose RoPE tables Gemma 3's sliding layers take: the local base, unscaled."""
    assert cfg.rope_local_theta is not None
    return cfg.replace(rope_theta=cfg.rope_local_theta, rope_scaling=None)


class RotaryCache(nn.Module):
    """cos/sin tables shared by all layers: (max_positions, rotary_dim / 2). Computed, never
    loaded: on the meta device they are placeholders until ``materialize()``."""

    def __init__(self, cfg: ModelConfig, max_positions: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg, self.max_positions, self.table_dtype = cfg, max_positions, dtype
        cos, sin = rope_cache(cfg, max_positions, dtype)  # meta tensors under torch.device("meta")
        self.register_buffer("cos_cache", cos, persistent=False)
        self.register_buffer("sin_cache", sin, persistent=False)

    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The real cos and sin tables (on the CPU, whatever device the module is on)."""
        with torch.device("cpu"):
            return rope_cache(self.cfg, self.max_positions, self.table_dtype)

    def materialize(self) -> None:
        self.cos_cache, self.sin_cache = self.tables()


class SinusoidalPositions(nn.Module):
    """XGLM's fixed position table, read like a learned one, row ``zero_row`` zeroed; computed,
    never loaded (on the meta device a placeholder until ``materialize()``)."""

    def __init__(self, rows: int, dim: int, zero_row: int | None = None) -> None:
        super().__init__()
        self.rows, self.dim, self.zero_row = rows, dim, zero_row
        self.register_buffer("weight", sinusoidal_table(rows, dim, zero_row), persistent=False)

    def table(self) -> Tensor:
        with torch.device("cpu"):
            return sinusoidal_table(self.rows, self.dim, self.zero_row)

    def materialize(self) -> None:
        self.weight = self.table()

    def forward(self, positions: Tensor) -> Tensor:
        return F.embedding(positions, self.weight)


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
    row's last index, the RoPE tables (global, local; None without RoPE) and ALiBi's bias."""

    branch: Tensor | None
    residual: Tensor
    positions: Tensor
    last: Tensor
    rope: tuple[Tensor | None, Tensor | None]
    local: tuple[Tensor | None, Tensor | None]
    bias: Tensor | None


class Decoder(nn.Module):
    """A decoder-only causal LM (see the module docstring for the forward contract)."""

    def __init__(self, cfg: ModelConfig, *, dtype: torch.dtype = torch.float32,
                 fusion: Fusion | None = None, max_positions: int | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.dtype = dtype
        self.fusion = fusion or Fusion()
        self.max_positions = max_positions or cfg.max_position_embeddings
        self.model = DecoderModel(cfg, dtype, self.fusion, self.max_positions)
        self.lm_head = Linear(cfg.embed_width, cfg.vocab_size, False, dtype)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.alibi_slopes = (ops.alibi_slopes(cfg.num_attention_heads)
                             if cfg.position_embedding_type == "alibi" else [])

    def embed(self, input_ids: Tensor, seqlens_k: Tensor, total_sequence_length: Tensor,
              ) -> LayerInputs:
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
        return LayerInputs(branch, residual, positions, last, rope, local, bias)

    def run_layer(self, i: int, x: LayerInputs, seqlens_k: Tensor, total_sequence_length: Tensor,
                  past_key: Tensor, past_value: Tensor) -> tuple[Tensor, Tensor]:
        """Layer ``i`` on ``x``, which it advances (branch, residual); returns its present KV."""
        cos, sin = x.local if self.config.layer_is_local(i) else x.rope
        x.branch, x.residual, pk, pv = self.model.layers[i](
            x.branch, x.residual, seqlens_k, total_sequence_length, cos, sin, x.positions,
            past_key, past_value, x.bias)
        return pk, pv

    def forward(self, input_ids: Tensor, seqlens_k: Tensor, total_sequence_length: Tensor,
                *past: Tensor, last_only: bool = False,
                logits_window: Tensor | None = None) -> tuple[Tensor, ...]:
        """Logits (B, T, V) fp32 (or (B, 1, V) at each row's last new token when ``last_only``)
        and the updated caches, in the order of ``past``.

        ``logits_window`` (with ``last_only``): a (W,) tensor whose length alone counts: the
        logits of each row's last W new tokens, (B, W, V) (a speculative verify step reads the
        k + 1 it ran; W = 1 is ``last_only``)."""
        cfg, m = self.config, self.model
        x = self.embed(input_ids, seqlens_k, total_sequence_length)
        present: list[Tensor] = []
        for i in range(len(m.layers)):
            present += self.run_layer(i, x, seqlens_k, total_sequence_length, past[2 * i],
                                      past[2 * i + 1])
        branch, residual, last = x.branch, x.residual, x.last
        if cfg.post_layernorm:  # the last layer's output is already normalized
            h = residual
        else:
            assert branch is not None
            h, _ = self.model.norm.add(branch.float(), residual)  # (B, T, D)
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
        logits = self.lm_head(h.to(self.dtype)).float()
        if cfg.final_logit_softcapping is not None:  # Gemma
            cap = cfg.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return (logits, *present)

    def new_cache(self, batch: int, length: int) -> list[Tensor]:
        """Zeroed KV buffers (B, Hkv, length, D) for every layer, in the order forward expects."""
        cfg = self.config
        shape = (batch, cfg.num_key_value_heads, length, cfg.head_dim)
        return [torch.zeros(shape, dtype=self.dtype) for _ in range(2 * cfg.num_hidden_layers)]

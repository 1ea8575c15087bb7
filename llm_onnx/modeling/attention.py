"""Attention: the module (q/k/v/o projections, Qwen3's q/k norms, Qwen3.5's output gate,
gpt-oss's sinks, RoPE outside or inside GroupQueryAttention or none on SmolLM3's NoPE layers,
plain ONNX ops for the head sizes the kernel refuses) and the choice of the fastest form ONNX
Runtime runs for a config (``attention_form``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from llm_onnx.modeling import ops
from llm_onnx.modeling.config import ModelConfig
from llm_onnx.modeling.layers import Linear, RMSNorm


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
    for head_dim in sorted({cfg.layer_head_dim(i) for i in range(cfg.num_hidden_layers)}):
        if head_dim % 16:  # (Gemma 4: both head sizes)
            return AttentionForm("plain", f"head_dim {head_dim} is not a multiple of 16, which "
                                          "ONNX Runtime's GroupQueryAttention requires")
    half = cfg.rotary_dim // 2
    if cfg.positions.position_embedding_type == "rope" and half % 8:
        return AttentionForm("rotary outside",
                             f"the rotary width {cfg.rotary_dim} (head_dim {cfg.head_dim} x "
                             f"partial_rotary_factor {cfg.partial_rotary_factor:g}) halves to "
                             f"{half}, not a multiple of 8, which GroupQueryAttention's RoPE "
                             "requires")
    return AttentionForm("fused")


def hadamard(d: int) -> Tensor:
    """The normalised Sylvester-Hadamard matrix (d, d) float32, d a power of two: symmetric and
    orthogonal (H @ H = I), every entry +-1/sqrt(d). An int8 KV cache keeps keys (after RoPE)
    and values in this basis per head (scores and outputs are unchanged: q.k = Hq.Hk): each
    stored channel then mixes all of a head's channels, so its few loud ones no longer get
    coarse scales of their own (docs/notes/kv-int8-gqa.md)."""
    if d < 1 or d & (d - 1):
        raise ValueError(f"a Hadamard matrix here needs a power of two, not {d}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(d)).float()


def rotates_keys(head_dim: int) -> bool:
    """Whether an int8 KV cache stores this head size's keys (and queries meet them) in the
    Hadamard basis (``hadamard``: a power of two)."""
    return not head_dim & (head_dim - 1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, fused_rotary: bool,
                 fuse_qkv: bool, layer: int = 0, plain: bool = False,
                 kv_int8: bool = False) -> None:
        super().__init__()
        # Gemma 4: full-attention layers have their own head size and KV head count
        self.num_heads, self.kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.layer_kv_heads(layer), cfg.layer_head_dim(layer))
        self.q_width, self.kv_width = self.num_heads * self.head_dim, self.kv_heads * self.head_dim
        d = cfg.hidden_size
        # Gemma 4: a KV-shared layer projects only its queries and attends over the cache of
        # an earlier layer (its keys and values are handed in: forward's ``reuse``); a full
        # layer with attention_k_eq_v takes its key projection as the values too.
        self.shared = cfg.is_kv_shared(layer)
        self.k_eq_v = cfg.layer_k_eq_v(layer)
        self.value_norm, self.eps = cfg.attention.value_norm, cfg.rms_norm_eps
        # Qwen3.5: q_proj also emits a gate per head, rows [query_h | gate_h] for each head h
        self.output_gate = cfg.attention.attention_output_gate
        self.fuse_qkv = fuse_qkv and not (self.output_gate or self.shared or self.k_eq_v)
        if self.fuse_qkv:  # one matmul; rows q, then k, then v (GQA's packed QKV layout)
            self.qkv_proj = Linear(d, self.q_width + 2 * self.kv_width,
                                   cfg.attention.attention_bias, dtype)
        else:
            self.q_proj = Linear(d, self.q_width * (2 if self.output_gate else 1),
                                 cfg.attention.attention_bias, dtype)
            if not self.shared:
                self.k_proj = Linear(d, self.kv_width, cfg.attention.attention_bias, dtype)
            if not (self.shared or self.k_eq_v):
                self.v_proj = Linear(d, self.kv_width, cfg.attention.attention_bias, dtype)
        self.o_proj = Linear(self.q_width, d, cfg.attention.o_proj_bias, dtype)
        self.qk_norm = cfg.attention.qk_norm
        if cfg.attention.qk_norm:  # Qwen3: RMSNorm over each head's q and k, before RoPE
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            if not self.shared:
                self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.scale = cfg.attention.attention_scale or self.head_dim ** -0.5
        # Mistral: each query sees its last `sliding_window` keys, itself included, which is what
        # GroupQueryAttention's local_window_size means (measured: see ops.attention_ref).
        # Gemma 3: only its sliding layers.
        self.window = cfg.layer_window(layer) or -1
        if cfg.attention.attention_sinks:  # gpt-oss: a learned logit per query head in each softmax
            self.sinks = nn.Parameter(torch.empty(self.num_heads, dtype=dtype), requires_grad=False)
        self.has_sinks = cfg.attention.attention_sinks
        # SmolLM3: its NoPE layers (no_rope_layers) attend without rotating q and k, so their
        # GroupQueryAttention gets no cos/sin caches (do_rotary=0) beside rotating layers.
        self.rope = cfg.layer_uses_rope(layer)
        self.plain = plain
        self.fused_rotary = fused_rotary and self.rope and not plain
        # An int8 KV cache (--kv-cache int8): GroupQueryAttention's per-channel scales, (Hkv*D,)
        # KV-head-major, float32 whatever the compute dtype, calibrated at export (calibrate.py)
        self.kv_int8 = kv_int8
        if kv_int8:
            if plain or self.shared:
                raise ValueError("an int8 KV cache needs GroupQueryAttention and a layer of its "
                                 "own keys and values")
            self.k_scale = nn.Parameter(torch.empty(self.kv_width, dtype=torch.float32),
                                        requires_grad=False)
            self.v_scale = nn.Parameter(torch.empty(self.kv_width, dtype=torch.float32),
                                        requires_grad=False)
        # ... whose keys are stored in the Hadamard basis (``hadamard``), where each channel
        # mixes all of a head's: queries and keys are rotated after RoPE, so RoPE runs outside
        # the kernel here. Values are rotated in the weights (export/kv_rotation.py).
        self.rotate_keys = kv_int8 and rotates_keys(self.head_dim)
        if self.rotate_keys:
            self.fused_rotary = False
            self.key_rotation = nn.Parameter(torch.empty(self.head_dim, self.head_dim,
                                                         dtype=dtype), requires_grad=False)
        # The calibration's hook (calibrate.py): called with each run's keys before RoPE and
        # values, each (B, T, Hkv*D), as the attention kernel takes them. None when exporting.
        self.observe = None

    def forward(self, x: Tensor, seqlens_k: Tensor, total: Tensor, cos: Tensor | None,
                sin: Tensor | None, positions: Tensor, past_key: Tensor | None,
                past_value: Tensor | None, bias: Tensor | None = None,
                reuse: tuple[Tensor, Tensor] | None = None,
                ) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor]]:
        """bias: ALiBi's (1, H, T, S) attention bias, or None. ``reuse`` (a KV-shared layer,
        Gemma 4): the new keys and values its source layer handed to the attention kernel;
        ``past_key``/``past_value`` are then the source's present cache, which the kernel reads
        (it writes the same keys and values at the same positions again). Returns the output,
        the present cache and the new keys and values as handed to the kernel."""
        b, t, _ = x.shape
        k: Tensor | None
        v: Tensor | None
        if self.fuse_qkv:
            q, k, v = self.qkv_proj(x), None, None  # (B, T, H*D + 2*Hkv*D)
        elif self.shared:
            q, k, v = self.q_proj(x), None, None
        else:  # (B, T, H*D), (B, T, Hkv*D) x2; Gemma 4's k_eq_v: the key projection twice
            q, k = self.q_proj(x), self.k_proj(x)
            v = k if self.k_eq_v else self.v_proj(x)
        gate = None
        if self.output_gate:  # Qwen3.5: (B, T, H, 2D) -> query and gate, each (B, T, H*D)
            qg = q.reshape(b, t, self.num_heads, 2 * self.head_dim)
            q = qg[..., :self.head_dim].reshape(b, t, self.q_width)
            gate = qg[..., self.head_dim:].reshape(b, t, self.q_width)
        if self.shared:  # Gemma 4: queries only; keys and values as the source handed them
            assert reuse is not None and past_key is not None and past_value is not None
            if self.qk_norm:
                q = self.q_norm(q.reshape(b, t, self.num_heads, self.head_dim)).reshape(
                    b, t, -1).to(x.dtype)
            if self.rope and not self.fused_rotary:
                assert cos is not None and sin is not None
                q = ops.rotary_embedding(q, positions, cos, sin, self.num_heads, False)
            k, v = reuse
        elif (self.qk_norm or (self.rope and not self.fused_rotary) or self.plain
              or self.rotate_keys):
            if k is None:
                # Slices, not split(): torch.split exports as SplitToSequence, which has no
                # CUDA kernel in ONNX Runtime (the node would run on the CPU).
                qw, kw = self.q_width, self.kv_width
                q, k, v = q[..., :qw], q[..., qw:qw + kw], q[..., qw + kw:]
            if self.qk_norm:
                q = self.q_norm(q.reshape(b, t, self.num_heads, self.head_dim)).reshape(b, t, -1)
                k = self.k_norm(k.reshape(b, t, self.kv_heads, self.head_dim)).reshape(b, t, -1)
                q, k = q.to(x.dtype), k.to(x.dtype)
        if self.value_norm and not self.shared:  # Gemma 4: weightless RMSNorm per value head
            assert v is not None
            vf = v.reshape(b, t, self.kv_heads, self.head_dim).float()
            v = (vf * torch.rsqrt(vf.pow(2).mean(-1, keepdim=True) + self.eps)).reshape(
                b, t, -1).to(x.dtype)
        if self.observe is not None and not self.shared:
            qw, kw = self.q_width, self.kv_width  # (packed QKV when k is None)
            self.observe(*((k, v) if k is not None else (q[..., qw:qw + kw], q[..., qw + kw:])))
        if self.rope and not self.fused_rotary and not self.shared:
            assert k is not None and v is not None and cos is not None and sin is not None
            q = ops.rotary_embedding(q, positions, cos, sin, self.num_heads, False)
            k = ops.rotary_embedding(k, positions, cos, sin, self.kv_heads, False)
        if self.rotate_keys:  # (B, T, N, D) @ H: the int8 cache's basis (H symmetric)
            assert k is not None
            q = (q.reshape(b, t, self.num_heads, self.head_dim) @ self.key_rotation).reshape(
                b, t, -1)
            k = (k.reshape(b, t, self.kv_heads, self.head_dim) @ self.key_rotation).reshape(
                b, t, -1)
        assert past_key is not None and past_value is not None
        if self.plain:
            assert k is not None and v is not None
            out, pk, pv = ops.plain_attention(
                q, k, v, past_key, past_value, seqlens_k, total, positions, self.num_heads,
                self.kv_heads, self.scale, self.window, bias, self.sinks if self.has_sinks else None)
        else:
            if not self.fused_rotary:
                cos = sin = None  # RoPE applied above, or none at all (learned positions, ALiBi)
            out, pk, pv = ops.group_query_attention(
                q, k, v, past_key, past_value, seqlens_k, total, cos, sin,
                self.num_heads, self.kv_heads, self.scale, self.window, False, bias,
                self.sinks if self.has_sinks else None,
                *((self.k_scale, self.v_scale) if self.kv_int8 else ()))
        if gate is not None:  # Qwen3.5: the output gated per channel, before o_proj
            out = out * torch.sigmoid(gate.float()).to(out.dtype)
        return self.o_proj(out), pk, pv, (k, v)  # type: ignore[return-value]

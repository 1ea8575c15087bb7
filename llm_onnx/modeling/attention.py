"""Attention, the token mixer of every layer that keeps a KV cache, in two parts:

    Attention           q/k/v projections over the layer's own cache (which it extends)
    SharedKVAttention   queries only, over an earlier layer's cache (Gemma 4's KV-shared layers)

Each is built from an ``AttentionSpec``, decided once from the config and the export's choices
(``attention_spec``): how q, k and v are projected (one packed matmul, three, or keys that are
the values), the steps between the projections and the kernel (Qwen3's q/k norms, Gemma 4's
value norm, RoPE as its own op, the int8 cache's change of basis), and the kernel
(GroupQueryAttention with or without RoPE inside, or plain ONNX ops for the head sizes it
refuses). Their forwards run the chosen steps in order and never look at the config.

``attention_form`` chooses the fastest form ONNX Runtime runs for a config.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from llm_onnx.modeling import ops
from llm_onnx.modeling.config import ModelConfig
from llm_onnx.modeling.layers import Fusion, Linear, MixerInputs, RMSNorm


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


@dataclass(frozen=True)
class AttentionSpec:
    """One layer's attention, decided once (``attention_spec``).

    rope: "inside" (GroupQueryAttention rotates, do_rotary), "outside" (RotaryEmbedding ops
    before the kernel) or "none" (learned or ALiBi positions, SmolLM3's NoPE layers).
    window: the keys each query sees, itself included (GroupQueryAttention's
    local_window_size: Mistral, the sliding layers of Gemma and gpt-oss); -1: all.
    """

    heads: int
    kv_heads: int
    head_dim: int
    scale: float
    window: int
    rope: str
    plain: bool  # plain ONNX ops instead of GroupQueryAttention (attention_form)
    packed_qkv: bool  # q, k and v as one matmul, rows q | k | v (GroupQueryAttention's layout)
    bias: bool  # on the q/k/v projections
    o_bias: bool
    qk_norm: bool  # Qwen3: RMSNorm over each head's q and k, before RoPE
    value_norm: bool  # Gemma 4: a weightless RMSNorm over each value head
    key_is_value: bool  # Gemma 4's full layers: no v_proj, the keys' projection is the value
    output_gate: bool  # Qwen3.5: q_proj also emits a gate per head, rows [query_h | gate_h]
    sinks: bool  # gpt-oss: one learned logit per query head in every softmax
    kv_int8: bool  # an int8 cache with per-channel scales (k_scale, v_scale)
    rotate_keys: bool  # ... whose keys are stored in the Hadamard basis (``hadamard``)
    eps: float  # the norms' epsilon

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim


def attention_spec(cfg: ModelConfig, layer: int, fusion: Fusion,
                   kv_int8: bool = False) -> AttentionSpec:
    """Layer ``layer``'s attention under ``fusion`` (Gemma 4's full layers: their own head size
    and KV head count; KV-shared layers never pack, having no keys to project)."""
    att = cfg.attention
    head_dim, shared = cfg.layer_head_dim(layer), cfg.is_kv_shared(layer)
    k_eq_v = cfg.layer_k_eq_v(layer)
    if kv_int8 and (fusion.plain_attention or shared):
        raise ValueError("an int8 KV cache needs GroupQueryAttention and a layer of its own keys "
                         "and values")
    rotate = kv_int8 and rotates_keys(head_dim)
    uses_rope = cfg.layer_uses_rope(layer)
    # RoPE inside the kernel unless plain ops or the int8 cache's rotated keys rule it out
    inside = fusion.rotary and uses_rope and not fusion.plain_attention and not rotate
    return AttentionSpec(
        heads=cfg.num_attention_heads, kv_heads=cfg.layer_kv_heads(layer), head_dim=head_dim,
        scale=att.attention_scale or head_dim ** -0.5, window=cfg.layer_window(layer) or -1,
        rope="inside" if inside else "outside" if uses_rope else "none",
        plain=fusion.plain_attention,
        packed_qkv=fusion.qkv and not (att.attention_output_gate or shared or k_eq_v),
        bias=att.attention_bias, o_bias=att.o_proj_bias, qk_norm=att.qk_norm,
        value_norm=att.value_norm, key_is_value=k_eq_v, output_gate=att.attention_output_gate,
        sinks=att.attention_sinks, kv_int8=kv_int8, rotate_keys=rotate, eps=cfg.rms_norm_eps)


QKV = tuple[Tensor, Tensor | None, Tensor | None]
Step = Callable[["_AttentionBase", Tensor, Tensor | None, Tensor | None, MixerInputs], QKV]


class _AttentionBase(nn.Module):
    """What both attention parts share: the query side (q_proj, Qwen3.5's gate, q_norm), the
    kernel and o_proj."""

    sinks: nn.Parameter | None

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__()
        self.spec = spec

    def add_output(self, hidden: int, dtype: torch.dtype) -> None:
        """o_proj (registered after the projections, as the checkpoints order them)."""
        self.o_proj = Linear(self.spec.q_width, hidden, self.spec.o_bias, dtype)

    def add_sinks(self, dtype: torch.dtype) -> None:
        """gpt-oss: one learned logit per query head in every softmax (None: none)."""
        self.sinks = (nn.Parameter(torch.empty(self.spec.heads, dtype=dtype), requires_grad=False)
                      if self.spec.sinks else None)

    def split_gate(self, q: Tensor) -> tuple[Tensor, Tensor | None]:
        """Qwen3.5: (B, T, H, 2D) -> query and gate, each (B, T, H*D); else (q, None)."""
        if not self.spec.output_gate:
            return q, None
        b, t, _ = q.shape
        d = self.spec.head_dim
        qg = q.reshape(b, t, self.spec.heads, 2 * d)
        return qg[..., :d].reshape(b, t, self.spec.q_width), qg[..., d:].reshape(
            b, t, self.spec.q_width)

    def kernel(self, q: Tensor, k: Tensor | None, v: Tensor | None, past_key: Tensor,
               past_value: Tensor, x: MixerInputs) -> tuple[Tensor, Tensor, Tensor]:
        """(output (B, T, H*D), present key, present value)."""
        s = self.spec
        if s.plain:
            assert k is not None and v is not None
            return ops.plain_attention(q, k, v, past_key, past_value, x.seqlens_k, x.total,
                                       x.positions, s.heads, s.kv_heads, s.scale, s.window,
                                       x.bias, self.sinks, x.attend_until)
        assert x.attend_until is None, "only plain attention lets a token see later keys"
        cos, sin = (x.cos, x.sin) if s.rope == "inside" else (None, None)
        return ops.group_query_attention(
            q, k, v, past_key, past_value, x.seqlens_k, x.total, cos, sin, s.heads, s.kv_heads,
            s.scale, s.window, False, x.bias, self.sinks, *self.cache_scales())

    def cache_scales(self) -> tuple[Tensor, ...]:
        return ()

    def output(self, out: Tensor, gate: Tensor | None) -> Tensor:
        """o_proj, after Qwen3.5's gate per channel."""
        if gate is not None:
            out = out * torch.sigmoid(gate.float()).to(out.dtype)
        return self.o_proj(out)


# ----------------------------------------------------------------------------- steps
# Between the projections and the kernel: each takes and returns (q, k, v), each (B, T, N*D).


def _qk_norm(self: _AttentionBase, q: Tensor, k: Tensor | None, v: Tensor | None,
             x: MixerInputs) -> QKV:
    """Qwen3: RMSNorm over each head of q and k (float32 statistics), back in their dtype."""
    assert k is not None
    s = self.spec
    b, t, _ = q.shape
    dtype = q.dtype
    q = self.q_norm(q.reshape(b, t, s.heads, s.head_dim)).reshape(b, t, -1)
    k = self.k_norm(k.reshape(b, t, s.kv_heads, s.head_dim)).reshape(b, t, -1)
    return q.to(dtype), k.to(dtype), v


def _value_norm(self: _AttentionBase, q: Tensor, k: Tensor | None, v: Tensor | None,
                x: MixerInputs) -> QKV:
    """Gemma 4: a weightless RMSNorm over each value head."""
    assert v is not None
    s = self.spec
    b, t, _ = v.shape
    vf = v.reshape(b, t, s.kv_heads, s.head_dim).float()
    v_normed = (vf * torch.rsqrt(vf.pow(2).mean(-1, keepdim=True) + s.eps)).reshape(b, t, -1)
    return q, k, v_normed.to(v.dtype)


def _watch(self: _AttentionBase, q: Tensor, k: Tensor | None, v: Tensor | None,
           x: MixerInputs) -> QKV:
    """The calibration's hook (``Attention.observe``): the keys before RoPE and the values,
    each (B, T, Hkv*D), as the kernel takes them (sliced from a packed q when k is None)."""
    if self.observe is not None:
        qw, kw = self.spec.q_width, self.spec.kv_width
        self.observe(*((k, v) if k is not None else (q[..., qw:qw + kw], q[..., qw + kw:])))
    return q, k, v


def _rope(self: _AttentionBase, q: Tensor, k: Tensor | None, v: Tensor | None,
          x: MixerInputs) -> QKV:
    """RoPE as its own op on q and k (RotaryEmbedding)."""
    assert k is not None and x.cos is not None and x.sin is not None
    q = ops.rotary_embedding(q, x.positions, x.cos, x.sin, self.spec.heads, False)
    k = ops.rotary_embedding(k, x.positions, x.cos, x.sin, self.spec.kv_heads, False)
    return q, k, v


def _rotate_keys(self: _AttentionBase, q: Tensor, k: Tensor | None, v: Tensor | None,
                 x: MixerInputs) -> QKV:
    """The int8 cache's basis: (B, T, N, D) @ H for q and k (H symmetric)."""
    assert k is not None
    s = self.spec
    b, t, _ = q.shape
    q = (q.reshape(b, t, s.heads, s.head_dim) @ self.key_rotation).reshape(b, t, -1)
    k = (k.reshape(b, t, s.kv_heads, s.head_dim) @ self.key_rotation).reshape(b, t, -1)
    return q, k, v


def _q_norm(self: _AttentionBase, q: Tensor, k: Tensor | None, v: Tensor | None,
            x: MixerInputs) -> QKV:
    """A KV-shared layer's q norm (its keys were normed by their own layer)."""
    b, t, _ = q.shape
    return self.q_norm(q.reshape(b, t, self.spec.heads, self.spec.head_dim)).reshape(
        b, t, -1).to(q.dtype), k, v


def _q_rope(self: _AttentionBase, q: Tensor, k: Tensor | None, v: Tensor | None,
            x: MixerInputs) -> QKV:
    """A KV-shared layer's RoPE as its own op: on q only (its keys were rotated)."""
    assert x.cos is not None and x.sin is not None
    return ops.rotary_embedding(q, x.positions, x.cos, x.sin, self.spec.heads, False), k, v


# ----------------------------------------------------------------------------- the parts


class Attention(_AttentionBase):
    """Attention over the layer's own KV cache: project q, k, v, run the spec's steps, attend
    (writing the new keys and values into the cache), o_proj."""

    def __init__(self, spec: AttentionSpec, hidden: int, dtype: torch.dtype) -> None:
        super().__init__(spec)
        s = spec
        if s.packed_qkv:  # one matmul; rows q, then k, then v (GQA's packed QKV layout)
            self.qkv_proj = Linear(hidden, s.q_width + 2 * s.kv_width, s.bias, dtype)
        else:
            self.q_proj = Linear(hidden, s.q_width * (2 if s.output_gate else 1), s.bias, dtype)
            self.k_proj = Linear(hidden, s.kv_width, s.bias, dtype)
            if not s.key_is_value:
                self.v_proj = Linear(hidden, s.kv_width, s.bias, dtype)
        self.add_output(hidden, dtype)
        if s.qk_norm:
            self.q_norm = RMSNorm(s.head_dim, s.eps)
            self.k_norm = RMSNorm(s.head_dim, s.eps)
        self.add_sinks(dtype)
        # An int8 KV cache (--kv-cache int8): GroupQueryAttention's per-channel scales, (Hkv*D,)
        # KV-head-major, float32 whatever the compute dtype, calibrated at export (calibrate.py)
        if s.kv_int8:
            self.k_scale = nn.Parameter(torch.empty(s.kv_width, dtype=torch.float32),
                                        requires_grad=False)
            self.v_scale = nn.Parameter(torch.empty(s.kv_width, dtype=torch.float32),
                                        requires_grad=False)
        # ... whose keys are stored in the Hadamard basis, where each channel mixes all of a
        # head's: queries and keys are rotated after RoPE (so RoPE runs outside the kernel).
        # Values are rotated in the weights (export/kv_rotation.py).
        if s.rotate_keys:
            self.key_rotation = nn.Parameter(torch.empty(s.head_dim, s.head_dim, dtype=dtype),
                                             requires_grad=False)
        # q, k and v apart where a step or the plain kernel needs them (a packed projection
        # sliced; else GroupQueryAttention takes the packed rows as they are)
        apart = s.qk_norm or s.rope == "outside" or s.plain or s.rotate_keys
        self.project = (_packed_apart if apart else _packed) if s.packed_qkv else \
            _key_is_value if s.key_is_value else _apart
        steps: list[Step] = []
        if s.qk_norm:
            steps.append(_qk_norm)
        if s.value_norm:
            steps.append(_value_norm)
        steps.append(_watch)
        if s.rope == "outside":
            steps.append(_rope)
        if s.rotate_keys:
            steps.append(_rotate_keys)
        self.steps = tuple(steps)
        # The calibration's hook (calibrate.py): called with each run's keys before RoPE and
        # values, each (B, T, Hkv*D), as the attention kernel takes them. None when exporting.
        self.observe: Callable[[Tensor, Tensor], None] | None = None
        # the new keys and values the last forward handed its kernel (what Gemma 4's KV-shared
        # layers reuse)
        self.new_kv: tuple[Tensor | None, Tensor | None] | None = None

    def cache_scales(self) -> tuple[Tensor, ...]:
        return (self.k_scale, self.v_scale) if self.spec.kv_int8 else ()

    def forward(self, x: Tensor, inputs: MixerInputs, past_key: Tensor, past_value: Tensor,
                reuse: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, D) -> (output (B, T, D), present key, present value)."""
        q, k, v = self.project(self, x)
        q, gate = self.split_gate(q)
        for step in self.steps:
            q, k, v = step(self, q, k, v, inputs)
        out, pk, pv = self.kernel(q, k, v, past_key, past_value, inputs)
        self.new_kv = (k, v)
        return self.output(out, gate), pk, pv


def _packed(self: Attention, x: Tensor) -> QKV:
    return self.qkv_proj(x), None, None  # (B, T, H*D + 2*Hkv*D)


def _packed_apart(self: Attention, x: Tensor) -> QKV:
    # Slices, not split(): torch.split exports as SplitToSequence, which has no CUDA kernel in
    # ONNX Runtime (the node would run on the CPU).
    qkv = self.qkv_proj(x)
    qw, kw = self.spec.q_width, self.spec.kv_width
    return qkv[..., :qw], qkv[..., qw:qw + kw], qkv[..., qw + kw:]


def _apart(self: Attention, x: Tensor) -> QKV:
    q, k = self.q_proj(x), self.k_proj(x)  # (B, T, H*D), (B, T, Hkv*D)
    return q, k, self.v_proj(x)


def _key_is_value(self: Attention, x: Tensor) -> QKV:
    q, k = self.q_proj(x), self.k_proj(x)  # Gemma 4's full layers: the key projection twice
    return q, k, k


class SharedKVAttention(_AttentionBase):
    """Gemma 4's KV-shared layers: queries only, over the cache of an earlier layer of the same
    kind (``ModelConfig.kv_source``). Its kernel takes that layer's present cache as its past
    and the new keys and values that layer handed its own kernel (``reuse``), writes them again
    at the same positions, unchanged, and attends."""

    def __init__(self, spec: AttentionSpec, hidden: int, dtype: torch.dtype) -> None:
        super().__init__(spec)
        self.q_proj = Linear(hidden, spec.q_width * (2 if spec.output_gate else 1), spec.bias,
                             dtype)
        self.add_output(hidden, dtype)
        if spec.qk_norm:
            self.q_norm = RMSNorm(spec.head_dim, spec.eps)
        self.add_sinks(dtype)
        steps: list[Step] = []
        if spec.qk_norm:
            steps.append(_q_norm)
        if spec.rope == "outside":
            steps.append(_q_rope)
        self.steps = tuple(steps)

    def forward(self, x: Tensor, inputs: MixerInputs, past_key: Tensor, past_value: Tensor,
                reuse: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``past_key``/``past_value``: the source layer's present cache; ``reuse``: its new
        keys and values."""
        assert reuse is not None
        q, gate = self.split_gate(self.q_proj(x))
        for step in self.steps:
            q, _, _ = step(self, q, None, None, inputs)
        k, v = reuse
        out, pk, pv = self.kernel(q, k, v, past_key, past_value, inputs)
        return self.output(out, gate), pk, pv


def make_attention(cfg: ModelConfig, layer: int, dtype: torch.dtype, fusion: Fusion,
                   kv_int8: bool = False) -> Attention | SharedKVAttention:
    """Layer ``layer``'s attention part."""
    spec = attention_spec(cfg, layer, fusion, kv_int8)
    part = SharedKVAttention if cfg.is_kv_shared(layer) else Attention
    return part(spec, cfg.hidden_size, dtype)

"""Gated DeltaNet linear attention (Qwen3.5, Qwen3.6, Qwen3-Next): the layer and its two custom ops.

A linear-attention layer remembers the past in a fixed-size state per row instead of a cache per
position: the causal convolution's last K - 1 inputs (``conv``, (B, K-1, C)) and the gated delta
rule's matrix per value head (``recurrent``, (B, Hv, dk, dv), float32). Both are graph inputs and
outputs, updated in place by the runtime as the KV cache is::

    x ─┬─ in_proj_qkv ── causal conv (+ conv state) ── SiLU ── q | k | v
       │                                                       │   │   │
       │                             l2norm(q), l2norm(k) ─────┘───┘   │
       ├─ in_proj_a ── g = -exp(A_log) * softplus(a + dt_bias)         │
       ├─ in_proj_b ── beta = sigmoid(b)                               │
       │                gated delta rule over (q, k, v, g, beta) + recurrent state
       └─ in_proj_z ────────────── RMSNorm(o) * w * silu(z) ── out_proj

Tokens a row does not really run (``valid_tokens``: right padding of a batched first prompt, a
row riding along in a batched decode step) leave both states as they were: their decay and beta
are zero (the recurrence keeps S as is) and the conv state is read off the row's last valid
inputs. Their outputs are garbage, which no one reads.

  llm_onnx::linear_attention -> com.microsoft.LinearAttention (update_rule gated_delta)
  llm_onnx::gated_rms_norm   -> com.microsoft.GatedRMSNorm (silu)

The convolution and the gates are plain torch (Slice, Mul, Add, Softplus, GatherElements in
the graph): cheap, and a state written by a Gather from a copy of the past is safe to update in
place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from llm_onnx.modeling.config import LinearAttentionConfig, ModelConfig
from llm_onnx.modeling.layers import Linear, MixerInputs

L2_EPS = 1e-6  # transformers' l2norm inside the kernel (not rms_norm_eps)


# ----------------------------------------------------------------------------- reference math


def gated_delta_ref(q: Tensor, k: Tensor, v: Tensor, state: Tensor, g: Tensor, beta: Tensor,
                    num_key_heads: int, num_value_heads: int, scale: float,
                    ) -> tuple[Tensor, Tensor]:
    """The gated delta rule, one token at a time, in float32.

    q, k (B, T, Hk*dk) (already L2-normalised), v (B, T, Hv*dv), state (B, Hv, dk, dv),
    g (B, T, Hv) log-decay, beta (B, T, Hv). Value head h reads key head h // (Hv / Hk). Per
    token: S <- exp(g) S; S <- S + k (beta (v - S^T k))^T; o = scale S^T q.
    Returns o (B, T, Hv*dv) in v's dtype and the new state (float32)."""
    b, t, _ = v.shape
    dk, dv = state.shape[-2], state.shape[-1]
    r = num_value_heads // num_key_heads
    qf = q.float().reshape(b, t, num_key_heads, dk).repeat_interleave(r, dim=2)  # (B, T, Hv, dk)
    kf = k.float().reshape(b, t, num_key_heads, dk).repeat_interleave(r, dim=2)
    vf = v.float().reshape(b, t, num_value_heads, dv)
    s = state.float().clone()
    out = []
    for i in range(t):
        s = s * torch.exp(g[:, i].float())[:, :, None, None]
        kv_mem = (s * kf[:, i, :, :, None]).sum(dim=-2)  # (B, Hv, dv) = S^T k
        delta = (vf[:, i] - kv_mem) * beta[:, i].float()[:, :, None]
        s = s + kf[:, i, :, :, None] * delta[:, :, None, :]
        out.append((s * qf[:, i, :, :, None]).sum(dim=-2) * scale)  # (B, Hv, dv)
    o = torch.stack(out, dim=1) if out else vf.new_zeros((b, 0, num_value_heads, dv))
    return o.reshape(b, t, num_value_heads * dv).to(v.dtype), s


def causal_conv(x: Tensor, past: Tensor, weight: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Depthwise causal convolution over time with SiLU, continuing from ``past``.

    x (B, T, C), past (B, K-1, C) float32: the row's last K-1 inputs (zeros at the start),
    weight (C, K) float32, valid (B,) int32: how many of the T tokens each row really runs.
    out[t] = silu(sum_j w[:, j] * xp[t + j]) over xp = [past | x] (B, K-1+T, C); the new state
    is the K-1 inputs before each row's first invalid token, xp[valid : valid + K-1]."""
    k = weight.shape[-1]
    xp = torch.cat([past, x.float()], dim=1)  # (B, K-1+T, C)
    # xp[:, j : j + T] written with a constant end counted from the back (K-1+T - (K-1-j)):
    # an end computed from T is host arithmetic feeding a device node, which makes ONNX Runtime
    # refuse CUDA graphs for the whole graph
    out = (xp[:, 0:1 - k] if k > 1 else xp) * weight[:, 0]
    for j in range(1, k):
        out = out + (xp[:, j:j + 1 - k] if j < k - 1 else xp[:, j:]) * weight[:, j]
    index = valid.to(torch.int64)[:, None] + torch.arange(k - 1, device=x.device, dtype=torch.int64)[None, :]
    present = xp.gather(1, index[:, :, None].expand(-1, -1, xp.shape[-1]))  # (B, K-1, C)
    return F.silu(out), present


def l2norm(x: Tensor, heads: int) -> Tensor:
    """x (B, T, H*d) normalised per head: x / sqrt(sum(x^2) + 1e-6), float32."""
    b, t, width = x.shape
    xf = x.float().reshape(b, t, heads, width // heads)
    xf = xf * torch.rsqrt((xf * xf).sum(dim=-1, keepdim=True) + L2_EPS)
    return xf.reshape(b, t, width)


def gated_rms_norm_ref(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over each group of len(weight) channels, times weight, times silu(gate); float32."""
    b, t, width = x.shape
    c = weight.shape[0]
    xf = x.float().reshape(b, t, width // c, c)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return (y.reshape(b, t, width) * F.silu(gate.float())).to(x.dtype)


# ----------------------------------------------------------------------------- custom ops


@torch.library.custom_op("llm_onnx::linear_attention", mutates_args=())
def linear_attention(q: Tensor, k: Tensor, v: Tensor, past_state: Tensor, g: Tensor, beta: Tensor,
                     num_key_heads: int, num_value_heads: int, scale: float,
                     ) -> tuple[Tensor, Tensor]:
    return gated_delta_ref(q, k, v, past_state, g, beta, num_key_heads, num_value_heads, scale)


@linear_attention.register_fake
def _(q, k, v, past_state, g, beta, num_key_heads, num_value_heads, scale):
    return torch.empty_like(v), torch.empty_like(past_state)


@torch.library.custom_op("llm_onnx::gated_rms_norm", mutates_args=())
def gated_rms_norm(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    return gated_rms_norm_ref(x, gate, weight, eps)


@gated_rms_norm.register_fake
def _(x, gate, weight, eps):
    return torch.empty_like(x)


# ----------------------------------------------------------------------------- the layer


class Conv1d(nn.Module):
    """The depthwise convolution's weight under its checkpoint name (conv1d.weight, (C, 1, K)),
    float32."""

    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel), requires_grad=False)


class GatedNorm(nn.Module):
    """``Qwen3_5RMSNormGated``: RMSNorm over each value head, times w (not 1 + w), times
    silu(z); float32 weight."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(width), requires_grad=False)
        self.eps = eps

    def forward(self, x: Tensor, gate: Tensor) -> Tensor:
        return gated_rms_norm(x, gate, self.weight, self.eps)


class GatedDeltaNet(nn.Module):
    """A linear-attention layer (transformers' ``Qwen3_5GatedDeltaNet``; Qwen3-Next's fused
    in_proj_qkvz / in_proj_ba are split into these four by the family's loader)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        la = cfg.linear_attention
        assert la is not None
        self.la: LinearAttentionConfig = la
        d = cfg.hidden_size
        self.in_proj_qkv = Linear(d, la.conv_dim, False, dtype)
        self.in_proj_z = Linear(d, la.value_dim, False, dtype)
        self.in_proj_b = Linear(d, la.num_value_heads, False, dtype)
        self.in_proj_a = Linear(d, la.num_value_heads, False, dtype)
        # float32 always: the convolution and the decay run in float32, as transformers runs them
        self.conv1d = Conv1d(la.conv_dim, la.conv_kernel)
        self.A_log = nn.Parameter(torch.empty(la.num_value_heads), requires_grad=False)
        self.dt_bias = nn.Parameter(torch.empty(la.num_value_heads), requires_grad=False)
        self.norm = GatedNorm(la.value_head_dim, cfg.rms_norm_eps)
        self.out_proj = Linear(la.value_dim, d, False, dtype)

    def forward(self, x: Tensor, inputs: MixerInputs, conv_state: Tensor,
                recurrent_state: Tensor, reuse: None = None) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, D) -> (out (B, T, D), conv state, recurrent state), advanced over the
        ``inputs.valid`` (B,) int32 tokens each row really runs."""
        la = self.la
        valid = inputs.valid
        assert valid is not None
        t = x.shape[1]
        weight = self.conv1d.weight.reshape(la.conv_dim, la.conv_kernel)
        mixed, conv = causal_conv(self.in_proj_qkv(x), conv_state, weight, valid)
        q = l2norm(mixed[..., :la.key_dim], la.num_key_heads)
        k = l2norm(mixed[..., la.key_dim:2 * la.key_dim], la.num_key_heads)
        v = mixed[..., 2 * la.key_dim:]
        # the tokens each row really runs: the others keep the state (decay 0, beta 0)
        live = (torch.arange(t, device=x.device, dtype=torch.int64)[None, :] < valid[:, None]).float()  # (B, T)
        a = self.in_proj_a(x).float()
        g = -torch.exp(self.A_log.float()) * F.softplus(a + self.dt_bias.float()) * live[..., None]
        beta = torch.sigmoid(self.in_proj_b(x).float()) * live[..., None]
        o, recurrent = linear_attention(q, k, v, recurrent_state, g, beta, la.num_key_heads,
                                        la.num_value_heads, la.key_head_dim ** -0.5)
        y = self.norm(o, self.in_proj_z(x).float())
        return self.out_proj(y.to(x.dtype)), conv, recurrent


def state_shapes(la: LinearAttentionConfig) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """Per-row shapes of a linear-attention layer's states: conv (K-1, C), recurrent (Hv, dk, dv)."""
    return ((la.conv_kernel - 1, la.conv_dim),
            (la.num_value_heads, la.key_head_dim, la.value_head_dim))

"""The feed-forward parts: the dense MLP (plain, gated, or gated with gate and up packed), the
routed experts (an fp32 router over experts stacked in ONNX Runtime's MoE layout, with or
without a shared expert), and Gemma 4's router and GeGLU experts, which its layers run beside
the dense MLP (layer.SandwichLayer's dense_plus_experts)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from llm_onnx.modeling import ops
from llm_onnx.modeling.config import ModelConfig
from llm_onnx.modeling.layers import Linear

# hidden_act (transformers' names) -> function. The tanh variants are one formula written three
# ways; BLOOM's BloomGelu is that formula too.
_ACT = {"silu": F.silu, "gelu": ops.gelu, "gelu_new": ops.fast_gelu,
        "gelu_pytorch_tanh": ops.fast_gelu, "gelu_fast": ops.fast_gelu, "relu": F.relu}


class PlainMLP(nn.Module):
    """GPT-2, BLOOM, Falcon, OPT, XGLM: down(act(up(x)))."""

    def __init__(self, d: int, width: int, act: str, bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.up_proj = Linear(d, width, bias, dtype)
        self.down_proj = Linear(width, d, bias, dtype)
        self.act = _ACT[act]

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.up_proj(x)))


class GatedMLP(nn.Module):
    """Llama's SwiGLU (Gemma's GeGLU): down(act(gate(x)) * up(x))."""

    def __init__(self, d: int, width: int, act: str, bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_proj = Linear(d, width, bias, dtype)
        self.up_proj = Linear(d, width, bias, dtype)
        self.down_proj = Linear(width, d, bias, dtype)
        self.act = _ACT[act]

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(self.act(gate) * up)


class PackedGatedMLP(nn.Module):
    """The gated MLP with gate and up as one matmul (rows gate, then up): SwiGLU as one op
    (Split, Sigmoid, Mul), another activation on the two halves sliced (not chunk(): see
    attention._packed_apart)."""

    def __init__(self, d: int, width: int, act: str, bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_up_proj = Linear(d, 2 * width, bias, dtype)
        self.down_proj = Linear(width, d, bias, dtype)
        self.act = _ACT[act]
        self.activate = _swiglu if self.act is F.silu else _sliced

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.activate(self, self.gate_up_proj(x)))


def _swiglu(self: PackedGatedMLP, gate_up: Tensor) -> Tensor:
    return ops.swiglu(gate_up)  # one Split, not a sequence


def _sliced(self: PackedGatedMLP, gate_up: Tensor) -> Tensor:
    half = gate_up.shape[-1] // 2
    gate, up = gate_up[..., :half], gate_up[..., half:]
    return self.act(gate) * up


def make_mlp(cfg: ModelConfig, dtype: torch.dtype, fuse_gate_up: bool,
             width: int | None = None) -> nn.Module:
    """The dense MLP ``cfg.mlp`` describes, ``width`` wide (default: intermediate_size)."""
    part = (PackedGatedMLP if fuse_gate_up else GatedMLP) if cfg.mlp.gated_mlp else PlainMLP
    return part(cfg.hidden_size, width or cfg.intermediate_size, cfg.hidden_act,
                cfg.mlp.mlp_bias, dtype)


class Experts(nn.Module):
    """All experts of a layer stacked in ORT's MoE layout.

    gate_up_proj (E, 2I, D) with gate and up rows interleaved (g0, u0, g1, u1, ...);
    down_proj (E, D, I). Loaders build these from Hugging Face's per-expert tensors.
    gpt-oss: biases gate_up_proj_bias (E, 2I) (interleaved too) and down_proj_bias (E, D), and
    a clamped SwiGLU (``activation``: MoEConfig's alpha, beta, limit).
    """

    def __init__(self, num_experts: int, d: int, i: int, dtype: torch.dtype, bias: bool = False,
                 activation: tuple[float, float, float | None] = (1.0, 0.0, None)) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * i, d, dtype=dtype),
                                         requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(num_experts, d, i, dtype=dtype), requires_grad=False)
        self.bias = bias
        if bias:
            self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, 2 * i, dtype=dtype),
                                                  requires_grad=False)
            self.down_proj_bias = nn.Parameter(torch.empty(num_experts, d, dtype=dtype),
                                               requires_grad=False)
        self.activation = activation

    def biases(self) -> tuple[Tensor | None, Tensor | None]:
        return (self.gate_up_proj_bias, self.down_proj_bias) if self.bias else (None, None)

    def forward(self, x: Tensor, router_logits: Tensor, k: int, normalize: bool) -> Tensor:
        """x (N, D), router_logits (N, E) -> (N, D)."""
        return ops.moe(x, router_logits, self.gate_up_proj, self.down_proj, k, normalize,
                       *self.biases(), *self.activation)


class SparseMoE(nn.Module):
    """Qwen3-MoE's routed experts: fp32 softmax router over E experts, top-k, optional
    renormalisation. gpt-oss: the router and the experts have biases, and the experts' SwiGLU
    is clamped (its softmax over the top-k logits is the renormalised top-k of the full
    softmax)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        moe = cfg.moe
        assert moe is not None
        self.top_k, self.normalize = moe.num_experts_per_tok, moe.norm_topk_prob
        self.gate = Linear(cfg.hidden_size, moe.num_experts, moe.bias, dtype)  # router
        self.experts = Experts(moe.num_experts, cfg.hidden_size, moe.moe_intermediate_size, dtype,
                               moe.bias, (moe.swiglu_alpha, moe.swiglu_beta, moe.swiglu_limit))

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        flat = x.reshape(b * t, d)  # (N, D)
        return self.route(flat).reshape(b, t, d)

    def route(self, flat: Tensor) -> Tensor:
        """(N, D) -> (N, D): the chosen experts' weighted sum."""
        logits = self.gate(flat).float()  # (N, E), router in fp32
        return self.experts(flat, logits.to(flat.dtype), self.top_k, self.normalize)


class SharedExpertMoE(SparseMoE):
    """Qwen3.5-MoE, Qwen3-Next: the routed experts plus a shared expert every token takes,
    scaled by sigmoid(shared_expert_gate(x)) and added to the routed sum."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, fuse_gate_up: bool = False) -> None:
        super().__init__(cfg, dtype)
        assert cfg.moe is not None
        self.shared_expert = make_mlp(cfg, dtype, fuse_gate_up,
                                      cfg.moe.shared_expert_intermediate_size)
        self.shared_expert_gate = Linear(cfg.hidden_size, 1, False, dtype)  # (1, D)

    def route(self, flat: Tensor) -> Tensor:
        out = super().route(flat)
        gate = torch.sigmoid(self.shared_expert_gate(flat).float())  # a (N, 1) gate per token
        return (out.float() + gate * self.shared_expert(flat).float()).to(flat.dtype)


def make_moe(cfg: ModelConfig, dtype: torch.dtype, fuse_gate_up: bool) -> SparseMoE:
    """The routed experts ``cfg.moe`` describes."""
    assert cfg.moe is not None
    if cfg.moe.shared_expert_intermediate_size is not None:
        return SharedExpertMoE(cfg, dtype, fuse_gate_up)
    return SparseMoE(cfg, dtype)


class GeGLUExperts(nn.Module):
    """Gemma 4's experts, stacked as its checkpoints store them: gate_up_proj (E, 2I, D), rows
    [gate | up], and down_proj (E, D, I); each expert is down(gelu_tanh(gate x) * up x).

    ONNX Runtime's MoE kernel (1.31, CPU) has no GeGLU and refuses a separate gate weight, so
    the chosen experts run as plain ops: their weights gathered by the top-k indices, one
    batched MatMul for gate/up and one for down. That is the traced form; run eagerly on more
    tokens than GATHER_BYTES of gathered weights allow (the export's calibration and parity
    gate on a full-size model: 512 tokens x 8 experts of 26B-A4B gather 32 GB), each chosen
    expert runs once on its own tokens instead. The weights may be held in a narrower float
    dtype than x (the calibration keeps a checkpoint's bfloat16): each use casts them to x's."""

    GATHER_BYTES = 256 << 20

    def __init__(self, num_experts: int, d: int, i: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * i, d, dtype=dtype),
                                         requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(num_experts, d, i, dtype=dtype),
                                      requires_grad=False)
        self.width = i

    def forward(self, x: Tensor, index: Tensor, weight: Tensor) -> Tensor:
        """x (N, D), index (N, K) chosen experts, weight (N, K) fp32 -> (N, D)."""
        n, k = index.shape
        if not torch.compiler.is_exporting():  # (no size test on the traced symbolic shapes)
            gathered = n * k * 3 * self.width * x.shape[-1] * self.gate_up_proj.element_size()
            if gathered > self.GATHER_BYTES:
                return self._per_expert(x, index, weight)
        flat = index.reshape(-1)  # (N*K,): one Gather per weight, no Transpose
        w1 = self.gate_up_proj.index_select(0, flat).reshape(n, k, 2 * self.width, -1)
        w1 = w1.to(x.dtype)  # (the export's calibration keeps bfloat16 weights: see below)
        h = torch.matmul(w1, x[:, None, :, None]).squeeze(-1)  # (N, K, 2I)
        act = ops.fast_gelu(h[..., :self.width]) * h[..., self.width:]  # (N, K, I)
        w2 = self.down_proj.index_select(0, flat).reshape(n, k, -1, self.width).to(x.dtype)
        y = torch.matmul(w2, act[..., None]).squeeze(-1)  # (N, K, D)
        return (y.float() * weight[..., None]).sum(1).to(x.dtype)

    def _per_expert(self, x: Tensor, index: Tensor, weight: Tensor) -> Tensor:
        """The same sum, each chosen expert on the rows that chose it (eager only)."""
        return geglu_per_expert(x, index, weight, self.width,
                                lambda e, a: a @ self.gate_up_proj[e].to(a.dtype).T,
                                lambda e, a: a @ self.down_proj[e].to(a.dtype).T)


def geglu_per_expert(x: Tensor, index: Tensor, weight: Tensor, width: int,
                     gate_up: Callable[[int, Tensor], Tensor],
                     down: Callable[[int, Tensor], Tensor]) -> Tensor:
    """x (N, D), index (N, K) chosen experts, weight (N, K) fp32 -> (N, D): each chosen expert e
    once, on the rows that chose it: down(e, gelu_tanh(gate) * up) of gate_up(e, rows) (M, 2I)
    [gate | up], weighted and summed in fp32 (GeGLUExperts eagerly; the quantized experts'
    eager op, quant.geglu_experts_nbits)."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e in torch.unique(index).tolist():
        rows, slot = (index == e).nonzero(as_tuple=True)
        h = gate_up(e, x[rows])  # (M, 2I)
        act = ops.fast_gelu(h[:, :width]) * h[:, width:]
        out.index_add_(0, rows, down(e, act).float() * weight[rows, slot, None])
    return out.to(x.dtype)


class Gemma4Router(nn.Module):
    """Gemma 4's router: logits of RMSNorm(x) * scale / sqrt(D) (a weightless norm, then a
    learned per-channel scale), softmax, top-k renormalised, each weight times its expert's
    learned ``per_expert_scale``."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        moe = cfg.moe
        assert moe is not None
        self.k, self.eps, self.d = moe.num_experts_per_tok, cfg.rms_norm_eps, cfg.hidden_size
        self.proj = Linear(cfg.hidden_size, moe.num_experts, False, dtype)
        self.scale = nn.Parameter(torch.ones(cfg.hidden_size), requires_grad=False)
        self.per_expert_scale = nn.Parameter(torch.ones(moe.num_experts), requires_grad=False)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x (N, D) fp32 residual stream -> (index (N, K), weight (N, K) fp32)."""
        h = ops.rms_norm(x, self.scale, self.eps) * self.d ** -0.5  # (N, D) fp32
        logits = self.proj(h.to(self.proj.weight.dtype)).float()  # (N, E)
        probs = torch.softmax(logits, dim=-1)
        weight, index = torch.topk(probs, self.k, dim=-1)  # (N, K)
        weight = weight / weight.sum(-1, keepdim=True)
        scale = self.per_expert_scale.index_select(0, index.reshape(-1)).reshape(index.shape)
        return index, weight * scale

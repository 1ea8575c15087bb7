"""llm-onnx's own operator for a mixture of experts' experts, RoutedExperts (llm_onnx/kernels),
as a torch custom op and its ONNX translation; modules.KernelExperts, the export form
``--kernels llm_onnx`` gives Qwen3-MoE-style experts (``Experts``) instead of ONNX Runtime's
QMoE, calls it.

The weights are QuantExperts' (QMoE's layout, written by the same code); the graph computes the
router's softmax, top-k and renormalisation itself and hands the operator the chosen ids and
weights:

    router_logits --Cast fp32--Softmax--TopK k--> weight (N, K), index (N, K)
                                     (norm_topk_prob: weight / ReduceSum(weight))
    x (N, D), index, weight, gate_up/down codes and scales --RoutedExperts--> (N, D)

The eager op is the reference the parity gate holds ONNX Runtime to: the chosen experts'
weights dequantized, float activations (the kernel quantizes them to int8 per token and block,
which the gate's int8-activation tolerances cover, as for QMoE at accuracy level 4).
"""

from __future__ import annotations

from typing import Optional

import onnxscript
import torch
from onnxscript.onnx_types import FLOAT, INT64, UINT8
from torch import Tensor

from llm_onnx.export import quant

kern = onnxscript.values.Opset("llm_onnx", 1)
_here = onnxscript.values.Opset("llm_onnx.translations", 1)

OP = "RoutedExperts"


@torch.library.custom_op("llm_onnx::routed_experts", mutates_args=())
def routed_experts(x: Tensor, index: Tensor, weight: Tensor, gate_up_q: Tensor,
                   gate_up_scales: Tensor, down_q: Tensor, down_scales: Tensor, bits: int,
                   block_size: int, activation: str, interleaved: bool,
                   gate_up_bias: Tensor | None = None, down_bias: Tensor | None = None,
                   alpha: float = 1.0, beta: float = 0.0, limit: float | None = None,
                   gate_up_zero_points: Tensor | None = None,
                   down_zero_points: Tensor | None = None) -> Tensor:
    """x (N, D), index (N, K) the chosen experts, weight (N, K) fp32 -> (N, D): each chosen
    expert once, on the rows that chose it, its output weighted and summed in fp32. Codes
    (E, rows, K * bits / 8), scales (E, rows, K / block), zero points as quant.qmoe's."""
    from llm_onnx.modeling.ops import fast_gelu, swiglu_ref

    def deq(q: Tensor, s: Tensor, zp: Tensor | None, e: int) -> Tensor:
        rows = q.shape[1]
        return quant.dequantize(q[e].reshape(rows, s.shape[-1], -1), s[e], bits,
                                s.shape[-1] * block_size, None if zp is None else zp[e])

    width = gate_up_q.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e in torch.unique(index).tolist():
        rows, slot = (index == e).nonzero(as_tuple=True)
        h = x[rows].float() @ deq(gate_up_q, gate_up_scales, gate_up_zero_points, e).t()
        if gate_up_bias is not None:
            h = h + gate_up_bias[e].float()
        gate, up = (h[:, 0::2], h[:, 1::2]) if interleaved else (h[:, :width], h[:, width:])
        act = fast_gelu(gate) * up if activation == "geglu" else \
            swiglu_ref(gate, up, alpha, beta, limit)
        y = act @ deq(down_q, down_scales, down_zero_points, e).t()
        if down_bias is not None:
            y = y + down_bias[e].float()
        out.index_add_(0, rows, y * weight[rows, slot, None].float())
    return out.to(x.dtype)


@routed_experts.register_fake
def _(x, index, weight, *args, **kwargs):
    return torch.empty_like(x)


@onnxscript.script(opset=_here)
def routed_experts_node(x: FLOAT, index: INT64, weight: FLOAT, gate_up_q: UINT8,
                        gate_up_scales: FLOAT, down_q: UINT8, down_scales: FLOAT,
                        gate_up_bias: Optional[FLOAT], down_bias: Optional[FLOAT],
                        gate_up_zero_points: Optional[UINT8], down_zero_points: Optional[UINT8],
                        bits: int, block_size: int, activation: str, gate_up_layout: str,
                        alpha: float, beta: float, limit: float) -> FLOAT:
    return kern.RoutedExperts(x, index, weight, gate_up_q, gate_up_scales, down_q, down_scales,
                              gate_up_bias, down_bias, gate_up_zero_points, down_zero_points,
                              bits=bits, block_size=block_size, activation=activation,
                              gate_up_layout=gate_up_layout, alpha=alpha, beta=beta, limit=limit)


def translate(x, index, weight, gate_up_q, gate_up_scales, down_q, down_scales, bits: int,
              block_size: int, activation: str, interleaved: bool, gate_up_bias=None,
              down_bias=None, alpha: float = 1.0, beta: float = 0.0, limit: float | None = None,
              gate_up_zero_points=None, down_zero_points=None):
    """routed_experts' ONNX form (traced: the Python arguments pick the attributes)."""
    return routed_experts_node(x, index, weight, gate_up_q, gate_up_scales, down_q, down_scales,
                               gate_up_bias, down_bias, gate_up_zero_points, down_zero_points,
                               bits=bits, block_size=block_size, activation=activation,
                               gate_up_layout="interleaved" if interleaved else "halves",
                               alpha=alpha, beta=beta,
                               limit=float("inf") if limit is None else limit)


def translations() -> dict:
    return {torch.ops.llm_onnx.routed_experts.default: translate}


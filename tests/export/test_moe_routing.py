"""Mixtures of experts whose top-k router weights are not renormalised (``norm_topk_prob: false``,
as in Qwen1.5-MoE, Qwen2-MoE and OLMoE) on ONNX Runtime.

ONNX Runtime 1.31.1's CPU kernels get ``normalize_routing_weights=0`` wrong (custom_ops.py says
how), so the export always renormalises and scales the output back by the top-k probability
mass. A lone MoE node fed from a graph input hid the first of those bugs: the kernel misreads its
input only when it runs in place, which the planner arranges when the input is a value no later
node reads. The op test below exports the translation over such a value.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from tests.tolerances import OP_FP32


class MoEBlock(torch.nn.Module):
    """x (N, D) -> x + moe(2x): the doubled x is read by the router and the experts only, so
    ONNX Runtime may give the MoE node's output that value's buffer, as in the decoder's graphs
    (where the normed hidden states are that value)."""

    def __init__(self, k: int, normalize: bool, bits: int | None) -> None:
        super().__init__()
        from llm_onnx.export import quant

        e, d, i = 4, 64, 32
        g = torch.Generator().manual_seed(0)
        self.k, self.normalize, self.bits, self.block = k, normalize, bits, 32
        self.gate = torch.nn.Parameter(0.3 * torch.randn(e, d, generator=g), requires_grad=False)
        fc1 = 0.1 * torch.randn(e, 2 * i, d, generator=g)
        fc2 = 0.1 * torch.randn(e, d, i, generator=g)
        if bits is None:
            self.fc1 = torch.nn.Parameter(fc1, requires_grad=False)
            self.fc2 = torch.nn.Parameter(fc2, requires_grad=False)
            return
        for name, w in (("fc1", fc1), ("fc2", fc2)):
            parts = [quant.quantize(w[j], bits, self.block)[:2] for j in range(e)]
            self.register_buffer(f"{name}_q", torch.stack(
                [q.reshape(q.shape[0], -1) for q, _ in parts]))
            self.register_buffer(f"{name}_scales", torch.stack([s for _, s in parts]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from llm_onnx.export import quant
        from llm_onnx.model import ops

        h = x * 2.0
        logits = h @ self.gate.t()  # (N, E)
        if self.bits is None:
            y = ops.moe(h, logits, self.fc1, self.fc2, self.k, self.normalize)
        else:
            y = quant.qmoe(h, logits, self.fc1_q, self.fc1_scales, self.fc2_q, self.fc2_scales,
                           self.k, self.normalize, self.bits, self.block)
        return x + y


def _run_exported(block: MoEBlock, x: torch.Tensor) -> np.ndarray:
    from llm_onnx.export.custom_ops import translation_table

    program = torch.onnx.export(block, (x,), dynamo=True, optimize=False, verbose=False,
                                dynamic_shapes=({0: torch.export.Dim("n")},),
                                custom_translation_table=translation_table(True))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(program.model_proto.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


@pytest.mark.parametrize("bits", [None, 4], ids=["MoE", "QMoE-int4"])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("normalize", [False, True], ids=["unrenormalized", "renormalized"])
def test_moe_translation_matches_its_reference_in_place(normalize, k, bits):
    """Rung 3 for the MoE translations where the kernel may run in place: ONNX Runtime's output
    equals the eager op (ops.moe_ref, on the dequantized weights for QMoE), and the routing
    weights' form matters (the other flag's reference is far)."""
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(1))
    block = MoEBlock(k, normalize, bits).eval()
    got = _run_exported(block, x)
    with torch.no_grad():
        want = block(x).numpy()
        block.normalize = not normalize
        other = block(x).numpy()
    assert np.abs(want - x.numpy()).max() > 0.1  # the experts add something
    assert np.abs(got - want).max() <= OP_FP32
    assert np.abs(got - other).max() > 100 * OP_FP32

"""Gemma 4's experts in the CPU graphs (RoutedGeGLUExperts: an If per expert, only the chosen
ones run) against the formula written out per token on the same block-quantized weights, in ONNX
Runtime: prefill rows, one decode row, an expert no row chose, experts chosen by one row."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from llm_onnx.export import quant
from llm_onnx.export.custom_ops import translation_table
from llm_onnx.export.modules import RoutedGeGLUExperts
from llm_onnx.modeling.mlp import GeGLUExperts
from tests.model.test_geglu_experts import _reference

E, D, I, K = 6, 64, 32, 2  # noqa: E741 (I: the experts' intermediate size, a shape letter)


@pytest.fixture(scope="module", params=[4, 8], ids=["int4", "int8"])
def routed(request, tmp_path_factory):
    """(bits, float experts holding the dequantized weights, an ORT session of the routed form)."""
    bits = request.param
    torch.manual_seed(bits)
    experts = GeGLUExperts(E, D, I, torch.float32)
    torch.nn.init.normal_(experts.gate_up_proj, std=0.3)
    torch.nn.init.normal_(experts.down_proj, std=0.3)
    module = RoutedGeGLUExperts(experts, bits, 32, 16, accuracy_level=0)
    for e in range(E):
        for part, w, block in (("gate_up", experts.gate_up_proj[e], 32),
                               ("down", experts.down_proj[e], 16)):
            q, s, _ = quant.quantize(w, bits, block)
            target = getattr(module, part)[e]
            target.qweight.copy_(q.reshape(target.qweight.shape))
            target.scales.copy_(s.reshape(target.scales.shape))
            deq = quant.dequantize(target.qweight, target.scales, bits, w.shape[1])
            getattr(experts, f"{part}_proj").data[e] = deq
    n = torch.export.Dim("n")
    x, index, weight = torch.randn(5, D), torch.zeros(5, K, dtype=torch.int64), torch.rand(5, K)
    program = torch.onnx.export(module.eval(), (x, index, weight), dynamo=True, optimize=False,
                                dynamic_shapes=({0: n}, {0: n}, {0: n}),
                                custom_translation_table=translation_table())
    path = tmp_path_factory.mktemp(f"routed{bits}") / "experts.onnx"
    program.save(str(path))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2  # (the CPU's default here; races show only with threads)
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return bits, experts, module, session


def _run(session, x, index, weight):
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, (x.numpy(), index.numpy(), weight.numpy()))))[0]


@pytest.mark.parametrize("rows", [40, 1, 3])
def test_chosen_experts_only_match_the_formula(routed, rows):
    bits, experts, module, session = routed
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, D, generator=g)
    # expert E-1 is never chosen; with 1 or 3 rows most experts are not
    index = torch.stack([torch.randperm(E - 1, generator=g)[:K] for _ in range(rows)])
    weight = torch.rand(rows, K, generator=g)
    want = _reference(experts, x, index, weight)
    got = _run(session, x, index, weight)
    assert got.shape == (rows, D)
    for _ in range(3):  # the same every run
        assert np.array_equal(_run(session, x, index, weight), got)
    assert np.allclose(got, want.numpy(), atol=2e-4), np.abs(got - want.numpy()).max()
    with torch.no_grad():
        eager = module(x, index, weight)  # the custom op's eager reference, the parity gate's
    assert torch.allclose(eager.double(), want, atol=2e-4), (eager.double() - want).abs().max()
    # The check can fail: without the second chosen expert the sum is far off.
    drop = _reference(experts, x, index[:, :1], weight[:, :1]).numpy()
    assert not np.allclose(got, drop, atol=1e-2)

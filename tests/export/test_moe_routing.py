"""Mixtures of experts whose top-k router weights are not renormalised (``norm_topk_prob: false``,
as in Qwen1.5-MoE, Qwen2-MoE and OLMoE) on ONNX Runtime.

ONNX Runtime 1.31.1's CPU kernels get ``normalize_routing_weights=0`` wrong (custom_ops.py says
how), so the export always renormalises and scales the output back by the top-k probability
mass. A lone MoE node fed from a graph input hid the first of those bugs: the kernel misreads its
input only when it runs in place, which the planner arranges when the input is a value no later
node reads. The op test below exports the translations over such a value; the others compare a
whole exported model with transformers (fp32), and with torch running the dequantized weights
(int4 with fp32 activations: rung 4 of the ladder).
"""

from __future__ import annotations

import contextlib

import numpy as np
import onnxruntime as ort
import pytest
import torch

from llm_onnx.export import ExportOptions
from llm_onnx.families import get_config
from llm_onnx.modeling.config import MoEConfig
from tests.export.test_export import (
    PROMPT_LENS,
    STEPS,
    clearly_routed_rows,
    rows_for,
    torch_logits,
    torch_reference,
)
from tests.ort_helpers import Graphs, batch_logits, hf_logits
from tests.tolerances import OP_FP32, ORT_FP32, ORT_QUANT

UNRENORMALIZED = get_config("qwen3_moe_tiny").replace(moe=MoEConfig(
    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=False))
EXACT_INT4 = {"accuracy_level": 0, "experts_accuracy_level": 0,  # fp32 activations,
              "embedding_bits": None}  # a float LM head


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
        from llm_onnx.modeling import ops

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
                                custom_translation_table=translation_table())
    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(program.model_proto.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]


@pytest.mark.parametrize("bits", [None, 4], ids=["MoE", "QMoE-int4"])
@pytest.mark.parametrize("normalize", [False, True], ids=["unrenormalized", "renormalized"])
def test_moe_translation_matches_its_reference_in_place(normalize, bits):
    """Rung 3 for the MoE translations where the kernel may run in place: ONNX Runtime's output
    equals the eager op (ops.moe_ref, on the dequantized weights for QMoE), and the routing
    weights' form matters (the other flag's reference is far)."""
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(1))
    block = MoEBlock(2, normalize, bits).eval()
    got = _run_exported(block, x)
    with torch.no_grad():
        want = block(x).numpy()
        block.normalize = not normalize
        other = block(x).numpy()
    assert np.abs(want - x.numpy()).max() > 0.1  # the experts add something
    assert np.abs(got - want).max() <= OP_FP32
    assert np.abs(got - other).max() > 100 * OP_FP32


@pytest.fixture(scope="module")
def unrenormalized(tmp_path_factory):
    """(transformers model, checkpoint folder) of the tiny Qwen3-MoE without renormalisation."""
    from tests.hf_models import save_hf_checkpoint

    folder = tmp_path_factory.mktemp("hf_moe_unrenormalized")
    hf = save_hf_checkpoint(UNRENORMALIZED, folder, seed=7, tokenizer=True)
    assert hf.config.norm_topk_prob is False
    return hf, folder


@pytest.fixture(scope="module")
def export_unrenormalized(unrenormalized, tmp_path_factory):
    from llm_onnx.checkpoints import open_checkpoint
    from llm_onnx.export import export_model

    def get(precision: str, **options):
        out = tmp_path_factory.mktemp("exports") / f"moe-unrenormalized-{precision}"
        return export_model(open_checkpoint(unrenormalized[1]), out,
                            ExportOptions(precision=precision, max_seq_len=64, **options),
                            progress=False)

    return get


@contextlib.contextmanager
def renormalizing(hf):
    """transformers' model with its routers renormalising the top-k weights (Qwen3-MoE's way)."""
    gates = [layer.mlp.gate for layer in hf.model.layers]
    for gate in gates:
        gate.norm_topk_prob = True
    try:
        yield hf
    finally:
        for gate in gates:
            gate.norm_topk_prob = False


def test_unrenormalized_router_matches_transformers(unrenormalized, export_unrenormalized):
    """fp32: a right-padded batch through prefill.onnx and decode.onnx against transformers (the
    same model with renormalising routers is outside the tolerance); greedy tokens through the
    runtime (cache bound in place) equal transformers'."""
    from llm_onnx.runtime import Model
    from tests.runtime.test_runtime_models import hf_greedy_run

    hf = unrenormalized[0]
    folder = export_unrenormalized("fp32")
    rows = rows_for("qwen3_moe_tiny")
    got = batch_logits(Graphs(folder), rows, PROMPT_LENS, STEPS)
    want = hf_logits(hf, rows, PROMPT_LENS, STEPS)
    assert max(np.abs(g - w).max() for g, w in zip(got, want)) <= ORT_FP32
    with renormalizing(hf) as hf_renormalized:
        other = hf_logits(hf_renormalized, rows, PROMPT_LENS, STEPS)
    assert max(np.abs(g - o).max() for g, o in zip(got, other)) > ORT_FP32
    model = Model.load(folder, provider="cpu")
    prompts = [row[:n] for row, n in zip(rows, PROMPT_LENS)]
    for prompt, result in zip(prompts, model.generate(prompts, max_new_tokens=8, temperature=0)):
        tokens, reason = hf_greedy_run(hf, prompt, 8, model.eos_token_ids)
        assert (result.token_ids, result.finish_reason) == (tokens, reason)


def test_unrenormalized_router_int4_matches_torch_with_dequantized_weights(export_unrenormalized):
    """Rung 4 at int4 with fp32 activations (QMoE): ONNX Runtime computes the dequantized math,
    up to each row's first near-tie in the routing (as test_export's quantized rung); the same
    reference with renormalising routers is outside the tolerance."""
    from llm_onnx.modeling.mlp import SparseMoE

    folder = export_unrenormalized("int4", **EXACT_INT4)
    reference = torch_reference(folder, UNRENORMALIZED,
                                ExportOptions(precision="int4", max_seq_len=64, **EXACT_INT4))
    rows, clear = clearly_routed_rows(reference, "qwen3_moe_tiny",
                                      UNRENORMALIZED.moe.num_experts_per_tok)
    got = batch_logits(Graphs(folder), rows, PROMPT_LENS, STEPS)
    want = torch_logits(reference, rows)
    kept = [(i, s) for i in range(len(rows)) for s in range(STEPS + 1)
            if PROMPT_LENS[i] - 1 + s < clear[i]]
    assert max(np.abs(got[s][i] - want[s][i]).max() for i, s in kept) <= ORT_QUANT
    for module in reference.modules():
        if isinstance(module, SparseMoE):
            module.normalize = True
    other = torch_logits(reference, rows)
    assert max(np.abs(got[s][i] - other[s][i]).max() for i, s in kept) > ORT_QUANT

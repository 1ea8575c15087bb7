"""Graphs built for CUDA keep host values out of device math, so ONNX Runtime can capture them as
CUDA graphs (checked on the CPU; the capture itself ran on an H100, docs/gpu-report.md).

ONNX Runtime's CUDA provider runs shape arithmetic on the host (Shape's output and what is
computed from it, and GroupQueryAttention's total_sequence_length input) and refuses CUDA graphs
when such a host value reaches an ordinary device input: it would need a host-to-device copy
(a Memcpy node), which a captured graph would also freeze. Host values may feed only the inputs
that CUDA kernels read on the host (Reshape's shape, Range's limits, Slice's indices, ...).
``host_values_in_device_math`` models that rule over an ONNX graph."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from llm_onnx.export import ExportOptions
from llm_onnx.export.plan import ExportPlan
from llm_onnx.export.progress import Progress
from llm_onnx.families import get_config
from tests.conftest import FAMILY_ARCHS, TINY_ARCHS

# Inputs that ONNX Runtime's CUDA kernels read from host memory (OrtMemTypeCPUInput).
HOST_INPUTS = {"Reshape": {1}, "Squeeze": {1}, "Unsqueeze": {1}, "Slice": {1, 2, 3, 4},
               "Range": {0, 1, 2}, "Expand": {1}, "ConstantOfShape": {0}, "Tile": {1},
               "GroupQueryAttention": {6}}
HOST_GRAPH_INPUTS = {"total_sequence_length"}


def host_values_in_device_math(model: onnx.ModelProto) -> list[str]:
    """Nodes that would mix host and device values on their data inputs, and graph outputs
    computed on the host."""
    graph = model.graph
    where = {x.name: "host" if x.name in HOST_GRAPH_INPUTS else "device" for x in graph.input}
    where.update({x.name: "const" for x in graph.initializer})
    problems = []
    cast_like: set[str] = set()
    for node in graph.node:  # topological order
        if node.op_type in ("Shape", "Size"):
            where.update({o: "host" for o in node.output})
            continue
        data = {where.get(x, "const") for i, x in enumerate(node.input)
                if x and i not in HOST_INPUTS.get(node.op_type, ())}
        if {"host", "device"} <= data:
            problems.append(f"{node.op_type} {node.name}")
        # A host-read input computed by a CastLike: ONNX Runtime neither folds CastLike nor
        # keeps it on the CPU, so the value is made on the device and copied back (a Memcpy
        # node, seen on an H200 as CastLike(constant) -> Range in the Qwen3.5 graphs; torch
        # writes it for an arange without a dtype).
        problems += [f"{node.op_type} {node.name} reads a CastLike on the host"
                     for i, x in enumerate(node.input)
                     if x and i in HOST_INPUTS.get(node.op_type, ()) and x in cast_like]
        if node.op_type == "CastLike":
            cast_like.update(node.output)
        # Range has a CUDA kernel that reads its limits on the host and writes to the device.
        place = "device" if "device" in data or node.op_type == "Range" else \
            "host" if "host" in data else "const"
        where.update({o: place for o in node.output})
    problems += [f"output {o.name}" for o in graph.output if where.get(o.name) == "host"]
    return problems


def _graphs(arch: str) -> dict[str, onnx.ModelProto]:
    from dataclasses import replace

    cfg = get_config(arch)
    if cfg.moe is not None:  # QMoE on CUDA needs expert widths in multiples of 64
        cfg = cfg.replace(moe=replace(cfg.moe, moe_intermediate_size=64))
    precision = "int4" if cfg.moe is not None else "fp16"
    plan = ExportPlan.build(cfg, ExportOptions(precision=precision, target="cuda"), 64)
    out = {}
    for kind, model in plan.trace(Progress(enabled=False)).items():
        model.graph.initializers.clear()  # meta tensors: the structure is what is checked
        out[kind] = ir.serde.serialize_model(model)
    return out


# One family per way of computing positions: RoPE fused into attention (llama), RoPE after a
# QK-norm (qwen3), experts (qwen3_moe), learned (gpt2), sinusoidal (xglm), local and global RoPE
# tables (gemma3), partial rotary (phi3); and the 2026 families: linear attention with its conv
# and recurrent states (qwen3_5), sinks (gpt_oss), shared-KV layers (gemma4). ALiBi is refused
# for CUDA.
CUDA_ARCHS = [a for a in TINY_ARCHS + FAMILY_ARCHS
              if a.split("_tiny")[0] in ("llama", "qwen3", "qwen3_moe", "gpt2", "xglm", "gemma3",
                                         "phi3", "qwen3_5", "gpt_oss", "gemma4")]


@pytest.mark.parametrize("arch", CUDA_ARCHS)
def test_no_host_value_reaches_device_math(arch):
    for kind, model in _graphs(arch).items():
        assert host_values_in_device_math(model) == [], kind


def test_the_rule_flags_the_old_last_token_index():
    """What the graphs computed before: the last token's index as seqlens_k - total + T, with T
    from Shape(input_ids) and total from the host input. The check must flag it."""
    nodes = [
        helper.make_node("Shape", ["input_ids"], ["shape"], start=1, end=2),
        helper.make_node("Cast", ["total_sequence_length"], ["total64"], to=TensorProto.INT64),
        helper.make_node("Sub", ["shape", "total64"], ["t_minus_total"]),
        helper.make_node("Cast", ["seqlens_k"], ["lengths"], to=TensorProto.INT64),
        helper.make_node("Add", ["lengths", "t_minus_total"], ["last"]),
    ]
    graph = helper.make_graph(
        nodes, "old",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "t"]),
         helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["b"]),
         helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])],
        [helper.make_tensor_value_info("last", TensorProto.INT64, ["b"])])
    assert host_values_in_device_math(helper.make_model(graph)) == ["Add "]

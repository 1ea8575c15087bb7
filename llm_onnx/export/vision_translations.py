"""ONNX translations of the vision tower's custom ops and of the image inputs' scatters
(llm_onnx/modeling/vision_ops.py): one ONNX Runtime kernel each, with the eager op's contract."""

from __future__ import annotations

import onnxscript
import torch
from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.tensor_typing import TFloat
from onnxscript.onnx_types import INT64

from llm_onnx.modeling import vision_ops  # noqa: F401  (registers its torch.ops.llm_onnx.*)

msft = onnxscript.values.Opset("com.microsoft", 1)
_here = onnxscript.values.Opset("llm_onnx.translations", 1)


@onnxscript.script(opset=_here)
def full_attention(query: TFloat, key: TFloat, value: TFloat, num_heads: int,
                   scale: float) -> TFloat:
    return msft.MultiHeadAttention(query, key, value, num_heads=num_heads, scale=scale)


@onnxscript.script(opset=_here)
def scatter_rows_set(x: TFloat, index: INT64, rows: TFloat) -> TFloat:
    """x (B, T, D) --Reshape (B*T, D)--> ScatterND(rows at index) --Reshape--> (B, T, D)."""
    flat = op.Reshape(x, op.Concat(op.Constant(value_ints=[-1]), op.Shape(x, start=2), axis=0))
    out = op.ScatterND(flat, op.Unsqueeze(index, op.Constant(value_ints=[1])),
                       op.CastLike(rows, x))
    return op.Reshape(out, op.Shape(x))


@onnxscript.script(opset=_here)
def scatter_rows_add(x: TFloat, index: INT64, rows: TFloat) -> TFloat:
    """As scatter_rows_set, the rows added (ScatterND reduction="add")."""
    flat = op.Reshape(x, op.Concat(op.Constant(value_ints=[-1]), op.Shape(x, start=2), axis=0))
    out = op.ScatterND(flat, op.Unsqueeze(index, op.Constant(value_ints=[1])),
                       op.CastLike(rows, x), reduction="add")
    return op.Reshape(out, op.Shape(x))


def scatter_rows(x, index, rows, add: bool):
    """vision_ops.scatter_rows: one ScatterND (traced: ``add`` picks the reduction)."""
    return scatter_rows_add(x, index, rows) if add else scatter_rows_set(x, index, rows)


def vision_translations() -> dict:
    t = torch.ops.llm_onnx
    return {t.full_attention.default: full_attention, t.scatter_rows.default: scatter_rows}


__all__ = ["vision_translations"]

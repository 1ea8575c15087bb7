"""plain_attention's ``attend_until`` (Gemma's images: an image's tokens see each other both
ways during prefill) through its ONNX translation: ONNX Runtime equals the torch op, with and
without a window, and the tokens of an image do see the later ones."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

from llm_onnx.export.custom_ops import translation_table
from llm_onnx.modeling import ops
from llm_onnx.modeling.multimodal import image_attend_until
from tests.tolerances import OP_FP32

H, HKV, D, P = 4, 2, 8, 16  # query heads, KV heads, head size, cache length


class Prefill(nn.Module):
    def __init__(self, window: int) -> None:
        super().__init__()
        self.window = window

    def forward(self, q, k, v, past_key, past_value, seqlens_k, total, positions, until):
        return ops.plain_attention(q, k, v, past_key, past_value, seqlens_k, total, positions,
                                   H, HKV, D ** -0.5, self.window, None, None, until)


@pytest.mark.parametrize("window", [-1, 3])
def test_attend_until_runs_in_onnx_runtime_as_in_torch(tmp_path, window):
    g = torch.Generator().manual_seed(window + 2)
    t = 9
    is_image = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 1, 1]]).bool()
    positions = torch.arange(t)[None]
    until = image_attend_until(is_image, positions)
    args = (torch.randn(1, t, H * D, generator=g), torch.randn(1, t, HKV * D, generator=g),
            torch.randn(1, t, HKV * D, generator=g), torch.zeros(1, HKV, P, D),
            torch.zeros(1, HKV, P, D), torch.tensor([t - 1], dtype=torch.int32),
            torch.tensor(t, dtype=torch.int32), positions, until)
    module = Prefill(window).eval()
    program = torch.onnx.export(module, args, dynamo=True, optimize=False,
                                custom_translation_table=translation_table())
    path = tmp_path / "attention.onnx"
    program.save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    got = session.run(None, {n: a.numpy() for n, a in zip(names, args)})
    with torch.no_grad():
        want = module(*args)
        causal = ops.plain_attention(*args[:8], H, HKV, D ** -0.5, window)[0]
    for w, o in zip(want, got):
        assert np.abs(w.numpy() - o).max() <= OP_FP32
    # the first image's tokens see its later ones; the text before it does not
    diff = (want[0] - causal).abs().amax(-1)[0]
    assert (diff[2:5] > 1e-3).all() and (diff[:2] == 0).all() and (diff[5:7] == 0).all()

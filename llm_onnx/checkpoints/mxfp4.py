"""MXFP4 experts (gpt-oss's released checkpoints), decoded exactly and one expert at a time.

OpenAI ships each layer's experts as OCP microscaling FP4 (``quantization_config.quant_method``
"mxfp4"): ``mlp.experts.gate_up_proj_blocks`` (E, 2I, D/32, 16) and ``down_proj_blocks``
(E, D, I/32, 16) uint8, two e2m1 codes a byte (the low nibble first: byte j of a block holds
values 2j and 2j + 1), and ``*_scales`` (E, rows, K/32) uint8, an e8m0 exponent per 32 values
(2^(s - 127); 255 is NaN in the OCP spec). Rows are output channels ((out, in), as a Linear
stores them); gate_up's rows interleave gate and up (g0, u0, g1, u1, ...), which is ONNX Runtime's
fused SwiGLU layout too.

``MXFP4Source`` presents such a checkpoint as transformers' float model holds it: one virtual
tensor ``mlp.experts.gate_up_proj`` (E, D, 2I) and ``down_proj`` (E, I, D) ((in, out), the
transpose of the stored rows), whose ``get`` returns an ``MXFP4Experts``: indexing it with an
expert decodes that expert alone (float32, exact: every e2m1 value times a power of two is a
float32), so a layer's experts never exist decoded at once.
"""

from __future__ import annotations

import numpy as np
import torch

from llm_onnx.checkpoints.sources import TensorSource
from llm_onnx.errors import CheckpointError
from llm_onnx.modeling.shapes import Shape

# e2m1 codes 0-15: sign bit 3, exponent bits 2-1, mantissa bit 0 (OCP MX v1.0, table 5)
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)
# e8m0 exponents 0-254 as float32 powers of two (2^-127 is a float32 subnormal, exact); 255: NaN
E8M0_VALUES = np.append(np.ldexp(1.0, np.arange(255) - 127).astype(np.float32), np.float32("nan"))

BLOCKS, SCALES = "_blocks", "_scales"


def decode_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(..., G, 16) uint8 blocks and (..., G) uint8 scales -> (..., G * 32) float32."""
    codes = torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).flatten(-2).long()  # (..., G, 32)
    values = torch.from_numpy(E2M1_VALUES)[codes]
    factor = torch.from_numpy(E8M0_VALUES)[scales.long()]
    return (values * factor[..., None]).flatten(-2)


class MXFP4Experts:
    """A layer's MXFP4 experts as the (E, K, N) float tensor transformers holds: ``[e]`` decodes
    expert e alone, (K, N) float32 (a transposed view of its (N, K) rows)."""

    def __init__(self, blocks: torch.Tensor, scales: torch.Tensor) -> None:
        self.blocks, self.scales = blocks, scales  # (E, N, G, 16), (E, N, G)
        e, n, g, _ = blocks.shape
        self.shape = (e, g * 32, n)
        self._last: tuple[int, torch.Tensor] | None = None  # gate and up read one expert twice

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, e: int) -> torch.Tensor:
        if self._last is None or self._last[0] != e:
            self._last = (e, decode_mxfp4(self.blocks[e], self.scales[e]).t())
        return self._last[1]


class MXFP4Source:
    """A checkpoint whose ``X_blocks`` / ``X_scales`` pairs are read as one float tensor ``X``
    (see the module docstring); every other tensor passes through."""

    def __init__(self, inner: TensorSource) -> None:
        self.inner = inner
        names = inner.names()
        present = set(names)
        self._pairs: dict[str, tuple[str, str]] = {}
        for name in names:
            if not name.endswith(BLOCKS):
                continue
            base = name[: -len(BLOCKS)]
            scales = base + SCALES
            if scales not in present:
                raise CheckpointError(f"{inner.describe(name)}: tensor {name} (MXFP4 codes) has "
                                      f"no {scales} beside it.")
            blocks_shape, scales_shape = tuple(inner.shape(name)), tuple(inner.shape(scales))
            if len(blocks_shape) != 4 or blocks_shape[-1] != 16 \
                    or blocks_shape[:-1] != scales_shape:
                raise CheckpointError(
                    f"{inner.describe(name)}: MXFP4 tensor {name} has shape {list(blocks_shape)} "
                    f"and {scales} {list(scales_shape)}; expected (experts, rows, blocks, 16) and "
                    "(experts, rows, blocks).")
            self._pairs[base] = (name, scales)
        used = {n for pair in self._pairs.values() for n in pair}
        self._names = [n for n in names if n not in used] + list(self._pairs)

    def names(self) -> list[str]:
        return list(self._names)

    def shape(self, name: str) -> Shape:
        pair = self._pairs.get(name)
        if pair is None:
            return self.inner.shape(name)
        e, n, g, _ = self.inner.shape(pair[0])
        return (e, g * 32, n)

    def get(self, name: str):  # torch.Tensor, or MXFP4Experts for an MXFP4 pair
        pair = self._pairs.get(name)
        if pair is None:
            return self.inner.get(name)
        blocks, scales = (self.inner.get(n) for n in pair)
        for n, t in zip(pair, (blocks, scales)):
            if t.dtype != torch.uint8:
                raise CheckpointError(f"{self.inner.describe(n)}: MXFP4 tensor {n} has dtype "
                                      f"{t.dtype}, expected uint8.")
        return MXFP4Experts(blocks, scales)

    def describe(self, name: str) -> str:
        pair = self._pairs.get(name)
        return self.inner.describe(pair[0] if pair else name)


def has_mxfp4(source: TensorSource) -> bool:
    return any(n.endswith(BLOCKS) for n in source.names())


def reads_mxfp4(source: object) -> bool:
    """Whether ``source`` (through the wrappers around it: a family's renaming view, the parity
    gate's cut-down view) reads MXFP4 experts."""
    seen = 0
    while source is not None and seen < 8:
        if isinstance(source, MXFP4Source):
            return True
        source = getattr(source, "inner", None) or getattr(source, "source", None)
        seen += 1
    return False

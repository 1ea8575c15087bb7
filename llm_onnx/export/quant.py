"""Block-wise weight quantization (int8, int4), its reference math and its custom ops.

Layout is ONNX Runtime's MatMulNBits: a weight W (N, K) in Hugging Face's (out, in) layout is cut
into blocks of ``block_size`` along K; each block has one scale and is stored as ``bits``-bit
unsigned codes, packed little-nibble-first for 4 bits:

    qweight (N, ceil(K / block), block * bits / 8) uint8,  scales (N, ceil(K / block))
    W[n, k] ~= (code[n, k] - zero_point[n, k // block]) * scale[n, k // block]

Three schemes (ExportOptions.quant_scheme), each exported with what it needs:
  symmetric   no zero-point tensor: ORT's default zero point 2^(bits-1)   (``quantize``)
  zero_point  an integer zero point per block, packed like the codes, so one-sided blocks keep
              the whole code range                                       (``quantize(asymmetric)``)
  offset      zero points 0 plus a float minimum per block added by a second small term,
              W ~= code * scale + minimum (llama.cpp's Q4_1: exact for such GGUF weights)
                                                                         (``quantize_offset``)

The custom ops, exported-only (a built torch model never holds them):
  llm_onnx::matmul_nbits         -> com.microsoft.MatMulNBits
  llm_onnx::matmul_nbits_offset  -> MatMulNBits + MatMul(MatMul(x, block_ones), minimums^T) + Add
  llm_onnx::gather_nbits         -> com.microsoft.GatherBlockQuantized (the embedding)
  llm_onnx::qmoe                 -> com.microsoft.QMoE
Their eager forms compute x @ dequantize(W)^T, which is how quantized exports are checked.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

SUPPORTED_BITS = (4, 8)


def _blocks(w: Tensor, block_size: int) -> Tensor:
    """(N, K) -> (N, k_blocks, block_size) float32, zero-padded along K."""
    n, k = w.shape
    pad = (-k) % block_size
    w = w.float()
    if pad:
        w = torch.nn.functional.pad(w, (0, pad))
    return w.reshape(n, -1, block_size)


def quantize(w: Tensor, bits: int, block_size: int, *, asymmetric: bool = False,
             search: bool = False, importance: Tensor | None = None,
             factors: Tensor | None = None, zp_steps: int = 20,
             ) -> tuple[Tensor, Tensor, Tensor | None]:
    """Block quantization of W (N, K) -> (qweight uint8, scales float32, zero_points uint8 | None).

    Symmetric (no zero points; ORT's default zero point 2^(bits-1)): int8 scale = max|w| / 127;
    int4 maps the block's largest-magnitude value to -8 exactly, using all 16 codes.
    Asymmetric: scale = (max - min) / (2^bits - 1) over the block's range (which includes 0) and an
    integer zero point, so one-sided blocks lose no code range; zero points are packed like the
    weights ((N, ceil(k_blocks * bits / 8)) uint8), the form MatMulNBits' fast kernels take.
    ``search``: asymmetric blocks get ``search_zero_point`` (weighted least squares over
    ``zp_steps`` + 1 candidate scales, weighted by ``importance`` (K,) when given: the mean
    square of each input channel's activations); symmetric ones ``_search_scales`` with the same weights, over
    the block's scale times each of ``factors`` (default SEARCH_FACTORS).
    """
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}")
    blocks = _blocks(w, block_size)  # (N, B, bs)
    levels = 2 ** bits - 1
    if asymmetric:
        if search:
            weights = block_weights(blocks, importance, block_size)
            scale, zp, codes = search_zero_point(blocks, weights, levels, zp_steps)
        else:
            scale, zp, codes = _minmax_zero_point(blocks, levels)
        return (_pack(codes.to(torch.uint8), bits), scale.contiguous(),
                _pack_zero_points(zp.to(torch.uint8), bits))
    qmax = 2 ** (bits - 1) - 1
    if bits == 8:
        scale = blocks.abs().amax(-1) / qmax
    else:
        idx = blocks.abs().argmax(-1, keepdim=True)
        scale = blocks.gather(-1, idx).squeeze(-1) / -(qmax + 1)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    if search:
        scale = _search_scales(blocks, scale, bits, block_weights(blocks, importance, block_size),
                               SEARCH_FACTORS if factors is None else factors)
    codes = torch.clamp(torch.round(blocks / scale[..., None]), -(qmax + 1), qmax)
    codes = (codes + (qmax + 1)).to(torch.uint8)  # (N, B, bs)
    return _pack(codes, bits), scale.contiguous(), None


def _minmax_zero_point(blocks: Tensor, levels: int) -> tuple[Tensor, Tensor, Tensor]:
    """The block's range (widened to include 0) over the whole code range: (scale, zp, codes)."""
    lo = blocks.amin(-1).clamp(max=0)
    hi = blocks.amax(-1).clamp(min=0)
    scale = ((hi - lo) / levels).clamp_min(1e-12)
    zp = torch.clamp(torch.round(-lo / scale), 0, levels)
    return scale, zp, _codes(blocks, scale, zp, levels)


def _codes(blocks: Tensor, scale: Tensor, zp: Tensor, levels: int) -> Tensor:
    return (blocks / scale[..., None]).round_().add_(zp[..., None]).clamp_(0, levels)


def block_weights(blocks: Tensor, importance: Tensor | None, block_size: int) -> Tensor:
    """Per-weight error weights of the search: each input channel's activation mean square when
    known (how much an error there moves the output), else sqrt(block mean square + w^2), which
    favours the large weights a plain least-squares fit would clip (llama.cpp's k-quant
    weighting without an importance matrix)."""
    if importance is None:
        return ((blocks * blocks).mean(-1, keepdim=True) + blocks * blocks).sqrt()
    imp = importance.float().clamp_min(0)
    pad = (-imp.shape[0]) % block_size
    if pad:
        imp = torch.nn.functional.pad(imp, (0, pad))
    return imp.reshape(1, -1, block_size).expand_as(blocks)


def search_zero_point(blocks: Tensor, weights: Tensor, levels: int, steps: int = 20,
                      ) -> tuple[Tensor, Tensor, Tensor]:
    """Per block, the scale and integer zero point with the least weighted squared error
    sum(weights * (w - (code - zp) * scale)^2): ``steps + 1`` candidate scales from
    range / (levels - 1) to range / (levels + 3) (llama.cpp's make_qkx2_quants grid, widened
    towards clipping for weighted blocks), each with
    its rounded zero point and codes, then the scale refitted to those codes by weighted least
    squares, whose error is known in closed form (sum(w x^2) - fit^2 * sum(w d^2)); then the
    winner's neighbouring zero points the same way. Rounding again with the winner's scale can
    only lower its error. Returns (scale, zp, codes) as float
    tensors."""
    lo = blocks.amin(-1).clamp(max=0)
    span = (blocks.amax(-1).clamp(min=0) - lo).clamp_min(1e-12)
    wx = weights * blocks
    total = (wx * blocks).sum(-1, dtype=torch.float64)  # float64: the error is a difference
    best: tuple[Tensor, Tensor, Tensor] | None = None

    def consider(scale: Tensor, zp: Tensor) -> None:
        nonlocal best
        d = _codes(blocks, scale, zp, levels).sub_(zp[..., None])
        num = (wx * d).sum(-1, dtype=torch.float64)
        den = (d.mul_(d).mul_(weights)).sum(-1, dtype=torch.float64)
        ok = (den > 0) & (num > 0)
        fit = torch.where(ok, (num / den.clamp_min(1e-30)).float(), scale)
        err = torch.where(ok, total - num * num / den.clamp_min(1e-30), total)
        if best is None:
            best = (fit, zp, err)
        else:
            better = err < best[2]
            best = (torch.where(better, fit, best[0]), torch.where(better, zp, best[1]),
                    torch.where(better, err, best[2]))

    for i in range(steps + 1):
        scale = span / (levels - 1 + 4 * i / steps)
        consider(scale, torch.clamp(torch.round(-lo / scale), 0, levels))
    assert best is not None
    for step in (-1, 1):  # the winner's neighbouring zero points, at its scale
        consider(best[0], torch.clamp(best[1] + step, 0, levels))
    scale, zp, _ = best
    return scale, zp, _codes(blocks, scale, zp, levels)


def quantize_offset(w: Tensor, bits: int, block_size: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Block quantization with a float offset per block (llama.cpp's Q4_1 form):
    W[n, k] ~= code * scale + minimum, codes in [0, 2^bits - 1].

    Returns (qweight, scales, zero_points, minimums): zero points are all 0 (so MatMulNBits computes
    code * scale) and the minimums (N, k_blocks) go into a separate term x_blocksum @ minimums^T.
    A Q4_1 tensor (as a GGUF holds) is reproduced exactly; any tensor loses no code range to a
    rounded zero point. K must be a multiple of block_size.
    """
    blocks = _blocks(w, block_size)  # (N, B, bs)
    levels = 2 ** bits - 1
    lo, hi = blocks.amin(-1), blocks.amax(-1)
    scale = ((hi - lo) / levels).clamp_min(1e-12)
    codes = torch.clamp(torch.round((blocks - lo[..., None]) / scale[..., None]), 0, levels)
    zeros = torch.zeros(scale.shape, dtype=torch.uint8)
    return (_pack(codes.to(torch.uint8), bits), scale.contiguous(), _pack_zero_points(zeros, bits),
            lo.contiguous())


def _pack(codes: Tensor, bits: int) -> Tensor:
    """(..., n) uint8 codes -> bytes, low nibble first for 4 bits."""
    if bits == 4:
        if codes.shape[-1] % 2:
            codes = torch.nn.functional.pad(codes, (0, 1))
        codes = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return codes.contiguous()


def _unpack(packed: Tensor, bits: int) -> Tensor:
    if bits == 4:
        return torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2)
    return packed


def _pack_zero_points(zp: Tensor, bits: int) -> Tensor:
    """(N, k_blocks) zero points -> MatMulNBits' packed form (N, ceil(k_blocks * bits / 8))."""
    return _pack(zp, bits)


# Symmetric search: the block's round-to-nearest scale times each factor, 0.70 ... 1.05.
SEARCH_FACTORS = torch.linspace(0.70, 1.05, 22)


def _search_scales(blocks: Tensor, scale: Tensor, bits: int, weights: Tensor,
                   factors: Tensor) -> Tensor:
    """Per block, the symmetric scale with the least weighted squared error: candidates
    ``scale * f`` for f in ``factors``, each refitted to its codes by weighted least squares
    (error in closed form, as in search_zero_point)."""
    qmax = 2 ** (bits - 1) - 1
    wx = weights * blocks
    total = (wx * blocks).sum(-1, dtype=torch.float64)  # float64: the error is a difference
    best: tuple[Tensor, Tensor] | None = None
    for f in factors:
        c = (blocks / (scale * f)[..., None]).round_().clamp_(-(qmax + 1), qmax)
        num = (wx * c).sum(-1, dtype=torch.float64)
        den = c.mul_(c).mul_(weights).sum(-1, dtype=torch.float64)
        ok = den > 0
        fit = torch.where(ok & (num * scale > 0), (num / den.clamp_min(1e-30)).float(), scale * f)
        err = torch.where(ok, total - num * num / den.clamp_min(1e-30), total)
        if best is None:
            best = (fit, err)
        else:
            better = err < best[1]
            best = (torch.where(better, fit, best[0]), torch.where(better, err, best[1]))
    assert best is not None
    return best[0]


def dequantize(qweight: Tensor, scales: Tensor, bits: int, k: int,
               zero_points: Tensor | None = None) -> Tensor:
    """Inverse of quantize: (N, K) float32."""
    codes = _unpack(qweight, bits).float()  # (N, B, bs)
    if zero_points is None:
        zp = torch.full(scales.shape, 2.0 ** (bits - 1))
    else:
        zp = _unpack(zero_points, bits)[:, : scales.shape[-1]].float()
    w = (codes - zp[..., None]) * scales.float()[..., None]
    return w.reshape(qweight.shape[0], -1)[:, :k]


# Dequantized weights kept while ``dequantized_once`` is active: the parity gate's reference
# steps the model several times over the same quantized buffers (a third of a SmolLM2-135M int8
# export went to dequantizing each weight again each step). Keyed by the buffers themselves (held
# here, so their ids stay theirs) and their versions (an in-place change misses). At most
# DEQUANTIZED_BYTES of float copies: past that, weights are dequantized per call as before, so
# the export's memory bound holds for the largest models the gate runs whole.
_DEQUANTIZED: dict | None = None
DEQUANTIZED_BYTES = 1 << 30


@contextlib.contextmanager
def dequantized_once():
    """Within this block, matmul_nbits dequantizes each weight once (memory: the float copies of
    the weights it meets, released at the end)."""
    global _DEQUANTIZED
    saved, _DEQUANTIZED = _DEQUANTIZED, {}
    try:
        yield
    finally:
        _DEQUANTIZED = saved


def _dequantized(qweight: Tensor, scales: Tensor, bits: int, k: int,
                 zero_points: Tensor | None, dtype: torch.dtype) -> Tensor:
    if _DEQUANTIZED is None:
        return dequantize(qweight, scales, bits, k, zero_points).to(dtype)
    parts = (qweight, scales, zero_points)
    key = (*(id(t) for t in parts), dtype)
    versions = tuple(-1 if t is None else t._version for t in parts)
    hit = _DEQUANTIZED.get(key)
    if hit is None or hit[1] != versions:
        w = dequantize(qweight, scales, bits, k, zero_points).to(dtype)
        held = sum(h[2].nbytes for h in _DEQUANTIZED.values())
        if held + w.nbytes > DEQUANTIZED_BYTES:
            return w
        hit = (parts, versions, w)
        _DEQUANTIZED[key] = hit
    return hit[2]


@torch.library.custom_op("llm_onnx::matmul_nbits", mutates_args=())
def matmul_nbits(x: Tensor, qweight: Tensor, scales: Tensor, zero_points: Tensor | None,
                 bias: Tensor | None, k: int, n: int, bits: int, block_size: int,
                 accuracy_level: int) -> Tensor:
    """x (..., K) @ dequantize(W)^T (+ bias) -> (..., N), computed in x's dtype."""
    w = _dequantized(qweight, scales, bits, k, zero_points, x.dtype)
    y = x @ w.t()
    return y + bias if bias is not None else y


@matmul_nbits.register_fake
def _(x, qweight, scales, zero_points, bias, k, n, bits, block_size, accuracy_level):
    return x.new_empty((*x.shape[:-1], n))


@torch.library.custom_op("llm_onnx::matmul_nbits_offset", mutates_args=())
def matmul_nbits_offset(x: Tensor, qweight: Tensor, scales: Tensor, zero_points: Tensor,
                        block_ones: Tensor, minimums_t: Tensor, bias: Tensor | None, k: int, n: int,
                        bits: int, block_size: int, accuracy_level: int) -> Tensor:
    """x @ (codes * scale + minimum)^T: MatMulNBits plus the offset term (x @ block_ones) @
    minimums_t, where block_ones (K, k_blocks) sums x over each block and minimums_t is
    (k_blocks, N)."""
    y = matmul_nbits(x, qweight, scales, zero_points, bias, k, n, bits, block_size, accuracy_level)
    return y + (x @ block_ones.to(x.dtype)) @ minimums_t.to(x.dtype)


@matmul_nbits_offset.register_fake
def _(x, qweight, scales, zero_points, block_ones, minimums_t, bias, k, n, bits, block_size,
      accuracy_level):
    return x.new_empty((*x.shape[:-1], n))


def block_ones(k: int, block_size: int) -> Tensor:
    """(K, K / block_size) with ones where row k belongs to block b: x @ it sums x per block."""
    return torch.repeat_interleave(torch.eye(k // block_size), block_size, dim=0)


@torch.library.custom_op("llm_onnx::gather_nbits", mutates_args=())
def gather_nbits(qweight: Tensor, ids: Tensor, scales: Tensor, k: int, bits: int,
                 block_size: int) -> Tensor:
    """Rows ``ids`` of a quantized (V, K) table, dequantized: (..., K) in scales' dtype."""
    flat = ids.reshape(-1)
    q = qweight[flat].reshape(flat.shape[0], scales.shape[-1], -1)  # (n, k_blocks, blob)
    rows = dequantize(q, scales[flat], bits, k)
    return rows.reshape(*ids.shape, k).to(scales.dtype)


@gather_nbits.register_fake
def _(qweight, ids, scales, k, bits, block_size):
    return scales.new_empty((*ids.shape, k))


@torch.library.custom_op("llm_onnx::qmoe", mutates_args=())
def qmoe(x: Tensor, router_logits: Tensor, fc1_q: Tensor, fc1_scales: Tensor, fc2_q: Tensor,
         fc2_scales: Tensor, k: int, normalize_routing_weights: bool, bits: int,
         block_size: int, accuracy_level: int = 0, fc1_bias: Tensor | None = None,
         fc2_bias: Tensor | None = None, alpha: float = 1.0, beta: float = 0.0,
         limit: float | None = None, fc1_zero_points: Tensor | None = None,
         fc2_zero_points: Tensor | None = None) -> Tensor:
    """MoE with block-quantized experts (ORT's QMoE): fc1_q (E, 2I, D*bits/8) gate/up interleaved,
    fc2_q (E, D, I*bits/8), scales (E, rows, K/block), zero points (E, rows,
    ceil(K/block*bits/8)) packed as the codes, or None (symmetric: 2^(bits-1)). Reference:
    dequantize, then moe_ref (``accuracy_level`` 4, int8 activations in the kernel, is not
    modelled: the parity gate's int8-activation tolerances cover it). Biases and (alpha, beta,
    limit): gpt-oss's, as ops.moe."""
    from llm_onnx.modeling.ops import moe_ref

    def deq(q: Tensor, s: Tensor, zp: Tensor | None) -> Tensor:
        e, rows, _ = q.shape
        blob = block_size * bits // 8
        k_in = s.shape[-1] * block_size
        return torch.stack([dequantize(q[i].reshape(rows, -1, blob), s[i], bits, k_in,
                                       None if zp is None else zp[i])
                            for i in range(e)]).to(x.dtype)

    return moe_ref(x, router_logits, deq(fc1_q, fc1_scales, fc1_zero_points),
                   deq(fc2_q, fc2_scales, fc2_zero_points), k, normalize_routing_weights, None,
                   fc1_bias, fc2_bias, (alpha, beta, limit))


@qmoe.register_fake
def _(x, router_logits, fc1_q, fc1_scales, fc2_q, fc2_scales, k, normalize_routing_weights, bits,
      block_size, *args, **kwargs):
    return torch.empty_like(x)


@torch.library.custom_op("llm_onnx::geglu_experts_nbits", mutates_args=())
def geglu_experts_nbits(x: Tensor, index: Tensor, weight: Tensor, gate_up_q: list[Tensor],
                        gate_up_scales: list[Tensor], down_q: list[Tensor],
                        down_scales: list[Tensor], bits: int, block_up: int, block_down: int,
                        accuracy_level: int) -> Tensor:
    """Gemma 4's experts (modeling.mlp.GeGLUExperts), each one a pair of block-quantized weights:
    x (N, D), index (N, K) the chosen experts, weight (N, K) fp32 -> (N, D). Expert e's
    gate_up_q[e] is (2I, D) [gate | up] rows, down_q[e] (D, I). Only the chosen experts run,
    each on the rows that chose it (the ONNX form: an If per expert)."""
    from llm_onnx.modeling.mlp import geglu_per_expert

    d, i = x.shape[-1], gate_up_q[0].shape[0] // 2
    return geglu_per_expert(
        x, index, weight, i,
        lambda e, a: matmul_nbits(a, gate_up_q[e], gate_up_scales[e], None, None, d, 2 * i,
                                  bits, block_up, accuracy_level),
        lambda e, a: matmul_nbits(a, down_q[e], down_scales[e], None, None, i, d, bits,
                                  block_down, accuracy_level))


@geglu_experts_nbits.register_fake
def _(x, index, weight, gate_up_q, gate_up_scales, down_q, down_scales, bits, block_up,
      block_down, accuracy_level):
    return torch.empty_like(x)

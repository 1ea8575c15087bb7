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
             search: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
    """Block quantization of W (N, K) -> (qweight uint8, scales float32, zero_points uint8 | None).

    Symmetric (no zero points; ORT's default zero point 2^(bits-1)): int8 scale = max|w| / 127;
    int4 maps the block's largest-magnitude value to -8 exactly, using all 16 codes.
    Asymmetric: scale = (max - min) / (2^bits - 1) over the block's range (which includes 0) and an
    integer zero point, so one-sided blocks lose no code range; zero points are packed like the
    weights ((N, ceil(k_blocks * bits / 8)) uint8), the form MatMulNBits' fast kernels take.
    ``search`` tries ranges shrunk by up to 20% per block and keeps the least squared error.
    """
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}")
    blocks = _blocks(w, block_size)  # (N, B, bs)
    levels = 2 ** bits - 1
    if asymmetric:
        lo = blocks.amin(-1).clamp(max=0)
        hi = blocks.amax(-1).clamp(min=0)
        candidates = torch.linspace(0.80, 1.0, 11) if search else torch.ones(1)
        best = None
        for f in candidates:
            scale = ((hi - lo) * f / levels).clamp_min(1e-12)
            zp = torch.clamp(torch.round(-lo * f / scale), 0, levels)
            codes = torch.clamp(torch.round(blocks / scale[..., None]) + zp[..., None], 0, levels)
            err = (((codes - zp[..., None]) * scale[..., None] - blocks) ** 2).sum(-1)
            if best is None:
                best = [scale, zp, codes, err]
            else:
                better = err < best[3]
                best[0] = torch.where(better, scale, best[0])
                best[1] = torch.where(better, zp, best[1])
                best[2] = torch.where(better[..., None], codes, best[2])
                best[3] = torch.where(better, err, best[3])
        assert best is not None
        scale, zp, codes = best[0], best[1].to(torch.uint8), best[2].to(torch.uint8)
        return _pack(codes, bits), scale.contiguous(), _pack_zero_points(zp, bits)
    qmax = 2 ** (bits - 1) - 1
    if bits == 8:
        scale = blocks.abs().amax(-1) / qmax
    else:
        idx = blocks.abs().argmax(-1, keepdim=True)
        scale = blocks.gather(-1, idx).squeeze(-1) / -(qmax + 1)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    if search:
        scale = _search_scales(blocks, scale, bits)
    codes = torch.clamp(torch.round(blocks / scale[..., None]), -(qmax + 1), qmax)
    codes = (codes + (qmax + 1)).to(torch.uint8)  # (N, B, bs)
    return _pack(codes, bits), scale.contiguous(), None


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


def _search_scales(blocks: Tensor, scale: Tensor, bits: int) -> Tensor:
    """Per block, the scale among ``scale * f`` (f in 0.80..1.00) with the least squared error."""
    qmax = 2 ** (bits - 1) - 1
    best, best_err = scale, None
    for f in torch.linspace(0.80, 1.0, 11):
        s = scale * f
        codes = torch.clamp(torch.round(blocks / s[..., None]), -(qmax + 1), qmax)
        err = ((codes * s[..., None] - blocks) ** 2).sum(-1)
        if best_err is None:
            best, best_err = s, err
        else:
            better = err < best_err
            best = torch.where(better, s, best)
            best_err = torch.where(better, err, best_err)
    return best


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


@torch.library.custom_op("llm_onnx::matmul_nbits", mutates_args=())
def matmul_nbits(x: Tensor, qweight: Tensor, scales: Tensor, zero_points: Tensor | None,
                 bias: Tensor | None, k: int, n: int, bits: int, block_size: int,
                 accuracy_level: int) -> Tensor:
    """x (..., K) @ dequantize(W)^T (+ bias) -> (..., N), computed in x's dtype."""
    w = dequantize(qweight, scales, bits, k, zero_points).to(x.dtype)
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
         block_size: int) -> Tensor:
    """MoE with block-quantized experts (ORT's QMoE): fc1_q (E, 2I, D*bits/8) gate/up interleaved,
    fc2_q (E, D, I*bits/8), scales (E, rows, K/block). Reference: dequantize, then moe_ref."""
    from llm_onnx.model.ops import moe_ref

    def deq(q: Tensor, s: Tensor) -> Tensor:
        e, rows, _ = q.shape
        blob = block_size * bits // 8
        k_in = s.shape[-1] * block_size
        return torch.stack([dequantize(q[i].reshape(rows, -1, blob), s[i], bits, k_in)
                            for i in range(e)]).to(x.dtype)

    return moe_ref(x, router_logits, deq(fc1_q, fc1_scales), deq(fc2_q, fc2_scales), k,
                   normalize_routing_weights)


@qmoe.register_fake
def _(x, router_logits, fc1_q, fc1_scales, fc2_q, fc2_scales, k, normalize_routing_weights, bits,
      block_size):
    return torch.empty_like(x)

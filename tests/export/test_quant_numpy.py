"""Block quantization (llm_onnx/export/quant.py) against a numpy reference written from
MatMulNBits' documented layout: every scheme (symmetric, zero_point, offset), both widths, every
block size the CLI offers, K that is and is not a multiple of the block; and llama.cpp's Q4_1
blocks reproduced exactly by the offset scheme."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llm_onnx.export.quant import dequantize, quantize, quantize_offset

BLOCKS = [16, 32, 64, 128]


def weights(n: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    w[0] = np.abs(w[0])  # a one-sided row: zero points must keep the whole code range
    w[1, :k // 2] = 0.0  # all-zero blocks
    return w


def np_blocks(w: np.ndarray, block: int) -> np.ndarray:
    n, k = w.shape
    pad = (-k) % block
    return np.pad(w, ((0, 0), (0, pad))).reshape(n, -1, block)


def np_unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """MatMulNBits' packing: for 4 bits, element 2i in the low nibble of byte i, 2i+1 high."""
    if bits == 8:
        return packed
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)


def np_symmetric(w: np.ndarray, bits: int, block: int):
    """Codes (unsigned, zero point 2^(bits-1)) and scales. int8: max|w| -> ±127; int4: the
    largest-magnitude value maps to code 0 (-8) exactly, so all 16 codes are usable."""
    b = np_blocks(w, block).astype(np.float64)
    qmax = 2 ** (bits - 1) - 1
    if bits == 8:
        scale = np.abs(b).max(-1) / qmax
    else:
        idx = np.abs(b).argmax(-1)[..., None]
        scale = np.take_along_axis(b, idx, -1)[..., 0] / -(qmax + 1)
    scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
    codes = np.clip(np.round(b / scale[..., None]), -(qmax + 1), qmax) + qmax + 1
    return codes.astype(np.uint8), scale, np.full(scale.shape, qmax + 1, np.uint8)


def np_zero_point(w: np.ndarray, bits: int, block: int):
    """Range [min(w, 0), max(w, 0)] over 2^bits - 1 steps, an integer zero point per block."""
    b = np_blocks(w, block).astype(np.float32)
    levels = 2 ** bits - 1
    lo, hi = np.minimum(b.min(-1), 0), np.maximum(b.max(-1), 0)
    scale = np.maximum((hi - lo) / levels, np.float32(1e-12)).astype(np.float32)
    zp = np.clip(np.round(-lo / scale), 0, levels)
    codes = np.clip(np.round(b / scale[..., None]) + zp[..., None], 0, levels)
    return codes.astype(np.uint8), scale, zp.astype(np.uint8)


def np_offset(w: np.ndarray, bits: int, block: int):
    """llama.cpp's Q4_1 form: code * scale + block minimum."""
    b = np_blocks(w, block).astype(np.float32)
    levels = 2 ** bits - 1
    lo, hi = b.min(-1), b.max(-1)
    scale = np.maximum((hi - lo) / levels, np.float32(1e-12)).astype(np.float32)
    codes = np.clip(np.round((b - lo[..., None]) / scale[..., None]), 0, levels)
    return codes.astype(np.uint8), scale, lo


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("scheme", ["symmetric", "zero_point"])
@pytest.mark.parametrize("k", [256, 200])  # 200: the last block is padded
def test_codes_scales_and_zero_points_equal_numpy(scheme, bits, block, k):
    w = weights(6, k, seed=bits * block + k)
    qweight, scales, zero_points = quantize(torch.from_numpy(w), bits, block,
                                            asymmetric=scheme == "zero_point")
    want_codes, want_scales, want_zp = (np_symmetric if scheme == "symmetric" else
                                        np_zero_point)(w, bits, block)
    n_blocks = -(-k // block)
    assert qweight.shape == (6, n_blocks, block * bits // 8) and scales.shape == (6, n_blocks)
    np.testing.assert_allclose(scales.numpy(), want_scales, rtol=1e-6)
    codes = np_unpack(qweight.numpy(), bits)
    # Rounding at an exact .5 may differ by one code where the float32 division rounds
    # differently; anywhere else the codes are equal.
    assert np.mean(codes == want_codes) > 0.999 and np.abs(codes.astype(int) - want_codes).max() <= 1
    if scheme == "symmetric":
        assert zero_points is None  # ORT's default zero point, 2^(bits-1)
    else:
        zp = np_unpack(zero_points.numpy(), bits)[:, :n_blocks]
        np.testing.assert_array_equal(zp, want_zp)
    # The inverse: every weight within half a step of its block's scale (padding dropped);
    # symmetric int4 gives -8 to the largest magnitude, so an opposite-sign value beyond 7.5
    # steps clips to +7: within one step.
    back = dequantize(qweight, scales, bits, k, zero_points).numpy()
    step = np.abs(np.repeat(want_scales, block, axis=-1)[:, :k])
    steps = 1.0 if scheme == "symmetric" and bits == 4 else 0.5
    assert np.all(np.abs(back - w) <= steps * step * (1 + 1e-5) + 1e-9)
    if scheme == "zero_point":  # the one-sided row uses the whole code range
        assert codes[0].max() == 2 ** bits - 1


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", BLOCKS)
def test_offset_scheme_equals_numpy(bits, block):
    w = weights(5, 256, seed=block + bits)
    qweight, scales, zero_points, minimums = quantize_offset(torch.from_numpy(w), bits, block)
    want_codes, want_scales, want_min = np_offset(w, bits, block)
    np.testing.assert_allclose(scales.numpy(), want_scales, rtol=1e-6)
    np.testing.assert_array_equal(minimums.numpy(), want_min)
    codes = np_unpack(qweight.numpy(), bits)
    assert np.abs(codes.astype(int) - want_codes).max() <= 1 and np.mean(codes == want_codes) > 0.999
    assert not np_unpack(zero_points.numpy(), bits).any()  # zero points 0: code * scale
    back = codes.astype(np.float32) * want_scales[..., None] + want_min[..., None]
    assert np.all(np.abs(back.reshape(5, -1) - w) <= 0.5 * np.repeat(want_scales, block, -1) + 1e-7)


@pytest.mark.parametrize("block", [16, 32, 64])
def test_q4_1_blocks_are_reproduced_exactly(block):
    """Weights already on a Q4_1 grid (d * q + m, q in 0..15, each block using 0 and 15, as a
    Q4_1 GGUF holds them) come back code for code, and dequantize to the same numbers."""
    rng = np.random.default_rng(block)
    n, k = 8, 4 * block
    q = rng.integers(0, 16, (n, k // block, block))
    q[..., 0], q[..., 1] = 0, 15
    d = rng.uniform(0.001, 0.02, (n, k // block, 1)).astype(np.float32)
    m = rng.uniform(-0.1, 0.0, (n, k // block, 1)).astype(np.float32)
    w = (q * d + m).astype(np.float32).reshape(n, k)
    qweight, scales, _, minimums = quantize_offset(torch.from_numpy(w), 4, block)
    np.testing.assert_array_equal(np_unpack(qweight.numpy(), 4), q)
    back = np_unpack(qweight.numpy(), 4) * scales.numpy()[..., None] + minimums.numpy()[..., None]
    np.testing.assert_allclose(back.reshape(n, k), w, rtol=0, atol=4 * np.finfo(np.float32).eps)
    # zero_point int4 of the same weights is not exact: the offset form is what keeps them.
    zq, zs, zzp = quantize(torch.from_numpy(w), 4, block, asymmetric=True)
    assert np.abs(dequantize(zq, zs, 4, k, zzp).numpy() - w).max() > 1e-4


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("asymmetric", [False, True])
def test_scale_search_never_increases_a_blocks_weighted_error(bits, asymmetric):
    """The search minimises the error weighted by quant.block_weights (each weight's
    sqrt(block mean square + w^2) without calibration), computed here in numpy: never above the
    plain fit's in any block, below it in total."""
    w = weights(16, 256, seed=3)
    b = np_blocks(w, 32)
    wt = np.sqrt((b * b).mean(-1, keepdims=True) + b * b)
    errors = []
    for search in (False, True):
        q, s, zp = quantize(torch.from_numpy(w), bits, 32, asymmetric=asymmetric, search=search)
        back = dequantize(q, s, bits, 256, zp).numpy()
        errors.append((wt * (np_blocks(back, 32) - b) ** 2).sum(-1))
    assert np.all(errors[1] <= errors[0] * (1 + 1e-5) + 1e-12)
    if bits == 4:  # 16 levels: another scale pays off in some blocks
        assert errors[1].sum() < errors[0].sum()


def test_the_gates_reference_dequantizes_each_weight_once(monkeypatch):
    """Within dequantized_once, matmul_nbits dequantizes a weight on its first call only (the
    same product as without it), again after an in-place change of its scales, and never keeps
    more than DEQUANTIZED_BYTES."""
    from llm_onnx.export import quant

    calls = []
    real = quant.dequantize
    monkeypatch.setattr(quant, "dequantize", lambda *a, **k: calls.append(1) or real(*a, **k))
    w = torch.from_numpy(weights(8, 64, 3))
    q, scales, zp = quantize(w, 8, 32)
    x = torch.randn(2, 64)

    def product():
        return quant.matmul_nbits(x, q, scales, zp, None, 64, 8, 8, 32, 0)

    plain = product()
    assert len(calls) == 1
    with quant.dequantized_once():
        for _ in range(3):
            torch.testing.assert_close(product(), plain, rtol=0, atol=0)
        assert len(calls) == 2
        scales.mul_(2)  # the gate never does this; a changed buffer must not read a stale copy
        torch.testing.assert_close(product(), 2 * plain)
        assert len(calls) == 3
    monkeypatch.setattr(quant, "DEQUANTIZED_BYTES", 0)
    with quant.dequantized_once():
        product(), product()
    assert len(calls) == 5

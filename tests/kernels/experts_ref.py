"""The RoutedExperts operator's numpy reference, random problems for it, and a one-node ONNX
model that runs it.

The reference follows the operator's contract (llm_onnx/kernels/src/experts.h) independently of
its code: weights dequantized from their codes in float64; the activations quantized to int8
per token and per block exactly as the contract says (max|x| / 127 in float32, rounded to
nearest even), so the only differences left are the order of float sums.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Problem:
    x: np.ndarray            # (N, D) float32
    index: np.ndarray        # (N, K) int64
    weight: np.ndarray       # (N, K) float32
    gate_up: dict            # codes (E, 2I, bytes), scales (E, 2I, blocks), zero_points or None
    down: dict
    bits: int
    block: int
    activation: str = "swiglu"
    layout: str = "interleaved"
    alpha: float = 1.0
    beta: float = 0.0
    limit: float | None = None
    gate_up_bias: np.ndarray | None = None
    down_bias: np.ndarray | None = None
    extra: dict = field(default_factory=dict)


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """(..., n) codes -> bytes, two 4-bit codes a byte low nibble first (MatMulNBits')."""
    codes = codes.astype(np.uint8)
    if bits == 8:
        return codes
    if codes.shape[-1] % 2:
        codes = np.concatenate([codes, np.zeros((*codes.shape[:-1], 1), np.uint8)], -1)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack(packed: np.ndarray, bits: int, n: int) -> np.ndarray:
    if bits == 8:
        return packed[..., :n].astype(np.int64)
    both = np.stack([packed & 0x0F, packed >> 4], -1).reshape(*packed.shape[:-1], -1)
    return both[..., :n].astype(np.int64)


def random_matrix(rng, e: int, rows: int, cols: int, bits: int, block: int,
                  zero_points: bool) -> dict:
    """E stacked (rows, cols) matrices as random codes (the padding past cols random too: the
    kernel must ignore it), scales and optionally zero points."""
    blocks = -(-cols // block)
    codes = rng.integers(0, 2 ** bits, size=(e, rows, blocks * block))
    scales = rng.uniform(0.5, 1.5, size=(e, rows, blocks)).astype(np.float32) / (2 ** bits * 4)
    zp = None
    if zero_points:
        zp = pack(rng.integers(0, 2 ** bits, size=(e, rows, blocks)), bits)
    return {"codes": pack(codes, bits), "scales": scales, "zero_points": zp, "cols": cols}


def dequantize(m: dict, bits: int, block: int) -> np.ndarray:
    """(E, rows, cols) float64."""
    scales = m["scales"].astype(np.float64)
    e, rows, blocks = scales.shape
    codes = unpack(m["codes"], bits, blocks * block).reshape(e, rows, blocks, block)
    if m["zero_points"] is None:
        zp = np.full((e, rows, blocks), 2 ** (bits - 1))
    else:
        zp = unpack(m["zero_points"], bits, blocks)
    w = (codes - zp[..., None]) * scales[..., None]
    return w.reshape(e, rows, blocks * block)[..., :m["cols"]]


def quantize_rows(x: np.ndarray, block: int) -> np.ndarray:
    """x (R, C) float32 -> its int8 per-block quantization, dequantized: (R, C) float64."""
    r, c = x.shape
    blocks = -(-c // block)
    padded = np.zeros((r, blocks * block), np.float32)
    padded[:, :c] = x
    b = padded.reshape(r, blocks, block)
    amax = np.abs(b).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), np.float32(0))
    q = np.clip(np.rint(b * inv.astype(np.float32)), -127, 127)
    scale = (amax / np.float32(127)).astype(np.float32)
    return (q.astype(np.float64) * scale).reshape(r, -1)[:, :c]


def activate(p: Problem, g: np.ndarray, u: np.ndarray) -> np.ndarray:
    if p.activation == "geglu":
        return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3))) * u
    if p.limit is not None:
        g, u = np.minimum(g, p.limit), np.clip(u, -p.limit, p.limit)
    return g / (1 + np.exp(-p.alpha * g)) * (u + p.beta)


def reference(p: Problem, quantized_activations: bool = True) -> np.ndarray:
    """(N, D) float64: each token's chosen experts, weighted and summed. With
    ``quantized_activations`` False, float activations (what the int8 ones approximate)."""
    w1, w2 = dequantize(p.gate_up, p.bits, p.block), dequantize(p.down, p.bits, p.block)
    width = w1.shape[1] // 2
    q = (lambda a: quantize_rows(a.astype(np.float32), p.block)) if quantized_activations \
        else (lambda a: a.astype(np.float64))
    xq = q(p.x)
    out = np.zeros(p.x.shape, np.float64)
    n, k = p.index.shape
    for t in range(n):
        for s in range(k):
            e = p.index[t, s]
            h = w1[e] @ xq[t]
            if p.gate_up_bias is not None:
                h = h + p.gate_up_bias[e]
            g, u = (h[0::2], h[1::2]) if p.layout == "interleaved" else (h[:width], h[width:])
            a = q(activate(p, g, u)[None])[0]
            y = w2[e] @ a
            if p.down_bias is not None:
                y = y + p.down_bias[e]
            out[t] += p.weight[t, s] * y
    return out


def random_problem(seed: int, n: int, d: int, width: int, e: int, k: int, bits: int,
                   block: int, zero_points: bool = False, **kw) -> Problem:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    index = np.stack([rng.permutation(e)[:k] for _ in range(n)]).astype(np.int64)
    weight = rng.dirichlet(np.ones(k), size=n).astype(np.float32)
    return Problem(x=x, index=index, weight=weight,
                   gate_up=random_matrix(rng, e, 2 * width, d, bits, block, zero_points),
                   down=random_matrix(rng, e, d, width, bits, block, zero_points),
                   bits=bits, block=block, **kw)


def model_bytes(p: Problem) -> bytes:
    """A one-node ONNX model: RoutedExperts with the problem's weights as initializers and x,
    index, weight as inputs."""
    from onnx import TensorProto, helper, numpy_helper

    inits, names = [], ["x", "index", "weight"]

    def add(name: str, value: np.ndarray | None) -> None:
        if value is None:
            names.append("")
            return
        inits.append(numpy_helper.from_array(value, name))
        names.append(name)

    for part, m in (("gate_up", p.gate_up), ("down", p.down)):
        add(f"{part}_codes", m["codes"])
        add(f"{part}_scales", m["scales"])
    add("gate_up_bias", p.gate_up_bias)
    add("down_bias", p.down_bias)
    add("gate_up_zero_points", p.gate_up["zero_points"])
    add("down_zero_points", p.down["zero_points"])
    while names[-1] == "":
        names.pop()
    attrs = {"bits": p.bits, "block_size": p.block, "activation": p.activation,
             "gate_up_layout": p.layout, "alpha": p.alpha, "beta": p.beta}
    if p.limit is not None:
        attrs["limit"] = p.limit
    node = helper.make_node("RoutedExperts", names, ["y"], domain="llm_onnx", **attrs)
    d = p.x.shape[1]
    graph = helper.make_graph(
        [node], "routed_experts",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", d]),
         helper.make_tensor_value_info("index", TensorProto.INT64, ["N", "K"]),
         helper.make_tensor_value_info("weight", TensorProto.FLOAT, ["N", "K"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", d])], inits)
    model = helper.make_model(graph, ir_version=10,
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid("llm_onnx", 1)])
    return model.SerializeToString()

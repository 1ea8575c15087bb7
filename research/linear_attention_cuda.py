"""Qwen3.5's linear attention on CUDA: ONNX Runtime's ``LinearAttention`` (what the export writes)
against its ``GatedDeltaNet`` (CUDA and WebGPU only), at Qwen3.5-9B's shapes (16 key heads, 32
value heads, d_k = d_v = 128), the state bound in place as the runtime binds it.

    python -m research.linear_attention_cuda --out OUT            # on a GPU machine
    python -m research.linear_attention_cuda --smoke --out OUT    # the CPU, LinearAttention only

Each case first checks both ops against a numpy gated delta rule on a short ragged-free batch
(B = 2, T = 8), then times a decode step (T = 1) at batch 1 and 32 and a prefill of 512 and 2048
tokens: the median of 20 runs through IO binding with every input and output on the device
(benchmarks/core/timing.py's median_run_s).
Inputs are fp32 and fp16 (GatedDeltaNet's state and decay are float whatever the inputs, its
state V-major [B, Hv, d_v, d_k]; LinearAttention's state is [B, Hv, d_k, d_v] and takes the
inputs' type). Results go to OUT/linear_attention_cuda.json.
"""

from __future__ import annotations

import argparse
import json
import traceback
from pathlib import Path

import numpy as np

from benchmarks.core.timing import median_run_s

HK, HV, DK, DV = 16, 32, 128, 128


def reference(q, k, v, state, g, beta):
    """The gated delta rule, token by token: q, k (B, T, Hk, dk), v (B, T, Hv, dv), state
    (B, Hv, dk, dv), g and beta (B, T, Hv); value head h reads key head h // (Hv / Hk)."""
    b, t, hk, dk = q.shape
    hv = v.shape[2]
    rep = hv // hk
    s = state.astype(np.float64).copy()
    out = np.zeros(v.shape, np.float64)
    for i in range(t):
        for h in range(hv):
            kk, qq = k[:, i, h // rep].astype(np.float64), q[:, i, h // rep].astype(np.float64)
            decay = np.exp(g[:, i, h])[:, None, None]
            s[:, h] *= decay
            delta = v[:, i, h] - np.einsum("bkv,bk->bv", s[:, h], kk)
            s[:, h] += np.einsum("bk,bv->bkv", kk, beta[:, i, h][:, None] * delta)
            out[:, i, h] = np.einsum("bkv,bk->bv", s[:, h], qq) / np.sqrt(dk)
    return out, s


def model(op: str, dtype: str, beta_float: bool = False):
    from onnx import TensorProto, helper

    t = TensorProto.FLOAT16 if dtype == "fp16" else TensorProto.FLOAT
    f = TensorProto.FLOAT
    if op == "LinearAttention":
        state_t = t
        inputs = [helper.make_tensor_value_info("q", t, ["B", "T", HK * DK]),
                  helper.make_tensor_value_info("k", t, ["B", "T", HK * DK]),
                  helper.make_tensor_value_info("v", t, ["B", "T", HV * DV]),
                  helper.make_tensor_value_info("state", state_t, ["B", HV, DK, DV]),
                  helper.make_tensor_value_info("g", t, ["B", "T", HV]),
                  helper.make_tensor_value_info("beta", t, ["B", "T", HV])]
        node = helper.make_node("LinearAttention", ["q", "k", "v", "state", "g", "beta"],
                                ["out", "new_state"], domain="com.microsoft", q_num_heads=HK,
                                kv_num_heads=HV, update_rule="gated_delta", scale=0.0)
        outputs = [helper.make_tensor_value_info("out", t, ["B", "T", HV * DV]),
                   helper.make_tensor_value_info("new_state", state_t, ["B", HV, DK, DV])]
    else:
        beta_t = f if beta_float else t
        inputs = [helper.make_tensor_value_info("q", t, ["B", "T", HK, DK]),
                  helper.make_tensor_value_info("k", t, ["B", "T", HK, DK]),
                  helper.make_tensor_value_info("v", t, ["B", "T", HV, DV]),
                  helper.make_tensor_value_info("g", f, ["B", "T", HV]),  # float only
                  helper.make_tensor_value_info("beta", beta_t, ["B", "T", HV]),
                  helper.make_tensor_value_info("state", f, ["B", HV, DV, DK])]
        node = helper.make_node("GatedDeltaNet", ["q", "k", "v", "", "g", "beta", "state"],
                                ["out", "new_state"], domain="com.microsoft",
                                update_rule="gated_delta", scale=0.0)
        outputs = [helper.make_tensor_value_info("out", t, ["B", "T", HV, DV]),
                   helper.make_tensor_value_info("new_state", f, ["B", HV, DV, DK])]
    graph = helper.make_graph([node], op, inputs, outputs)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m.SerializeToString()


def inputs(b: int, t: int, rng):
    q = rng.standard_normal((b, t, HK, DK)).astype(np.float32)
    k = rng.standard_normal((b, t, HK, DK)).astype(np.float32)
    q /= np.linalg.norm(q, axis=-1, keepdims=True)  # the delta rule wants unit keys
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((b, t, HV, DV)).astype(np.float32)
    g = -np.abs(rng.standard_normal((b, t, HV))).astype(np.float32) * 0.1
    beta = rng.uniform(0.1, 0.9, (b, t, HV)).astype(np.float32)
    state = (0.1 * rng.standard_normal((b, HV, DK, DV))).astype(np.float32)
    return q, k, v, g, beta, state


def feeds(op: str, dtype: str, q, k, v, g, beta, state, beta_float: bool = False) -> dict:
    cast = (lambda x: x.astype(np.float16)) if dtype == "fp16" else (lambda x: x)
    b, t = q.shape[:2]
    if op == "LinearAttention":
        return {"q": cast(q.reshape(b, t, -1)), "k": cast(k.reshape(b, t, -1)),
                "v": cast(v.reshape(b, t, -1)), "g": cast(g), "beta": cast(beta),
                "state": cast(state)}
    return {"q": cast(q), "k": cast(k), "v": cast(v), "g": g,
            "beta": beta if beta_float else cast(beta),
            "state": np.ascontiguousarray(state.transpose(0, 1, 3, 2))}


def run_case(op: str, dtype: str, provider: str, shapes, repeat: int) -> dict:
    import onnxruntime as ort

    providers = [("CUDAExecutionProvider", {"device_id": "0"})] if provider == "cuda" else []
    so = ort.SessionOptions()
    so.log_severity_level = 3
    beta_float = False
    try:
        sess = ort.InferenceSession(model(op, dtype), so,
                                    providers=providers + ["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - GatedDeltaNet's decay is float only; beta may be too
        beta_float = True
        sess = ort.InferenceSession(model(op, dtype, True), so,
                                    providers=providers + ["CPUExecutionProvider"])
    entry: dict = {"providers": sess.get_providers(), "beta_float32": beta_float}
    rng = np.random.default_rng(0)
    data = inputs(2, 8, rng)
    out, new_state = sess.run(None, feeds(op, dtype, *data, beta_float=beta_float))
    ref_out, ref_state = reference(*data[:3], data[5], data[3], data[4])
    out = out.astype(np.float64).reshape(ref_out.shape)
    new_state = new_state.astype(np.float64)
    if op != "LinearAttention":
        new_state = new_state.transpose(0, 1, 3, 2)
    entry["max_abs_diff_out"] = float(np.abs(out - ref_out).max())
    entry["max_abs_diff_state"] = float(np.abs(new_state - ref_state).max())
    entry["ok"] = entry["max_abs_diff_out"] < (2e-2 if dtype == "fp16" else 1e-3)
    device = "cuda" if provider == "cuda" else "cpu"
    for b, t in shapes:
        data = inputs(b, t, rng)
        binding = sess.io_binding()
        values = {}
        for name, arr in feeds(op, dtype, *data, beta_float=beta_float).items():
            values[name] = ort.OrtValue.ortvalue_from_numpy(arr, device, 0)
            binding.bind_ortvalue_input(name, values[name])
        out_shape = (b, t, HV * DV) if op == "LinearAttention" else (b, t, HV, DV)
        out_type = np.float16 if dtype == "fp16" else np.float32
        values["out"] = ort.OrtValue.ortvalue_from_shape_and_type(out_shape, out_type, device, 0)
        binding.bind_ortvalue_output("out", values["out"])
        binding.bind_ortvalue_output("new_state", values["state"])  # in place, as the runtime
        entry[f"b{b}_t{t}_ms"] = round(1e3 * median_run_s(sess, binding, repeat), 4)
    return entry


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU, LinearAttention, tiny shapes")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        provider, ops, shapes = "cpu", ("LinearAttention",), ((1, 1), (1, 16))
    else:
        provider, ops = "cuda", ("LinearAttention", "GatedDeltaNet")
        shapes = ((1, 1), (32, 1), (1, 512), (1, 2048))
    results: dict = {"shape": {"key_heads": HK, "value_heads": HV, "d_k": DK, "d_v": DV}}
    for op in ops:
        for dtype in ("fp32", "fp16"):
            key = f"{op}/{dtype}"
            try:
                results[key] = run_case(op, dtype, provider, shapes, args.repeat)
            except Exception as e:  # noqa: BLE001 - recorded, the next case runs
                results[key] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}",
                                "trace": traceback.format_exc(limit=3)}
            print(key, json.dumps({k: v for k, v in results[key].items() if k != "trace"}),
                  flush=True)
    (args.out / "linear_attention_cuda.json").write_text(json.dumps(results, indent=1))
    return 0 if all(v.get("ok", True) for v in results.values() if isinstance(v, dict)) else 1


if __name__ == "__main__":
    raise SystemExit(main())

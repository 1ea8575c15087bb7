"""MatMulNBits on the device: every block size and a few row counts against numpy (the check),
and int4 at qwen3_8b's shapes timed with ONNX Runtime's default kernels against its fpA_intB ones
(the kernels part)."""

from __future__ import annotations

import gc
import time

import numpy as np

from benchmarks.core.timing import median_run_s


def matmulnbits_model(k: int, n: int, bits: int, block: int,
                      weights: list[dict[str, np.ndarray]] | None = None) -> bytes:
    """MatMulNBits nodes (fp16 activations, uint8 zero points) on one input ``x``. Without
    ``weights``: one node whose operands w, s, z are graph inputs; with them: a node per entry
    (outputs y0, y1, ...), its operands as initializers, which ONNX Runtime prepacks as it does a
    model folder's."""
    from onnx import TensorProto, helper, numpy_helper

    blocks = -(-k // block)
    specs = {"w": (TensorProto.UINT8, [n, blocks, block * bits // 8]),
             "s": (TensorProto.FLOAT16, [n * blocks]),
             "z": (TensorProto.UINT8, [n * (-(-blocks * bits // 8))])}
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["m", k])]
    nodes, inits, outputs = [], [], []
    for i, ops in enumerate(weights or [None]):
        names = {op: op if ops is None else f"{op}{i}" for op in specs}
        if ops is None:
            inputs += [helper.make_tensor_value_info(op, *specs[op]) for op in specs]
        else:
            inits += [numpy_helper.from_array(v, names[op]) for op, v in ops.items()]
        y = "y" if ops is None else f"y{i}"
        nodes.append(helper.make_node("MatMulNBits", ["x", names["w"], names["s"], names["z"]],
                                      [y], domain="com.microsoft", K=k, N=n, bits=bits,
                                      block_size=block, accuracy_level=0))
        outputs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT16, ["m", n]))
    graph = helper.make_graph(nodes, "mmnb", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9
    return model.SerializeToString()


def check_matmulnbits(provider: str) -> dict:
    import onnxruntime as ort
    import torch

    from llm_onnx.export import quant
    from llm_onnx.runtime.core.providers import CPU, CUDA

    providers = [CUDA, CPU] if provider == "cuda" else [CPU]
    rng = np.random.default_rng(0)
    results = {}
    k, n = 512, 384
    for bits in (4, 8):
        for block in (16, 32, 64, 128, 256):
            w = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32) * 0.05)
            q, s, z = quant.quantize(w, bits, block, asymmetric=True)
            deq = quant.dequantize(q, s.half().float(), bits, k, z).numpy()
            so = ort.SessionOptions()
            so.log_severity_level = 3
            sess = ort.InferenceSession(matmulnbits_model(k, n, bits, block), so,
                                        providers=providers)
            worst, errors = 0.0, []
            for m in (1, 3, 17):
                x = (rng.standard_normal((m, k)) * 0.5).astype(np.float16)
                try:
                    y = sess.run(None, {"x": x, "w": q.numpy(),
                                        "s": s.half().numpy().reshape(-1),
                                        "z": z.numpy().reshape(-1)})[0].astype(np.float32)
                except Exception as e:  # noqa: BLE001 - recorded per M
                    errors.append(f"M={m}: {str(e).strip().splitlines()[0][-160:]}")
                    continue
                ref = x.astype(np.float32) @ deq.T
                worst = max(worst, float(np.abs(y - ref).max() / max(1e-6, np.abs(ref).max())))
            key = f"int{bits}/block{block}"
            # Block 256 is outside what the exporter allows for CUDA targets (see ExportOptions).
            results[key] = {"relative_max_diff": worst, "errors": errors,
                            "ok": worst < 5e-3 and (not errors or block > 128),
                            "provider": sess.get_providers()[0]}
            print(f"matmulnbits {key}: {results[key]}", flush=True)
    return results


# qwen3_8b's projections (K, N) as the int4 export fuses them, and its LM head.
KERNEL_SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 24576),
                 "down": (12288, 4096), "lm_head": (4096, 151936)}


SMOKE_SHAPES = {"qkv": (256, 384), "down": (512, 256)}


def nbits_weights(k: int, n: int, bits: int, block: int, rng) -> dict[str, np.ndarray]:
    """Random MatMulNBits operands: packed codes (n, blocks, block*bits/8), fp16 scales and
    packed uint8 zero points, in the operator's layouts."""
    blocks = -(-k // block)
    return {"w": rng.integers(0, 256, (n, blocks, block * bits // 8), dtype=np.uint8),
            "s": (rng.random(n * blocks) * 0.02 + 1e-3).astype(np.float16),
            "z": rng.integers(0, 256, n * (-(-blocks * bits // 8)), dtype=np.uint8)}


def nbits_reference(x: np.ndarray, ops: dict[str, np.ndarray], k: int, bits: int, block: int,
                    rows: int) -> np.ndarray:
    """x @ W[:rows].T in float64 from the packed operands (low bits hold the earlier element)."""
    per = 8 // bits
    mask = (1 << bits) - 1
    w = ops["w"][:rows].reshape(rows, -1)
    codes = np.stack([(w >> (bits * i)) & mask for i in range(per)], -1).reshape(rows, -1)[:, :k]
    blocks = -(-k // block)
    z = ops["z"].reshape(-1, -(-blocks * bits // 8))[:rows]
    zp = np.stack([(z >> (bits * i)) & mask for i in range(per)], -1).reshape(rows, -1)[:, :blocks]
    scale = ops["s"].reshape(-1, blocks)[:rows].astype(np.float64)
    deq = (codes.astype(np.float64) - np.repeat(zp, block, 1)[:, :k]) * np.repeat(scale, block,
                                                                                   1)[:, :k]
    return x.astype(np.float64) @ deq.T


def bench_kernels(provider: str, shapes: dict[str, tuple[int, int]] | None = None,
                  blocks: tuple[int, ...] = (32, 64, 128), ms: tuple[int, ...] = (1, 8, 32),
                  target_bytes: int = 256 << 20, reps: int = 20) -> dict:
    """int4 MatMulNBits at qwen3_8b's shapes: microseconds per node and the weight bytes read
    per second, ONNX Runtime's default kernels against its fpA_intB ones
    (``ep.cuda.fpa_intb_gemm``), per block size and M. Each case runs enough copies of the node
    that their weights overflow the L2 cache, inputs and outputs bound on the device; each
    path's output is checked against numpy on the first 64 output rows."""
    import onnxruntime as ort

    from llm_onnx.runtime.core.engine import FPA_INTB_ENTRY
    from llm_onnx.runtime.core.providers import CPU, CUDA

    shapes = shapes or KERNEL_SHAPES
    device = "cuda" if provider == "cuda" else "cpu"
    providers = [CUDA, CPU] if provider == "cuda" else [CPU]
    rng = np.random.default_rng(0)
    results: dict = {}
    for name, (k, n) in shapes.items():
        for block in blocks:
            blocks_k = -(-k // block)
            nbytes = n * k // 2 + n * blocks_k * 2 + n * -(-blocks_k // 2)  # codes, scales, zps
            copies = max(1, min(16, target_bytes // nbytes))
            weights = [nbits_weights(k, n, 4, block, rng) for _ in range(copies)]
            model, ops = matmulnbits_model(k, n, 4, block, weights), weights[0]
            del weights
            for fpa in (False, True):
                key = f"{name}/block{block}/{'fpa_intb' if fpa else 'default'}"
                entry: dict = {"K": k, "N": n, "copies": copies, "weight_bytes": nbytes}
                try:
                    so = ort.SessionOptions()
                    so.log_severity_level = 3
                    so.add_session_config_entry(FPA_INTB_ENTRY, "1" if fpa else "0")
                    t0 = time.perf_counter()
                    sess = ort.InferenceSession(model, so, providers=providers)
                    entry["load_s"] = round(time.perf_counter() - t0, 2)
                    worst = 0.0
                    for m in ms:
                        x = (rng.standard_normal((m, k)) * 0.5).astype(np.float16)
                        io = sess.io_binding()
                        io.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x, device, 0))
                        for i in range(copies):
                            io.bind_output(f"y{i}", device)
                        us = median_run_s(sess, io, reps) / copies * 1e6
                        entry[f"us_m{m}"] = round(us, 2)
                        # three significant digits: a tiny test shape on a slow sample
                        # reads at a few MB/s, which one decimal rounded to 0
                        entry[f"gb_s_m{m}"] = float(f"{nbytes / us / 1e3:.3g}")
                        got = io.copy_outputs_to_cpu()[0][:, :64].astype(np.float64)
                        want = nbits_reference(x, ops, k, 4, block, 64)
                        worst = max(worst, float(np.abs(got - want).max()
                                                 / max(1e-6, np.abs(want).max())))
                    entry["relative_max_diff"] = worst
                    entry["ok"] = worst < 5e-3
                    del sess
                except Exception as e:  # noqa: BLE001 - recorded per case
                    entry["error"] = f"{type(e).__name__}: {str(e).strip()[:300]}"
                    entry["ok"] = False
                results[key] = entry
                print(f"kernels {key}: {entry}", flush=True)
            del model
            gc.collect()
    return results

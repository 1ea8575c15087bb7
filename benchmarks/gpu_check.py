"""The GPU check: one command that says whether the CUDA path works and how fast it is.

    python benchmarks/gpu_check.py --out DIR [--skip-speed] [--speed-only] [--models DIR]

On whatever CUDA GPU is present it runs, each part on its own (a failing part is recorded and
the next one runs):

  environment   onnxruntime, CUDA, cuDNN, driver and GPU versions
  placement     every precision x a dense (qwen3_tiny), an MoE (qwen3_moe_tiny) and an ALiBi
                (bloom_tiny) model: where ONNX Runtime puts each node, what the runtime decides
                (CUDA, or the CPU with its one-line reason), no compute node left on the CPU
  parity        fp16 and int4 (fp16 activations) exported for CUDA: the export's parity gate
                (torch vs ORT CPU, and torch vs the runtime on CUDA: 3 ragged prompts, batched
                decode), then the runtime on CUDA vs on the CPU over a batch of 2, a chat turn
                that reuses the cache, and a cache that grows; with and without CUDA graphs
  matmulnbits   MatMulNBits fp16, 4 and 8 bits, block sizes 16-256, M = 1, 3, 17, against numpy
  families      (only with --parts ...,families) the 2026 families' tiny models (qwen3_5 hybrid,
                its MoE, gpt_oss, gemma4, smollm3) exported for CUDA: placement of both graphs,
                parity on the device against the CPU with and without CUDA graphs, batch-1 decode
  kernels       (only with --parts ...,kernels) int4 MatMulNBits at qwen3_8b's shapes, blocks
                32/64/128, M = 1, 8, 32: microseconds and weight GB/s, ONNX Runtime's default
                kernels against its fpA_intB ones (RuntimeOptions.cuda_fpa_intb), each checked
                against numpy
  speed         qwen3_8b (random weights, full size), fp16 and int4: decode tok/s at batch 1, 8
                and 32 with and without CUDA graphs, prefill tok/s at 512 and 2048 tokens, time
                to first token, GPU memory, decode against the GPU's measured read bandwidth
  memory        GPU memory before and after 100 requests of varied size

It writes DIR/gpu_check.json and DIR/gpu_check.md. ``pytest -m gpu`` runs the correctness parts
(tests/gpu). ``--smoke`` runs the same code on the CPU with tiny sizes (how CI checks the
script itself; no GPU figures come out of it).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PRECISIONS = ("fp32", "fp16", "int8", "int4")
PLACEMENT_MODELS = ("qwen3_tiny", "qwen3_moe_tiny", "bloom_tiny")


# ----------------------------------------------------------------------------- environment

def environment() -> dict:
    import onnxruntime as ort

    from llm_onnx.runtime.core.providers import cuda_status

    env = {"python": platform.python_version(), "onnxruntime": ort.__version__,
           "providers": ort.get_available_providers(), "cuda_usable": list(cuda_status())}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        env["gpu"] = out.stdout.strip()
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
        for line in out.stdout.splitlines():
            if "CUDA Version" in line:
                env["driver_cuda"] = line.split("CUDA Version:")[1].split("|")[0].strip()
    except (OSError, subprocess.SubprocessError) as e:
        env["gpu"] = f"nvidia-smi unavailable ({e})"
    from importlib import metadata

    for dist in ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cudnn-cu13",
                 "nvidia-cublas", "nvidia-cublas-cu13", "onnxruntime-gpu", "torch"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            env[dist] = metadata.version(dist)
    with contextlib.suppress(Exception):
        import torch

        env["torch_cuda"] = torch.version.cuda
        env["torch_cudnn"] = torch.backends.cudnn.version()
    return env


def gpu_memory_mib() -> float | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                              "nounits"], capture_output=True, text=True, timeout=30)
        return float(out.stdout.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


# ----------------------------------------------------------------------------- exports

def export_tiny(name: str, precision: str, target: str, root: Path, max_len: int = 256) -> Path:
    from llm_onnx.checkpoints.load import random_checkpoint
    from llm_onnx.export import ExportOptions, export_model
    from llm_onnx.families import PRESETS

    out = root / f"{name}-{precision}-{target}"
    cfg = PRESETS[name]
    if cfg.moe is not None and target == "cuda":
        # CUDA QMoE needs expert widths in multiples of 64 (its interleaved K tile).
        from dataclasses import replace

        cfg = cfg.replace(moe=replace(cfg.moe, moe_intermediate_size=64))
    if not (out / "manifest.json").is_file():
        export_model(random_checkpoint(cfg, name), out,
                     ExportOptions(precision=precision, target=target, max_seq_len=max_len),
                     force=True, progress=False)
    return out


def raw_placement(path: Path, device_id: int = 0) -> dict:
    """Where ONNX Runtime puts each node of one graph on CUDA (its verbose log, captured)."""
    import onnxruntime as ort

    from llm_onnx.runtime.core.providers import CPU, CUDA, captured_output, parse_placement

    so = ort.SessionOptions()
    so.log_severity_level = 0
    with captured_output() as log:
        session = ort.InferenceSession(str(path), so,
                                       providers=[(CUDA, {"device_id": str(device_id)}), CPU])
    del session
    p = parse_placement(log())
    return {"found": p.found, "counts": p.counts, "compute_on_cpu": p.compute_on_cpu(),
            "cpu_nodes": sorted({op for op, _ in p.on(CPU)})}


# ----------------------------------------------------------------------------- parts

def check_placement(root: Path, provider: str) -> dict:
    from llm_onnx.errors import LlmOnnxError
    from llm_onnx.runtime.core.engine import Engine, RuntimeOptions

    results = {}
    for name in PLACEMENT_MODELS:
        for precision in PRECISIONS:
            key = f"{name}/{precision}"
            entry: dict = {}
            target = "cuda" if precision != "fp32" and name != "bloom_tiny" else "cpu"
            try:
                folder = export_tiny(name, precision, target, root)
                entry["target"] = target
                if provider == "cuda":
                    entry["ort"] = raw_placement(folder / "prefill.onnx")
                engine = Engine(folder, RuntimeOptions(provider="auto", check_placement=True))
                entry["runtime_provider"] = engine.provider
                entry["notes"] = engine.notes
                entry["placement"] = engine.placement
                del engine
                try:
                    Engine(folder, RuntimeOptions(provider="cuda"))
                    entry["provider_cuda"] = "loaded"
                except LlmOnnxError as e:
                    entry["provider_cuda"] = f"refused: {e}"
                expect_gpu = provider == "cuda" and target == "cuda"
                on_cpu = entry.get("ort", {}).get("compute_on_cpu", [])
                entry["ok"] = (not expect_gpu or (entry["runtime_provider"].startswith("CUDA")
                                                  and not on_cpu)) and \
                    (target == "cuda" or provider != "cuda"
                     or entry["provider_cuda"].startswith("refused"))
            except Exception as e:  # noqa: BLE001 - recorded, the next model runs
                entry.update(ok=False, error=f"{type(e).__name__}: {e}",
                             trace=traceback.format_exc(limit=3))
            results[key] = entry
            print(f"placement {key}: {'ok' if entry.get('ok') else 'FAIL'} "
                  f"{entry.get('runtime_provider', '')} {entry.get('placement', '')} "
                  f"{entry.get('ort', {}).get('compute_on_cpu', '')} {entry.get('error', '')}",
                  flush=True)
    return results


def _run_conversation(engine, vocab: int, seed: int = 0) -> list[np.ndarray]:
    """Batch of 2 ragged prompts, 6 decode steps together, then a second chat turn on row 0
    (a prefill continuing its past) after the cache grew, then 4 more steps of both rows.
    Tokens are fixed (teacher forcing), so two runs see the same inputs."""
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    cache = engine.new_cache(2, 24)
    lens = (13, 5)
    prompts = [rng.integers(0, vocab, n) for n in lens]
    out.append(np.stack([engine.prefill(cache, r, p) for r, p in enumerate(prompts)]))
    for _ in range(6):
        out.append(np.asarray(engine.decode(cache, rng.integers(0, vocab, 2))).copy())
    cache.grow(80)  # a conversation outgrowing its cache
    out.append(engine.prefill(cache, 0, rng.integers(0, vocab, 17))[None].copy())  # turn 2
    active = np.array([True, True])
    out.append(np.asarray(engine.decode(cache, rng.integers(0, vocab, 2), active)).copy())
    for _ in range(3):
        out.append(np.asarray(engine.decode(cache, rng.integers(0, vocab, 2))).copy())
    return out


def state_rewind(engine, vocab: int, seed: int = 1) -> dict:
    """Models with a recurrent state (Qwen3.5): the middle row of three checkpointed (one row's
    states copied out: on CUDA by cudaMemcpy at the row's offset), four steps decoded, the row
    cut back to the checkpoint (the copy written back) and the same four tokens decoded again
    alone: its logits must repeat, and the other rows' states must be untouched."""
    rng = np.random.default_rng(seed)
    cache = engine.new_cache(3, 32)
    for row, n in enumerate((7, 11, 4)):
        engine.prefill(cache, row, rng.integers(0, vocab, n))
    cache.checkpoint(1)
    steps = [rng.integers(0, vocab, 3) for _ in range(4)]
    first = [np.asarray(engine.decode(cache, t)).copy() for t in steps]
    cache.truncate(1, cache.length_of(1) - len(steps))
    again = [np.asarray(engine.decode(cache, t[1:2], first_row=1)).copy() for t in steps]
    diff = max(float(np.abs(a[1] - b[0]).max()) for a, b in zip(first, again))
    scale = max(1.0, max(float(np.abs(a[1]).max()) for a in first))
    after = np.asarray(engine.decode(cache, np.array([5, 5, 5]))).copy()  # rows 0, 2 go on
    return {"relative_max_diff": diff / scale, "row_copies": type(cache._row_io).__name__,
            "ok": diff / scale < 1e-3, "logits_after": after}


def check_parity(root: Path, provider: str) -> dict:
    results = {}
    for name in ("qwen3_tiny", "qwen3_moe_tiny"):
        for precision in ("fp16", "int4"):
            key = f"{name}/{precision}"
            try:
                entry = _parity_entry(export_tiny(name, precision, "cuda", root), provider)
            except Exception as e:  # noqa: BLE001
                entry = {"ok": False, "error": f"{type(e).__name__}: {e}",
                         "trace": traceback.format_exc(limit=4)}
            results[key] = entry
            print(f"parity {key}: {'ok' if entry.get('ok') else 'FAIL'} "
                  f"{json.dumps({k: v for k, v in entry.items() if k != 'trace'})[:600]}",
                  flush=True)
            gc.collect()
    return results


def _parity_entry(folder: Path, provider: str) -> dict:
    """The export's parity gate as recorded, then the runtime on ``provider`` against the
    runtime on the CPU over _run_conversation, without and with CUDA graphs."""
    from llm_onnx.model_folder import read_manifest
    from llm_onnx.runtime.core.engine import Engine, RuntimeOptions

    parity = read_manifest(folder).parity
    entry: dict = {"export_gate": {
        "cpu_relative_logits_diff": parity.relative_logits_diff,
        "cpu_kl": parity.kl_divergence,
        "cuda_relative_logits_diff": parity.cuda_relative_logits_diff,
        "cuda_kl": parity.cuda_kl_divergence,
        "cuda_greedy_agreement": parity.cuda_greedy_agreement}}
    vocab = read_manifest(folder).vocab_size
    ref = _run_conversation(Engine(folder, RuntimeOptions(provider="cpu")), vocab)
    for graphs in (False, True):
        engine = Engine(folder, RuntimeOptions(provider=provider, cuda_graph=graphs))
        got = _run_conversation(engine, vocab)
        diffs = [float(np.abs(a - b).max()) for a, b in zip(ref, got)]
        scale = max(1.0, max(float(np.abs(a).max()) for a in ref))
        agree = float(np.mean([(a.argmax(-1) == b.argmax(-1)).mean()
                               for a, b in zip(ref, got)]))
        entry[f"runtime_{'graphs' if graphs else 'no_graphs'}"] = {
            "relative_max_diff": max(diffs) / scale, "greedy_agreement": agree,
            "cuda_graph_used": bool(engine.cuda_graph), "notes": engine.notes,
            # per run of the conversation: prefill, 6 decode steps, turn 2, 4 decode steps
            "relative_diff_by_run": [round(d / scale, 6) for d in diffs],
            "logits_scale": scale}
        del engine
    entry["ok"] = all(v["relative_max_diff"] < 2e-2 for k, v in entry.items()
                      if k.startswith("runtime_"))
    return entry


# The 2026 families, tiny random checkpoints exported for CUDA: the hybrid
# linear attention (qwen3_5), its MoE form, attention sinks and clamped-SwiGLU experts (gpt_oss),
# Gemma 4's shared-KV and two-shape layers, and SmolLM3's no-RoPE layers.
FAMILY_CASES = (("qwen3_5_tiny", "fp16"), ("qwen3_5_tiny", "int4"), ("qwen3_5_moe_tiny", "int4"),
                ("gpt_oss_tiny", "fp16"), ("gpt_oss_tiny", "int4"), ("gemma4_tiny", "fp16"),
                ("gemma4_tiny", "int4"), ("smollm3_tiny", "fp16"))


def check_families(root: Path, provider: str, cases: tuple[tuple[str, str], ...] | None = None
                   ) -> dict:
    """Per new-family folder: where ONNX Runtime puts every node of both graphs, what the
    runtime decides, parity on the device against the CPU (with and without CUDA graphs), and
    batch-1 decode with CUDA graphs (a tiny model: the per-step cost of the host and the
    launches, not of the weights)."""
    from llm_onnx.model_folder import read_manifest
    from llm_onnx.runtime.core.engine import Engine, RuntimeOptions

    results = {}
    for name, precision in cases or FAMILY_CASES:
        key = f"{name}/{precision}"
        entry: dict = {}
        try:
            folder = export_tiny(name, precision, "cuda", root)
            if provider == "cuda":
                entry["ort"] = {g: raw_placement(folder / f"{g}.onnx")
                                for g in ("prefill", "decode") if (folder / f"{g}.onnx").is_file()}
            engine = Engine(folder, RuntimeOptions(provider="auto", check_placement=True))
            entry.update(runtime_provider=engine.provider, notes=engine.notes,
                         placement=engine.placement)
            del engine
            entry.update(_parity_entry(folder, provider))
            if read_manifest(folder).recurrent_state is not None:
                vocab = read_manifest(folder).vocab_size
                rewind = state_rewind(Engine(folder, RuntimeOptions(provider=provider)), vocab)
                cpu = state_rewind(Engine(folder, RuntimeOptions(provider="cpu")), vocab)
                got, ref = rewind.pop("logits_after"), cpu.pop("logits_after")
                rewind["after_vs_cpu"] = float(np.abs(got - ref).max()) / max(
                    1.0, float(np.abs(ref).max()))
                rewind["ok"] = rewind["ok"] and rewind["after_vs_cpu"] < 2e-2
                entry["state_rewind"] = rewind
                entry["ok"] = entry["ok"] and rewind["ok"]
            engine = Engine(folder, RuntimeOptions(provider=provider))
            entry["decode_tok_s_b1_graphs"] = _decode_rate(engine, 1, 32, 32,
                                                           read_manifest(folder).vocab_size)
            entry["cuda_graph_used"] = bool(engine.cuda_graph)
            del engine
            on_cpu = [op for g in entry.get("ort", {}).values() for op in g["compute_on_cpu"]]
            entry["ok"] = entry["ok"] and (provider != "cuda" or (
                entry["runtime_provider"].startswith("CUDA") and not on_cpu))
        except Exception as e:  # noqa: BLE001 - recorded, the next model runs
            entry.update(ok=False, error=f"{type(e).__name__}: {e}",
                         trace=traceback.format_exc(limit=4))
        results[key] = entry
        print(f"families {key}: {'ok' if entry.get('ok') else 'FAIL'} "
              f"{json.dumps({k: v for k, v in entry.items() if k != 'trace'}, default=str)[:700]}",
              flush=True)
        gc.collect()
    return results


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


# ----------------------------------------------------------------------------- kernels

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


def median_run_s(sess, io, reps: int, warmup: int = 3) -> float:
    """Median seconds of ``reps`` runs of an IO binding after ``warmup`` untimed ones, each
    timed until its outputs are synchronized (the kernels done, not just launched)."""
    for _ in range(warmup):
        sess.run_with_iobinding(io)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        sess.run_with_iobinding(io)
        io.synchronize_outputs()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


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


# ----------------------------------------------------------------------------- speed

def export_big(precision: str, root: Path, max_len: int, block: int = 32,
               tokenizer: Path | None = None) -> Path:
    """qwen3_8b at full size with random weights. ``tokenizer``: a folder whose tokenizer.json
    and tokenizer_config.json go with it (padded with unused special tokens to the model's
    vocabulary), so that text, chat and structured-output requests work on the random model."""
    from llm_onnx.checkpoints.load import random_checkpoint
    from llm_onnx.export import ExportOptions, export_model
    from llm_onnx.families import PRESETS

    quantized = precision in ("int8", "int4")
    out = root / (f"qwen3_8b-{precision}" + (f"-block{block}" if quantized and block != 32 else ""))
    if not (out / "manifest.json").is_file():
        t0 = time.perf_counter()
        checkpoint = random_checkpoint(PRESETS["qwen3_8b"], "qwen3_8b")
        if tokenizer is not None:
            checkpoint.tokenizer_files, checkpoint.eos_token_ids = padded_tokenizer(
                tokenizer, PRESETS["qwen3_8b"].vocab_size)
        export_model(checkpoint, out,
                     ExportOptions(precision=precision, target="cuda", max_seq_len=max_len,
                                   quant_method="minmax", validate=False, block_size=block),
                     force=True, progress=False)
        print(f"exported qwen3_8b {precision} in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def padded_tokenizer(folder: Path, vocab_size: int) -> tuple[dict[str, bytes], list[int]]:
    """A tokenizer folder's files with its vocabulary padded to ``vocab_size`` by plain tokens
    ("<u12345>") that no merge produces, so no text encodes to them, but a random model that
    picks one still streams visible text; and its end-of-sequence ids (from
    tokenizer_config.json's eos_token). Plain vocabulary entries, not added tokens: the
    constraint engine converts a vocabulary of 150,000 regular tokens in about a second, and
    took 105 s over 100,000 added ones."""
    spec = json.loads((folder / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    taken = set(vocab.values()) | {t["id"] for t in spec.get("added_tokens", [])}
    for i in range(vocab_size):
        if i not in taken:
            vocab[f"<u{i}>"] = i
    config = json.loads((folder / "tokenizer_config.json").read_text())
    eos = config.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    ids = {t["content"]: t["id"] for t in spec.get("added_tokens", [])} | vocab
    eos_ids = [ids[eos]] if eos in ids else []
    return ({"tokenizer.json": json.dumps(spec, ensure_ascii=False).encode(),
             "tokenizer_config.json": (folder / "tokenizer_config.json").read_bytes()}, eos_ids)


def _decode_rate(engine, batch: int, context: int, steps: int, vocab: int,
                 greedy: bool = False) -> float:
    """Decode tok/s of ``batch`` rows after ``context`` tokens each; ``greedy``: each step
    returns the rows' greedy ids where the engine picks on the device (Engine.decode), not
    their logits."""
    rng = np.random.default_rng(batch)
    cache = engine.new_cache(batch, context + steps + 8)
    for row in range(batch):
        engine.prefill(cache, row, rng.integers(0, vocab, context))
    tokens = rng.integers(0, vocab, batch)
    for _ in range(3):  # warm-up (and the graph capture)
        engine.decode(cache, tokens, greedy=greedy)
    start = time.perf_counter()
    for _ in range(steps):
        engine.decode(cache, tokens, greedy=greedy)
    return batch * steps / (time.perf_counter() - start)


def measure_speed(folder: Path, provider: str, batches: tuple[int, ...], steps: int,
                  prefills: tuple[int, ...], fpa_intb: bool | None = None,
                  graph_modes: tuple[bool, ...] = (True, False)) -> dict:
    """Decode, prefill, TTFT and memory of one folder; ``fpa_intb`` is
    RuntimeOptions.cuda_fpa_intb, ``graph_modes`` the CUDA-graph settings to load it with."""
    from llm_onnx.bench import DeviceBandwidthProbe
    from llm_onnx.model_folder import read_manifest
    from llm_onnx.runtime.core.engine import Engine, RuntimeOptions
    from llm_onnx.runtime.core.providers import CUDA

    m = read_manifest(folder)
    vocab = m.vocab_size
    weights = m.weights.bytes
    context = min(128, m.context_length - steps - 16)  # the prompt before the timed decode
    ttft_prompt = min(512, m.context_length - 8)
    prefills = tuple(t for t in prefills if t + 8 <= m.context_length)
    out: dict = {"weights_bytes": weights, "memory_before_mib": gpu_memory_mib(),
                 "cuda_fpa_intb": fpa_intb}
    for graphs in graph_modes:
        t0 = time.perf_counter()
        engine = Engine(folder, RuntimeOptions(provider=provider, cuda_graph=graphs,
                                               verify=False, cuda_fpa_intb=fpa_intb))
        label = "graphs" if graphs else "no_graphs"
        out[f"load_s_{label}"] = time.perf_counter() - t0
        out[f"memory_loaded_mib_{label}"] = gpu_memory_mib()
        out[f"notes_{label}"] = engine.notes
        out[f"cuda_graph_used_{label}"] = bool(engine.cuda_graph)
        for b in batches:
            try:
                out[f"decode_tok_s_b{b}_{label}"] = _decode_rate(engine, b, context, steps,
                                                                  vocab)
            except Exception as e:  # noqa: BLE001
                out[f"decode_tok_s_b{b}_{label}"] = f"failed: {type(e).__name__}: {e}"[:300]
            print(f"{folder.name} {label} batch {b}: {out[f'decode_tok_s_b{b}_{label}']}",
                  flush=True)
        if graphs:
            rng = np.random.default_rng(1)
            for t in prefills:
                cache = engine.new_cache(1, t + 8)
                engine.prefill(cache, 0, rng.integers(0, vocab, t))  # warm-up of this shape
                cache.truncate(0, 0)
                start = time.perf_counter()
                engine.prefill(cache, 0, rng.integers(0, vocab, t))
                out[f"prefill_tok_s_{t}"] = t / (time.perf_counter() - start)
            cache = engine.new_cache(1, ttft_prompt + 8)
            start = time.perf_counter()
            engine.prefill(cache, 0, rng.integers(0, vocab, ttft_prompt))
            engine.decode(cache, np.array([1]))
            out[f"ttft_ms_{ttft_prompt}"] = (time.perf_counter() - start) * 1e3
            out["memory_after_mib"] = gpu_memory_mib()
        refused = graphs and not engine.cuda_graph
        del engine
        gc.collect()
        if refused:  # ORT refused capture: a second load would measure the same thing
            out["no_graphs_same_as_graphs"] = True
            break
    if provider == "cuda":
        probe = DeviceBandwidthProbe(CUDA, 0, total_bytes=2 << 30)
        bw = probe.measure(repeat=10)
        probe.close()
        out["read_bandwidth_gb_s"] = bw / 1e9
        # Batch-1 decode reads every weight once per token (the embedding reads a row only).
        emb = m.config.vocab_size * m.config.hidden_size * (2 if m.precision.precision == "fp16"
                                                            else 1.0625)
        read = weights - (0 if m.config.tie_word_embeddings else emb)
        out["bytes_per_token_b1"] = read
        out["ceiling_tok_s_b1"] = bw / read
        best = max(v for k, v in out.items() if k.startswith("decode_tok_s_b1_")
                   and isinstance(v, float))
        out["decode_b1_of_ceiling"] = best / out["ceiling_tok_s_b1"]
    return out


def memory_after_requests(folder: Path, provider: str, requests: int) -> dict:
    from llm_onnx.runtime.model import Model

    model = Model.load(folder, provider=provider, verify=False)
    rng = np.random.default_rng(2)
    vocab = model.engine.vocab_size
    before = gpu_memory_mib()
    samples = []
    start = time.perf_counter()
    for i in range(requests):
        longest = min(600, model.engine.context_length - 32)
        prompt = [int(t) for t in rng.integers(0, vocab, int(rng.integers(8, longest)))]
        model.generate(prompt, max_new_tokens=int(rng.integers(2, 24)))
        if i % 10 == 9:
            samples.append(gpu_memory_mib())
    return {"requests": requests, "seconds": time.perf_counter() - start,
            "memory_before_mib": before, "memory_samples_mib": samples,
            "memory_after_mib": gpu_memory_mib()}


# ----------------------------------------------------------------------------- report

def write_report(out: Path, results: dict) -> None:
    (out / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
    lines = ["# GPU check", "", f"Run: {results.get('started')}", ""]
    env = results.get("environment", {})
    lines += ["## Environment", ""] + [f"- {k}: {v}" for k, v in env.items()] + [""]
    for part in ("placement", "parity", "matmulnbits", "families", "kernels"):
        rows = results.get(part)
        if not isinstance(rows, dict):
            continue
        lines += [f"## {part}", "", "| case | ok | details |", "| --- | --- | --- |"]
        for case, entry in rows.items():
            if not isinstance(entry, dict):
                lines.append(f"| {case} | | {entry} |")
                continue
            details = {k: v for k, v in entry.items() if k not in ("ok", "trace")}
            lines.append(f"| {case} | {'yes' if entry.get('ok') else 'NO'} | "
                         f"{json.dumps(details, default=str)[:700].replace('|', '/')} |")
        lines.append("")
    for part in ("speed", "memory"):
        rows = results.get(part)
        if isinstance(rows, dict):
            lines += [f"## {part}", "", "```", json.dumps(rows, indent=1, default=str), "```", ""]
    errors = results.get("errors", {})
    if errors:
        lines += ["## errors", ""] + [f"- {k}: {v}" for k, v in errors.items()] + [""]
    (out / "gpu_check.md").write_text("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Example: python benchmarks/gpu_check.py --out gpu-report")
    ap.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json/.md")
    ap.add_argument("--models", type=Path, help="where the exports go (default: a temp folder)")
    ap.add_argument("--skip-speed", action="store_true", help="correctness parts only")
    ap.add_argument("--speed-only", action="store_true", help="the qwen3_8b speed part only")
    ap.add_argument("--precisions", default="fp16,int4", help="speed part's precisions")
    ap.add_argument("--parts", default="placement,parity,matmulnbits",
                    help="parts before the speed part, comma-separated: placement, parity, "
                         "matmulnbits, families (the 2026 families' tiny models: placement, "
                         "parity, batch-1 decode), and kernels (int4 MatMulNBits timings at qwen3_8b's "
                         "shapes, ORT's default vs fpA_intB kernels, blocks 32/64/128; a few "
                         "minutes, so not in the default list)")
    ap.add_argument("--export-only", action="store_true",
                    help="only export the speed part's models into --models (e.g. in the "
                         "background while the correctness parts run)")
    ap.add_argument("--family-cases", default="",
                    help="families part: only these NAME/PRECISION cases, comma-separated "
                         "(default: all of FAMILY_CASES)")
    ap.add_argument("--requests", type=int, default=100, help="memory part's request count")
    ap.add_argument("--fpa-intb", choices=("off", "on", "both"), default="both",
                    help="speed part, quantized folders: ONNX Runtime's default MatMulNBits "
                         "kernels (off), its fpA_intB ones (on), or both (the fpA_intB run with "
                         "CUDA graphs only)")
    ap.add_argument("--block-size", type=int, default=32,
                    help="speed part: quantization block of the int8/int4 qwen3_8b exports")
    ap.add_argument("--smoke", action="store_true",
                    help="run on the CPU with tiny sizes (checks the script, measures nothing)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    root = args.models or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    root.mkdir(parents=True, exist_ok=True)
    provider = "cpu" if args.smoke else "cuda"
    results: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "errors": {}}
    failed = False

    def part(name: str, fn, *fargs):
        nonlocal failed
        try:
            results[name] = fn(*fargs)
            if isinstance(results[name], dict) and any(
                    isinstance(v, dict) and v.get("ok") is False for v in results[name].values()):
                failed = True
        except Exception as e:  # noqa: BLE001 - every part runs
            failed = True
            results["errors"][name] = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}"
            print(f"{name} FAILED: {e}", flush=True)
        write_report(args.out, results)

    if args.export_only:
        for p in args.precisions.split(","):
            export_big(p, root, 4096, args.block_size)
        return 0
    part("environment", environment)
    if not args.smoke and not results["environment"].get("cuda_usable", [False])[0]:
        print(f"no usable CUDA GPU: {results['environment'].get('cuda_usable')}", flush=True)
        return 2
    if not args.speed_only:
        wanted = args.parts.split(",")
        if "placement" in wanted:
            part("placement", check_placement, root, provider)
        if "parity" in wanted:
            part("parity", check_parity, root, provider)
        if "matmulnbits" in wanted:
            part("matmulnbits", check_matmulnbits, provider)
        if "families" in wanted:
            cases = tuple(tuple(c.split("/")) for c in args.family_cases.split(",") if c)
            part("families", check_families, root, provider, cases or None)
        if "kernels" in wanted:
            part("kernels", bench_kernels, provider, SMOKE_SHAPES if args.smoke else None)
    if not args.skip_speed:
        if args.smoke:
            folders = {p: export_tiny("qwen3_tiny", p, "cuda", root) for p in ("fp16", "int4")}
            batches, steps, prefills = (1, 2), 4, (16, 32)
        else:
            folders = {p: export_big(p, root, 4096, args.block_size)
                       for p in args.precisions.split(",")}
            batches, steps, prefills = (1, 8, 32), 64, (512, 2048)
        runs = []  # (label, folder, fpa_intb, graph modes)
        for precision, folder in folders.items():
            quantized = precision in ("int8", "int4")
            if args.fpa_intb != "on" or not quantized:
                runs.append((precision, folder, None, (True, False)))
            if args.fpa_intb != "off" and quantized:
                runs.append((f"{precision}+fpa_intb", folder, True,
                             (True,) if args.fpa_intb == "both" else (True, False)))
        speed = {}
        for label, folder, fpa, modes in runs:
            try:
                speed[label] = measure_speed(folder, provider, batches, steps, prefills,
                                             fpa_intb=fpa, graph_modes=modes)
            except Exception as e:  # noqa: BLE001
                failed = True
                speed[label] = f"failed: {type(e).__name__}: {e}"
            results["speed"] = speed
            write_report(args.out, results)
        last = folders[list(folders)[-1]]
        part("memory", memory_after_requests, last, provider,
             args.requests if not args.smoke else 5)
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    write_report(args.out, results)
    print(f"report: {args.out / 'gpu_check.md'}; {'FAILURES' if failed else 'all parts passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

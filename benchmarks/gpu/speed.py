"""The GPU check's speed and memory parts: decode at several batches with and without CUDA
graphs, prefill, time to first token and GPU memory of one folder, against the device's measured
read bandwidth; and GPU memory over many requests of varied size."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import numpy as np

from benchmarks.gpu.device import decode_rate, gpu_memory_mib


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
                out[f"decode_tok_s_b{b}_{label}"] = decode_rate(engine, b, context, steps,
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

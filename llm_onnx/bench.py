"""`llm-onnx bench`: time to first token, prefill and decode speed, memory, and the decode speed
the machine's memory bandwidth allows.

Decode of a small batch is bound by reading the weights once per token, so the ceiling is
(measured read bandwidth) / (bytes read per token). The bandwidth is measured here, with the same
number of threads, by summing a buffer much larger than the caches, right after each timed run
(the bandwidth of a VM drifts with its neighbours' load).
"""

from __future__ import annotations

import base64
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.core.engine import default_threads
from llm_onnx.runtime.core.providers import CPU, CUDA, quiet_session_options
from llm_onnx.runtime.generation.results import Result
from llm_onnx.runtime.model import Model
from llm_onnx.weight_bytes import weight_bytes_read

BANDWIDTH_BYTES = 1 << 30  # 1 GiB: far beyond any cache


@dataclass
class BenchConfig:
    prompt_len: int = 128
    new_tokens: int = 128
    batch: int = 1
    repeat: int = 3
    prompt_ids: list[int] | None = None
    seed: int = 0


@dataclass
class BenchResult:
    data: dict[str, Any] = field(default_factory=dict)

    def table(self) -> str:
        d = self.data
        rows = [("time to first token", "ttft_s", 1000, "ms"),
                ("prefill", "prefill_tok_s", 1, "tok/s"),
                ("decode", "decode_tok_s", 1, "tok/s")]
        lines = [f"{d['model']} [{d['precision']}] on {d['provider']}, {d['threads']} threads; "
                 f"batch {d['batch']}, prompt {d['prompt_len']}, {d['new_tokens']} new tokens, "
                 f"{d['repeat']} runs",
                 f"{'':<22}{'median':>10}{'min':>10}{'max':>10}"]
        for label, key, scale, unit in rows:
            s = d[key]
            lines.append(f"{label:<22}{s['median'] * scale:>10.1f}{s['min'] * scale:>10.1f}"
                         f"{s['max'] * scale:>10.1f}  {unit}")
        if d.get("host_us_per_step"):
            h = d["host_us_per_step"]
            lines.append(f"{'host between steps':<22}{h['median']:>10.1f}{h['min']:>10.1f}"
                         f"{h['max']:>10.1f}  us (sampling, text, bookkeeping)")
        where = "GPU" if d["provider"] == CUDA else f"{d['threads']} threads"
        bw = d["memory_bandwidth_samples_gb_s"]
        lines += [f"{'load':<22}{d['load_s']:>10.2f} s",
                  f"{'peak RSS':<22}{d['peak_rss_mib']:>10.0f} MiB (weights {d['weight_bytes'] / 2**20:.0f} MiB)",
                  f"{'cache a row':<22}{d['row_bytes'] / 2**20:>10.1f} MiB at "
                  f"{d['prompt_len'] + d['new_tokens']} positions "
                  f"({d['kv_bytes_per_position'] / 1024:.1f} KiB a position, {d['kv_cache_dtype']}"
                  + (f", {d['state_bytes_per_row'] / 2**20:.1f} MiB of recurrent state with its "
                     "checkpoints" if d["state_bytes_per_row"] else "") + ")",
                  f"{'read bandwidth':<22}{d['memory_bandwidth_gb_s']:>10.1f} GB/s "
                  f"({where}; {min(bw):.1f}-{max(bw):.1f} over the runs)",
                  f"{'decode ceiling':<22}{d['decode_ceiling_tok_s']:>10.1f} tok/s "
                  f"({d['decode_ceiling_reached'] * 100:.0f}% reached)"]
        return "\n".join(lines)


class BandwidthProbe:
    """Sustained read bandwidth in bytes/s with ``threads`` threads: numpy reductions (they
    release the GIL) over a buffer far beyond any cache, ``repeat`` passes alternating sum and
    max; the median pass of the faster reduction. Not the best pass: on a VM single passes burst
    to 1.5x what the memory sustains for the seconds a decode runs (measured here: 35-60 GB/s
    passes, 29-39 GB/s read by fp32 decode's weight kernels). The buffer is allocated once, so
    the probe can run between timed generations: this machine's bandwidth drifts over seconds
    (a VM shares it with its neighbours), and a ceiling measured beside each run tracks that."""

    def __init__(self, threads: int, total_bytes: int = BANDWIDTH_BYTES) -> None:
        n = total_bytes // 4 // threads
        self.parts = [np.ones(n, dtype=np.float32) for _ in range(threads)]
        self.bytes = n * 4 * threads
        self.pool = ThreadPoolExecutor(threads)
        self.label = f"numpy sum/max over {self.bytes / 2**30:g} GiB of host memory, {threads} threads"

    def measure(self, repeat: int = 8) -> float:
        rates: dict[int, list[float]] = {0: [], 1: []}
        for i in range(repeat):
            start = time.perf_counter()
            list(self.pool.map(np.max if i % 2 else np.sum, self.parts))
            rates[i % 2].append(self.bytes / (time.perf_counter() - start))
        return max(statistics.median(r) for r in rates.values() if r)

    def close(self) -> None:
        self.pool.shutdown()
        self.parts = []


# ReduceSum(x: float[n]) -> y: float (opset 13, all axes, keepdims 0): the GPU probe's model.
_REDUCE_MODEL = base64.b64decode(
    "CAc6TgoiCgF4EgF5IglSZWR1Y2VTdW0qDwoIa2VlcGRpbXMYAKABAhIJYmFuZHdpZHRoWhAKAXgSCwoJCAESBQoD"
    "EgFuYgsKAXkSBgoECAESAEIECgAQDQ==")


class DeviceBandwidthProbe:
    """The GPU's read bandwidth: ONNX Runtime ReduceSum over a buffer in device memory (bound
    with IO binding, so nothing crosses PCIe), median of ``repeat`` timed runs. With a CPU
    provider it reads host memory through ONNX Runtime's own thread pool (how it is tested)."""

    def __init__(self, provider: str = CUDA, device_id: int = 0, threads: int = 1,
                 total_bytes: int = BANDWIDTH_BYTES) -> None:
        so = quiet_session_options()
        so.intra_op_num_threads = threads
        providers: list = [(CUDA, {"device_id": device_id}), CPU] if provider == CUDA else [CPU]
        self.session = ort.InferenceSession(_REDUCE_MODEL, so, providers=providers)
        if provider not in self.session.get_providers():
            raise GenerationError(f"the bandwidth probe's {provider} session fell back to "
                                  f"{self.session.get_providers()[0]}.")
        n = total_bytes // 4
        device = "cuda" if provider == CUDA else "cpu"
        self.x = (ort.OrtValue.ortvalue_from_shape_and_type((n,), np.float32, device, device_id)
                  if device == "cuda" else ort.OrtValue.ortvalue_from_numpy(np.ones(n, np.float32)))
        self.y = ort.OrtValue.ortvalue_from_shape_and_type((), np.float32, device, device_id)
        self.binding = self.session.io_binding()
        self.binding.bind_ortvalue_input("x", self.x)
        self.binding.bind_ortvalue_output("y", self.y)
        self.bytes = n * 4
        self.label = (f"ONNX Runtime ReduceSum over {self.bytes / 2**30:g} GiB of "
                      f"{'GPU' if device == 'cuda' else 'host'} memory")
        self.session.run_with_iobinding(self.binding)  # warm-up: kernels loaded, memory touched

    def measure(self, repeat: int = 8) -> float:
        rates = []
        for _ in range(repeat):
            start = time.perf_counter()
            self.session.run_with_iobinding(self.binding)  # returns when the device is done
            rates.append(self.bytes / (time.perf_counter() - start))
        return statistics.median(rates)

    def close(self) -> None:
        self.binding = self.x = self.y = self.session = None


def bandwidth_probe(model: Model, threads: int) -> BandwidthProbe | DeviceBandwidthProbe:
    """Host memory for the CPU provider, the GPU's memory for CUDA (where the weights live)."""
    engine = model.engine
    if engine.device == "cuda":
        return DeviceBandwidthProbe(CUDA, engine.options.cuda_device)
    return BandwidthProbe(threads)


def bytes_per_token(model: Model, context: int, batch: int) -> int:
    """Bytes a decode step of ``batch`` rows reads: the weights it reads (weight_bytes_read)
    plus the KV cache at ``context`` positions and a hybrid model's recurrent states."""
    engine = model.engine
    state = engine.state_layout.row_bytes if engine.state_layout is not None else 0
    return weight_bytes_read(engine.manifest, batch) + \
        (engine.kv_bytes_per_position * context + state) * batch


def _prompt(model: Model, cfg: BenchConfig) -> list[int]:
    if cfg.prompt_ids is not None:
        return list(cfg.prompt_ids)
    rng = np.random.default_rng(cfg.seed)
    vocab = model.engine.vocab_size
    low = min(100, vocab // 2)  # skip the special tokens at the start of most vocabularies
    return rng.integers(low, vocab, cfg.prompt_len).tolist()


def peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB elsewhere


def batch_rates(results: list[Result]) -> tuple[float, float, float]:
    """(time to first token, prefill tok/s, decode tok/s) of a batch generated together, all rows
    counted. The rows' prompts run one after the other, then every row decodes in the same
    steps: prefill ends with the last row's first token, and the decode window that excludes the
    other rows' prefill is the shortest (the last row's)."""
    prefill_s = max(r.timings.prefill_s for r in results)
    decode_s = min(r.timings.decode_s for r in results)
    prefill = sum(r.timings.prefill_tokens for r in results) / prefill_s if prefill_s > 0 else 0.0
    decode = sum(r.timings.decode_tokens for r in results) / decode_s if decode_s > 0 else 0.0
    return results[0].timings.ttft_s, prefill, decode


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def run_bench(model: Model, cfg: BenchConfig, rss_before_load_mib: float | None = None,
              ) -> BenchResult:
    """``rss_before_load_mib``: the process's own footprint (Python, ORT, numpy), taken by the
    caller before loading, so peak RSS above it can be compared with weights and KV cache."""
    prompt = _prompt(model, cfg)
    if len(prompt) + cfg.new_tokens > model.context_length:
        raise GenerationError(f"prompt {len(prompt)} + {cfg.new_tokens} new tokens exceed the "
                              f"model's context of {model.context_length}.")
    prompts = [prompt] * cfg.batch
    options = model.options(None, {"max_new_tokens": cfg.new_tokens, "temperature": 0.0,
                                   "ignore_eos": True})
    model.generate(prompts, options, max_new_tokens=min(8, cfg.new_tokens))  # warm-up
    threads = model.engine.options.threads or default_threads()
    per_token = bytes_per_token(model, len(prompt) + cfg.new_tokens // 2, cfg.batch)
    ttft, prefill, decode, bandwidth, host = [], [], [], [], []
    peak_rss = None
    probe = None
    engine = model.engine
    try:
        for _ in range(cfg.repeat):
            gaps = (getattr(engine, "decode_gap_s", None), getattr(engine, "decode_gaps", 0))
            results = model.generate(prompts, options)
            if gaps[0] is not None and engine.decode_gaps > gaps[1]:
                host.append((engine.decode_gap_s - gaps[0]) / (engine.decode_gaps - gaps[1]))
            first, prefill_rate, decode_rate = batch_rates(results)
            ttft.append(first)
            prefill.append(prefill_rate)
            decode.append(decode_rate)
            if probe is None:
                # Every run allocates the same cache, so the first one has reached the peak;
                # read it before the probe's buffer exists.
                peak_rss = peak_rss_mib()
                probe = bandwidth_probe(model, threads)
            bandwidth.append(probe.measure())  # right after the run it is compared with
    finally:
        if probe is not None:
            probe.close()
    ceilings = [bw / per_token * cfg.batch for bw in bandwidth]
    m = model.engine.manifest
    return BenchResult({
        "model": m.name, "folder": str(m.folder),
        "precision": m.precision.precision, "provider": model.engine.provider,
        "threads": threads, "batch": cfg.batch, "prompt_len": len(prompt),
        "new_tokens": cfg.new_tokens, "repeat": cfg.repeat, "load_s": model.load_s,
        "speculative": getattr(getattr(model, "speculative", None), "method", "off"),
        "ttft_s": _stats(ttft), "prefill_tok_s": _stats(prefill), "decode_tok_s": _stats(decode),
        # the host's time between two decode runs with no other run between them (sampling,
        # text, the engine's bookkeeping; a speculative step's verify run resets it): what a
        # decode step costs besides ONNX Runtime's run; None if no two runs followed each other
        "host_us_per_step": _stats([1e6 * h for h in host]) if host else None,
        "peak_rss_mib": peak_rss, "rss_before_load_mib": rss_before_load_mib,
        "weight_bytes": m.weights.bytes,
        "memory_bandwidth_gb_s": statistics.median(bandwidth) / 1e9,
        "bandwidth_probe": probe.label,  # repeat >= 1: the probe exists (closed, label kept)
        "memory_bandwidth_samples_gb_s": [bw / 1e9 for bw in bandwidth],
        "bytes_per_token": per_token,
        # what a row of the cache holds: per position, whatever its length (a recurrent state
        # with its checkpoints), and at this run's longest (prompt + new tokens)
        "kv_bytes_per_position": model.engine.kv_bytes_per_position,
        "kv_cache_dtype": m.kv_cache.dtype,
        "state_bytes_per_row": model.engine.state_bytes_per_row,
        "row_bytes": model.engine.row_bytes(len(prompt) + cfg.new_tokens),
        "weight_bytes_per_token": weight_bytes_read(m),  # batch 1, without the KV cache
        "decode_ceiling_tok_s": statistics.median(ceilings),
        # each run against the ceiling measured right after it, then the median
        "decode_ceiling_reached": statistics.median(d / c for d, c in zip(decode, ceilings)),
    })


CURVE_CONTEXTS = (128, 512, 1024, 2048)
CURVE_BATCHES = (1, 2, 4)


def curve_contexts(context_length: int, tokens: int = 32) -> list[int]:
    """The context lengths ``--plot`` measures: CURVE_CONTEXTS that fit with ``tokens`` more,
    or, for a model with a shorter context, a quarter, half and all of what fits."""
    room = context_length - tokens
    fits = [c for c in CURVE_CONTEXTS if c <= room]
    return fits or sorted({c for c in (room // 4, room // 2, room) if c >= 1})


def decode_curve(model: Model, contexts: list[int], batches: list[int], tokens: int = 32,
                 ) -> list[dict[str, float]]:
    """Decode tok/s for each (context length, batch): the data behind ``--plot``."""
    out = []
    for batch in batches:
        for context in contexts:
            if context + tokens > model.context_length:
                continue
            cfg = BenchConfig(prompt_len=context, new_tokens=tokens, batch=batch, repeat=1)
            prompts = [_prompt(model, cfg)] * batch
            r = model.generate(prompts, max_new_tokens=tokens, temperature=0.0, ignore_eos=True)
            out.append({"batch": batch, "context": context, "decode_tok_s": batch_rates(r)[2]})
    return out


def pyplot() -> Any:
    """matplotlib's pyplot (headless), or the one-line error: asked for before any measuring."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise GenerationError("--plot needs matplotlib: pip install '.[bench]' in the checkout.") from e
    return plt


def plot_curve(points: list[dict[str, float]], path: Path, title: str) -> None:
    """Draw the curve into ``path`` through a temporary file beside it: no half-written PNG."""
    if not points:
        raise GenerationError("--plot: no context length fits this model's context.")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for batch in sorted({p["batch"] for p in points}):
        xs = [p["context"] for p in points if p["batch"] == batch]
        ys = [p["decode_tok_s"] for p in points if p["batch"] == batch]
        ax.plot(xs, ys, marker="o", label=f"batch {batch}")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("decode tokens/s (all rows)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial")
    try:
        fig.savefig(tmp, dpi=120, format="png")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)


# Ops that read the model's weights (their kernel time over the bytes read per token is the
# bandwidth the kernels reach); everything else works on activations or the KV cache.
WEIGHT_OPS = frozenset({"MatMulNBits", "MatMul", "FusedMatMul", "Gemm", "MatMulInteger",
                        "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QMoE", "MoE"})


def profile_model(folder: Path | str, cfg: BenchConfig, threads: int | None = None,
                  provider: str = "auto", steps: int = 16) -> dict[str, Any]:
    """Where the time of one prefill and of a decode step goes, from ONNX Runtime's profiler:
    a fresh session (the profiler slows every node a little, so the timed runs never use it),
    one warm-up generation, then one generation of ``steps`` tokens whose ``steps`` runs (one
    prefill, ``steps - 1`` decode steps) are summarised by op type."""
    steps = max(2, min(steps, cfg.new_tokens))
    with tempfile.TemporaryDirectory(prefix="llm-onnx-profile-") as tmp:
        model = Model.load(folder, provider=provider, threads=threads, profile_dir=tmp)
        prompts = [_prompt(model, cfg)] * cfg.batch
        model.generate(prompts, max_new_tokens=2, temperature=0.0, ignore_eos=True)
        model.generate(prompts, max_new_tokens=steps, temperature=0.0, ignore_eos=True)
        events = [e for f in model.engine.end_profiling()
                  for e in json.loads(f.read_text(encoding="utf-8"))]
    out = summarize_profile(events, steps)
    out["provider"] = model.engine.provider
    return out


def summarize_profile(events: list[dict[str, Any]], runs: int) -> dict[str, Any]:
    """ONNX Runtime trace events -> {"prefill": phase, "decode": phase per step}; the last
    ``runs`` model runs are one generation (the first of them its prefill). A phase holds the
    run's wall time, the time inside nodes, the rest ("outside_ms": the executor between nodes,
    binding) and each op type's time and node count, largest first."""
    model_runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    if len(model_runs) < runs:
        raise GenerationError(f"the profile holds {len(model_runs)} model runs, expected {runs}.")
    model_runs = model_runs[-runs:]
    nodes = sorted((e for e in events if e.get("cat") == "Node"
                    and str(e.get("name", "")).endswith("_kernel_time")), key=lambda e: e["ts"])

    def phase(selected: list[dict[str, Any]]) -> dict[str, Any]:
        ops: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        run_us = node_us = 0.0
        for run in selected:
            start, end = run["ts"], run["ts"] + run["dur"]
            run_us += run["dur"]
            for e in nodes:
                if start <= e["ts"] <= end:
                    op = e.get("args", {}).get("op_name", "?")
                    ops[op][0] += e["dur"]
                    ops[op][1] += 1
                    node_us += e["dur"]
        n = len(selected)
        return {
            "runs": n, "run_ms": run_us / n / 1e3, "node_ms": node_us / n / 1e3,
            "outside_ms": (run_us - node_us) / n / 1e3,
            "weight_ms": sum(d for op, (d, _) in ops.items() if op in WEIGHT_OPS) / n / 1e3,
            "ops": [{"op": op, "ms": d / n / 1e3, "nodes": c / n}
                    for op, (d, c) in sorted(ops.items(), key=lambda kv: -kv[1][0])],
        }

    return {"prefill": phase(model_runs[:1]), "decode": phase(model_runs[1:])}


def add_profile(result: BenchResult, profile: dict[str, Any]) -> None:
    """Attach a profile to a bench result, with the bandwidth the weight kernels reach in a
    decode step (weight bytes read per token / their kernel time) beside the machine's. Not on
    CUDA: there the profiler's node times are kernel launches on the host, not the kernels."""
    d = result.data
    weight_ms = profile["decode"]["weight_ms"]
    if weight_ms > 0 and profile.get("provider") != CUDA:
        profile["decode"]["weight_read_gb_s"] = (d["weight_bytes_per_token"] / (weight_ms / 1e3)
                                                 / 1e9)
    d["profile"] = profile


def profile_table(profile: dict[str, Any], bandwidth_gb_s: float | None = None, top: int = 8,
                  ) -> str:
    pre, dec = profile["prefill"], profile["decode"]
    lines = [f"profile (ONNX Runtime profiler; one prefill, mean of {dec['runs']} decode steps; "
             f"the profiler itself adds a little to every node)",
             f"{'':<34}{'prefill ms':>11}{'share':>7}{'nodes':>7}{'decode ms':>11}{'share':>7}"
             f"{'nodes':>7}"]
    by_op = {o["op"]: o for o in dec["ops"]}
    pre_op = {o["op"]: o for o in pre["ops"]}
    order = [o["op"] for o in pre["ops"]] + [o["op"] for o in dec["ops"] if o["op"] not in pre_op]

    def cells(o: dict[str, Any] | None, ph: dict[str, Any]) -> str:
        if o is None:
            return f"{'-':>11}{'':>7}{'':>7}"
        return f"{o['ms']:>11.3f}{o['ms'] / ph['run_ms']:>7.1%}{o['nodes']:>7.0f}"

    for op in order[:top]:
        lines.append(f"{op:<34}{cells(pre_op.get(op), pre)}{cells(by_op.get(op), dec)}")
    rest = order[top:]
    if rest:
        lines.append(f"{f'{len(rest)} other op types':<34}"
                     + cells({"ms": sum(pre_op[o]["ms"] for o in rest if o in pre_op),
                              "nodes": sum(pre_op[o]["nodes"] for o in rest if o in pre_op)}, pre)
                     + cells({"ms": sum(by_op[o]["ms"] for o in rest if o in by_op),
                              "nodes": sum(by_op[o]["nodes"] for o in rest if o in by_op)}, dec))
    lines.append(f"{'outside nodes (executor, binding)':<34}"
                 f"{pre['outside_ms']:>11.3f}{pre['outside_ms'] / pre['run_ms']:>7.1%}{'':>7}"
                 f"{dec['outside_ms']:>11.3f}{dec['outside_ms'] / dec['run_ms']:>7.1%}")
    lines.append(f"{'whole run':<34}{pre['run_ms']:>11.3f}{'':>14}{dec['run_ms']:>11.3f}")
    if "weight_read_gb_s" in dec:
        lines.append(f"weight kernels ({', '.join(sorted({o['op'] for o in dec['ops']} & WEIGHT_OPS))}) "
                     f"take {dec['weight_ms']:.2f} of a {dec['run_ms']:.2f} ms decode step and read "
                     f"the weights at {dec['weight_read_gb_s']:.1f} GB/s"
                     + (f" (the machine reads {bandwidth_gb_s:.1f} GB/s)" if bandwidth_gb_s else ""))
    return "\n".join(lines)


def to_json(result: BenchResult) -> str:
    return json.dumps(result.data, indent=2)

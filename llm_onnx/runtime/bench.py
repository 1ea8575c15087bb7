"""`llm-onnx bench`: time to first token, prefill and decode speed, memory, and the decode speed
the machine's memory bandwidth allows.

Decode of a small batch is bound by reading the weights once per token, so the ceiling is
(measured read bandwidth) / (bytes read per token). The bandwidth is measured here, with the same
number of threads, by summing a buffer much larger than the caches.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llm_onnx.errors import GenerationError
from llm_onnx.runtime.generator import Model
from llm_onnx.runtime.session import default_threads

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
        lines += [f"{'load':<22}{d['load_s']:>10.2f} s",
                  f"{'peak RSS':<22}{d['peak_rss_mib']:>10.0f} MiB (weights {d['weight_bytes'] / 2**20:.0f} MiB)",
                  f"{'read bandwidth':<22}{d['memory_bandwidth_gb_s']:>10.1f} GB/s ({d['threads']} threads)",
                  f"{'decode ceiling':<22}{d['decode_ceiling_tok_s']:>10.1f} tok/s "
                  f"({d['decode_tok_s']['median'] / d['decode_ceiling_tok_s'] * 100:.0f}% reached)"]
        return "\n".join(lines)


def measure_bandwidth(threads: int, total_bytes: int = BANDWIDTH_BYTES, repeat: int = 5) -> float:
    """Read bandwidth in bytes/s with ``threads`` threads (numpy releases the GIL in reductions)."""
    n = total_bytes // 4 // threads
    parts = [np.ones(n, dtype=np.float32) for _ in range(threads)]
    best = 0.0
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeat):
            start = time.perf_counter()
            list(pool.map(np.sum, parts))
            best = max(best, n * 4 * threads / (time.perf_counter() - start))
    return best


def bytes_per_token(model: Model, context: int, batch: int) -> int:
    """Weights read per decode step (all of weights.data, less the embedding rows not gathered)
    plus the KV cache read at ``context`` positions."""
    m = model.engine.manifest
    weights = int(m.data["weights"]["bytes"])
    cfg = m.config
    kv = m.data["kv_cache"]
    kv_itemsize = 2 if kv["dtype"] == "float16" else 4
    kv_bytes = 2 * kv["num_layers"] * kv["num_key_value_heads"] * kv["head_dim"] * context \
        * kv_itemsize * batch
    if not cfg.get("tie_word_embeddings"):
        # An untied embedding table is only gathered (one row per token), not read whole.
        prec = m.data["precision"]
        bits = prec.get("embedding_bits") if prec["precision"] in ("int8", "int4") else None
        itemsize = {None: 2 if prec["precision"] == "fp16" else 4, 8: 1.0625, 4: 0.5625}[bits]
        weights -= int(cfg["vocab_size"] * cfg["hidden_size"] * itemsize)
    return weights + kv_bytes


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
    ttft, prefill, decode = [], [], []
    for _ in range(cfg.repeat):
        results = model.generate(prompts, options)
        t = results[0].timings
        ttft.append(t.ttft_s)
        prefill.append(t.prefill_tok_s * cfg.batch)
        decode.append(t.decode_tok_s * cfg.batch)
    peak_rss = peak_rss_mib()  # before the bandwidth probe's 1 GiB buffer
    threads = model.engine.options.threads or default_threads()
    bandwidth = measure_bandwidth(threads)
    per_token = bytes_per_token(model, len(prompt) + cfg.new_tokens // 2, cfg.batch)
    m = model.engine.manifest
    return BenchResult({
        "model": m.data.get("name"), "folder": str(m.folder),
        "precision": m.data["precision"]["precision"], "provider": model.engine.provider,
        "threads": threads, "batch": cfg.batch, "prompt_len": len(prompt),
        "new_tokens": cfg.new_tokens, "repeat": cfg.repeat, "load_s": model.load_s,
        "ttft_s": _stats(ttft), "prefill_tok_s": _stats(prefill), "decode_tok_s": _stats(decode),
        "peak_rss_mib": peak_rss, "rss_before_load_mib": rss_before_load_mib,
        "weight_bytes": int(m.data["weights"]["bytes"]),
        "memory_bandwidth_gb_s": bandwidth / 1e9,
        "bytes_per_token": per_token,
        "decode_ceiling_tok_s": bandwidth / per_token * cfg.batch,
    })


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
            out.append({"batch": batch, "context": context,
                        "decode_tok_s": r[0].timings.decode_tok_s * batch})
    return out


def plot_curve(points: list[dict[str, float]], path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise GenerationError("--plot needs matplotlib: pip install 'llm-onnx[bench]'.") from e
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
    fig.savefig(path, dpi=120)


def to_json(result: BenchResult) -> str:
    return json.dumps(result.data, indent=2)

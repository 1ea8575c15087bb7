"""The one timing loop and the summaries every benchmark reports. Standard library only: the peer
workers import it in every venv.

A generation is timed the same way for every system (batch 1, fixed prompt token ids, greedy):

    t0 ─ prefill (the prompt in one call) ─ t_prefill ─ first token chosen ─ t_first ─
         N-1 decode steps, each a forward pass of one token and a greedy pick ─ t_end
    ttft_s = t_first - t0;  prefill_tok_s = P / (t_prefill - t0);
    decode_tok_s = (N - 1) / (t_end - t_first)

Each measurement: one warm-up generation, then ``passes`` passes; median, min and max of each
figure (``llm-onnx bench`` reports ours the same way, from the runtime's own timings)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(run: Callable[[list[int], int], dict], ids: list[int], new_tokens: int,
            passes: int) -> dict:
    """``run(ids, n)`` -> {"t_prefill", "t_first", "t_end" (seconds since its own start),
    "tokens"}; one warm-up, then ``passes`` timed passes."""
    run(ids, new_tokens)  # warm-up
    ttft, prefill, decode, counts = [], [], [], []
    for _ in range(passes):
        r = run(ids, new_tokens)
        ttft.append(r["t_first"])
        prefill.append(len(ids) / r["t_prefill"])
        n = len(r["tokens"])
        counts.append(n)
        if n > 1:
            decode.append((n - 1) / (r["t_end"] - r["t_first"]))
    return {"ttft_s": stats(ttft), "prefill_tok_s": stats(prefill),
            "decode_tok_s": stats(decode) if decode else None,
            "generated_tokens": min(counts), "prompt_tokens": len(ids), "passes": passes}


def median_run_s(sess, io, reps: int, warmup: int = 3) -> float:
    """Median seconds of ``reps`` runs of an ONNX Runtime IO binding after ``warmup`` untimed
    ones, each timed until its outputs are synchronized (the kernels done, not just launched)."""
    for _ in range(warmup):
        sess.run_with_iobinding(io)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        sess.run_with_iobinding(io)
        io.synchronize_outputs()
        times.append(time.perf_counter() - start)
    return float(statistics.median(times))


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile, interpolated between the two nearest samples; None without any."""
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def nearest_rank(values: list[float], q: float) -> float | None:
    """The sample nearest the ``q`` quantile's rank (no interpolation); None without any."""
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]

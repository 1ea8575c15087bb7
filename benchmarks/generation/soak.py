"""Long and concurrent runs: memory stays flat, threads agree with sequential runs.

    python -m benchmarks.generation.soak [--model DIR] [--rounds 20] [--threads 8] [--requests 50]

1. Leak check: generate up to the context limit (a prompt filling the cache, then new tokens to
   the end) ``--rounds`` times; print RSS after each round. RSS must be flat after warm-up.
2. Concurrency: ``--threads`` threads share one loaded model and run ``--requests`` requests each
   (seeded sampling, varied prompts); every result must equal the same request run sequentially,
   and no request may fail.
"""

from __future__ import annotations

import argparse
import resource
import sys
import threading
import time

import numpy as np

from benchmarks.core import targets
from llm_onnx.runtime import Model


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def leak_check(model: Model, rounds: int, context: int) -> list[float]:
    rng = np.random.default_rng(0)
    vocab = model.engine.vocab_size
    prompt_len = context - 64
    series = []
    for i in range(rounds):
        prompt = rng.integers(100, vocab, prompt_len).tolist()
        r = model.generate(prompt, max_new_tokens=64, temperature=0.8, seed=i, ignore_eos=True)
        assert len(r.token_ids) == 64 and r.finish_reason == "length"
        series.append(rss_mib())
        print(f"  round {i + 1:>3}: {prompt_len} + 64 tokens, RSS {series[-1]:.0f} MiB", flush=True)
    return series


def concurrency_check(model: Model, threads: int, requests: int) -> tuple[int, int, float]:
    rng = np.random.default_rng(1)
    vocab = model.engine.vocab_size
    jobs = [(rng.integers(100, vocab, int(n)).tolist(), seed)
            for seed, n in enumerate(rng.integers(4, 200, threads * requests))]
    kwargs = dict(max_new_tokens=16, temperature=0.9, top_p=0.95)
    start = time.perf_counter()
    sequential = [model.generate(p, seed=s, **kwargs).token_ids for p, s in jobs]
    seq_s = time.perf_counter() - start
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for i in range(k, len(jobs), threads):
                p, s = jobs[i]
                results[i] = model.generate(p, seed=s, **kwargs).token_ids
        except BaseException as e:  # reported below
            errors.append(e)

    start = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    par_s = time.perf_counter() - start
    same = sum(results.get(i) == sequential[i] for i in range(len(jobs)))
    print(f"  sequential {seq_s:.1f} s, {threads} threads {par_s:.1f} s", flush=True)
    return same, len(errors), len(jobs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="model folder (default: the default model)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--requests", type=int, default=50)
    args = parser.parse_args()
    folder = args.model
    if folder is None:
        from llm_onnx.default_model import default_model_folder

        folder = default_model_folder()
    model = Model.load(folder)
    context = min(args.context, model.context_length)
    print(f"{model.engine.describe()}; leak check: {args.rounds} rounds at context {context}")
    series = leak_check(model, args.rounds, context)
    warm = series[min(2, len(series) - 1):]
    growth = max(warm) - min(warm)
    print(f"RSS after warm-up: min {min(warm):.0f} MiB, max {max(warm):.0f} MiB, "
          f"spread {growth:.0f} MiB")
    print(f"concurrency: {args.threads} threads x {args.requests} requests")
    same, errors, total = concurrency_check(model, args.threads, args.requests)
    print(f"{same}/{total} results equal to sequential runs, {errors} errors")
    ok = (errors == 0 and same == total
          and growth < targets.LEAK_RSS_SPREAD * max(warm) + targets.LEAK_RSS_SLACK_MIB)
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

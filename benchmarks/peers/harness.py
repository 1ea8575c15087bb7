"""What every step of the peer worker shares: the prompts file, the result file (with the
process's peak RSS), and the load / agreement / speed body of the run-* steps around the one
timing loop (benchmarks.core.timing). Standard library only."""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.core.timing import measure


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def load_prompts(path: str) -> dict:
    return json.loads(Path(path).read_text())


def write_result(path: str, data: dict) -> None:
    data.setdefault("peak_rss_mib", round(peak_rss_mib(), 1))
    Path(path).write_text(json.dumps(data, indent=1))


def speed_and_agreement(args, load: Callable[[], object], timed, greedy) -> dict:
    """The common body of the run-* steps: load, greedy agreement, speed."""
    prompts = load_prompts(args.prompts)
    start = time.perf_counter()
    handle = load()
    out = {"load_s": time.perf_counter() - start}
    if args.agree_tokens:
        out["greedy"] = [greedy(handle, p["ids"], args.agree_tokens) for p in prompts["agreement"]]
    if args.passes:
        out.update(measure(lambda ids, n: timed(handle, ids, n), prompts["speed"]["ids"],
                           args.new_tokens, args.passes))
    return out

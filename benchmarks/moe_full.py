"""A model at full size on this machine: export, load and decode, llama.cpp on a GGUF of the
same shape, and `llm-onnx serve` at 1 and 4 clients; one command, one JSON, one table. The
presets moe_gguf.py writes GGUFs of: the mixtures of experts Qwen3-30B-A3B (qwen3_30b_a3b, the
default), Qwen3.6-35B-A3B (qwen3_6_35b_a3b: Gated DeltaNet and gated full attention, 256 experts
and a shared expert; llama.cpp's qwen35moe), gpt-oss-20b (gpt_oss_20b) and Gemma 4 26B-A4B
(gemma4_26b_a4b: 128 GeGLU experts beside a dense MLP; llama.cpp's gemma4), and the dense
SmolLM3-3B (smollm3_3b: every fourth layer NoPE, tied embeddings; llama.cpp's smollm3).

    .venv/bin/python benchmarks/moe_full.py              # the whole model: hours; the machine alone
    .venv/bin/python benchmarks/moe_full.py --layers 2   # the same pipeline on 2 of the 48 layers
    .venv/bin/python benchmarks/moe_full.py --config qwen3_6_35b_a3b             # 40 layers
    .venv/bin/python benchmarks/moe_full.py --config qwen3_6_35b_a3b --layers 4  # 3 linear + 1 full
    .venv/bin/python benchmarks/moe_full.py --config smollm3_3b --run int4 int8  # both fit

Stages, one process each, one after the other (peak RSS from wait4 or the kernel's VmHWM):
  export   random weights of the preset (cut to --layers, keeping its pattern of layer kinds
           and of NoPE layers) with a word-level tokenizer of its vocabulary (t0 ... t{V-1}, so
           the server streams text), each --export precision: time, peak RSS and its timeline by
           stage, weights.data, the parity gate's figures.
  ours     each --run precision: Model.load (RSS, PSS, anonymous and file-backed memory after
           loading, and after a --prompt-len prompt and --new-tokens tokens), then `llm-onnx
           bench` (llm_onnx.bench.run_bench: TTFT, prefill, batch-1 decode, and the
           active-parameter ceiling: the bytes a step reads (of experts, the top-k's share; a
           dense model reads all) over the read bandwidth measured beside each run).
  llama    a GGUF of the same shape, random Q4_0 (against int4) or Q8_0 (int8) blocks written
           with gguf-py (moe_gguf.py), llama-server at --threads: load, RSS/PSS, one request of
           the same prompt ids and --new-tokens tokens per --repeat (its own prompt and decode
           timings).
  serve    `llm-onnx serve` and llama-server with each --clients count of concurrent streaming
           clients (serve_load.py's client): aggregate tok/s, TTFT, inter-token latency.

Each system is measured alone. Before every stage (export, ours per precision and variant,
llama, each serve run) settle() ends any process an earlier stage left (none should be: each
worker is waited for, each server stopped and reaped), syncs and waits (up to 5 minutes) until
the kernel's dirty and writeback pages are under 64 MiB (an export writes its 19 GB weights.data,
the llama stage its GGUF, just before), waits (up to 2 minutes) for a quiet CPU: under 10% busy
in a second and a 1-minute load average under half the cores, then drops the page cache (as root;
--no-drop-caches keeps it, for comparison; where it cannot be written the record says so), so no
stage starts with another's files cached or its own warm. Its record (/proc/meminfo in MiB: free,
available, page cache, dirty, writeback, anonymous, mapped, swap; the seconds waited, the load,
this process's RSS, other processes resident at 256 MiB or more) goes into the stage's results
as "settle" and a line of the table. Loads are thus from a cold cache, for both systems.

Folders are written under --work and deleted after their stage (--keep keeps them), never two at
once. At full size qwen3_30b_a3b's int4 is 19 GB, int8 34 GB, Q4_0 17 GB, Q8_0 32 GB;
qwen3_6_35b_a3b's int4 about 23 GB, int8 about 39 GB, Q4_0 19.6 GB, Q8_0 37 GB. int8 and Q8_0 do
not fit in 24 GiB of memory: by default they are only exported (--run int4). smollm3_3b's Q4_0 is
1.7 GB, Q8_0 3.3 GB: pass --run int4 int8 to time both.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # serve_load, bench_env and moe_gguf beside this file

MATCH = {"int4": "Q4_0", "int8": "Q8_0"}


# ----------------------------------------------------------------------------- memory

def memory(pid: int | str = "self") -> dict[str, float]:
    """MiB: resident and proportional set size, anonymous and file-backed, the peak (VmHWM)."""
    out: dict[str, float] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, *rest = line.split()
            if key in ("Rss:", "Pss:", "Anonymous:", "Pss_Anon:", "Pss_File:"):
                out[key[:-1].lower()] = round(int(rest[0]) / 1024, 1)
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "RssFile:")):
                key, value, _ = line.split()
                out[key[:-1].lower()] = round(int(value) / 1024, 1)
    return out


def cache_bytes(engine, positions: int) -> int:
    """A row's cache at ``positions``: keys and values of the attention layers, and a hybrid
    model's recurrent state with its checkpoints (the engine's own count)."""
    return engine.row_bytes(positions)


# ----------------------------------------------------------------------------- the machine alone

MEMINFO_KEYS = ("MemTotal", "MemFree", "MemAvailable", "Cached", "Dirty", "Writeback", "AnonPages",
                "Mapped", "SwapTotal", "SwapFree")
MEMINFO = Path("/proc/meminfo")
DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def meminfo(path: Path | str = MEMINFO) -> dict[str, float]:
    """MEMINFO_KEYS of a /proc/meminfo text (``path``), in MiB."""
    out: dict[str, float] = {}
    for line in Path(path).read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in MEMINFO_KEYS and rest.split():
            out[key] = round(int(rest.split()[0]) / 1024, 1)
    return out


def stray_processes(pid: int | None = None) -> list[dict]:
    """The live (not zombie) descendants of ``pid`` (this process): a worker or server an
    earlier stage left running."""
    pid = os.getpid() if pid is None else pid
    parents: dict[int, tuple[int, str, str]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        parents[int(d.name)] = (int(rest[1]), rest[0], name)
    found, frontier = [], {pid}
    while frontier:
        children = {p for p, (ppid, _, _) in parents.items() if ppid in frontier}
        found += [{"pid": p, "name": parents[p][2]} for p in sorted(children)
                  if parents[p][1] != "Z"]
        frontier = children
    return found


def big_processes(min_mib: float = 256) -> list[dict]:
    """Other processes on the machine resident at ``min_mib`` MiB or more (this one excluded)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            status = (d / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        rss = int(fields.get("VmRSS", "0 kB").split()[0]) / 1024
        if rss >= min_mib:
            out.append({"pid": int(d.name), "name": fields["Name"].strip(), "rss_mib": round(rss)})
    return sorted(out, key=lambda p: -p["rss_mib"])


def end_strays(strays, sleep=time.sleep) -> list[dict]:
    """SIGTERM what ``strays()`` lists, SIGKILL after 30 s; what there was."""
    import signal

    found = strays()
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        left = strays()
        if not left:
            break
        names = ", ".join(f"{s['name']} ({s['pid']})" for s in left)
        log(f"settle: ending {names}, left by an earlier stage ({sig.name})")
        for s in left:
            try:
                os.kill(s["pid"], sig)
            except ProcessLookupError:
                pass
        for _ in range(int(wait / 0.2)):
            if not strays():
                break
            sleep(0.2)
    return found


def settle(drop: bool = True, label: str = "", *, dirty_max_mib: float = 64,
           dirty_wait_s: float = 300, busy_max: float = 0.10, load_max: float | None = None,
           idle_wait_s: float = 120, meminfo_path: Path | str = MEMINFO,
           drop_path: Path | str = DROP_CACHES, strays=stray_processes, others=big_processes,
           busy=None, loadavg=os.getloadavg, sleep=time.sleep) -> dict:
    """Bring the machine to the same state before each timed stage, and record it:

    1. no process of an earlier stage alive (a server left running is ended, and named);
    2. os.sync(), then wait (up to ``dirty_wait_s``) until Dirty + Writeback are under
       ``dirty_max_mib``: an export or a GGUF just written leaves gigabytes being written back;
    3. wait (up to ``idle_wait_s``) until the CPU is quiet: under ``busy_max`` of it used in a
       second (bench_env.cpu_busy) and the 1-minute load average under ``load_max`` (half the
       cores), the previous stage's load having decayed;
    4. sync again and drop the page cache (``drop``; where ``drop_path`` is writable, as root),
       last, so the stage starts with neither the previous stage's files nor its own cached.

    Returns /proc/meminfo's figures (MiB) after all this, whether the cache was dropped, the
    seconds waited, the load average, the CPU share, this process's RSS and other processes
    resident at 256 MiB or more."""
    from bench_env import cpu_busy

    busy = busy or cpu_busy
    load_max = 0.5 * (os.cpu_count() or 1) if load_max is None else load_max
    start = time.monotonic()
    out: dict = {"strays_ended": end_strays(strays, sleep)}

    os.sync()
    while True:
        m = meminfo(meminfo_path)
        pending = m.get("Dirty", 0) + m.get("Writeback", 0)
        out["dirty_settled"] = pending <= dirty_max_mib
        if out["dirty_settled"] or time.monotonic() - start >= dirty_wait_s:
            break
        log(f"settle{label and ' ' + label}: {pending:.0f} MiB dirty or under writeback")
        sleep(5)
        os.sync()
    out["dirty_wait_s"] = round(time.monotonic() - start, 1)

    idle_start = time.monotonic()
    while True:
        out["cpu_busy"], out["loadavg"] = busy(), [round(x, 2) for x in loadavg()]
        out["idle"] = out["cpu_busy"] <= busy_max and out["loadavg"][0] <= load_max
        if out["idle"] or time.monotonic() - idle_start >= idle_wait_s:
            break
        sleep(4)
    out["idle_wait_s"] = round(time.monotonic() - idle_start, 1)

    os.sync()  # the last step, right before the stage: what others wrote or read meanwhile too
    out["cache_dropped"] = False
    if not drop:
        out["drop_note"] = "kept (--no-drop-caches)"
    else:
        try:
            with open(drop_path, "w") as f:
                f.write("3\n")
            out["cache_dropped"] = True
        except OSError as e:
            out["drop_note"] = f"not dropped: {e}"
            log(f"settle{label and ' ' + label}: page cache {out['drop_note']}")
    out["waited_s"] = round(time.monotonic() - start, 1)
    out["meminfo_mib"] = meminfo(meminfo_path)
    out["bench_rss_mib"] = memory()["rss"]
    out["others"] = others()
    log(f"settle{label and ' ' + label}: {settle_line(out)}")
    return out


def settle_line(s: dict) -> str:
    """One line of what settle() recorded: free memory and page cache before the stage."""
    m = s["meminfo_mib"]
    swap = (f"swap {gib(m['SwapTotal'] - m['SwapFree'])} of {gib(m['SwapTotal'])}"
            if m.get("SwapTotal") else "no swap")
    others = ", ".join(f"{p['name']} {gib(p['rss_mib'])}" for p in s.get("others", []))
    return (f"free {gib(m['MemFree'])} GiB, available {gib(m['MemAvailable'])}, page cache "
            f"{gib(m['Cached'])}, dirty+writeback {gib(m['Dirty'] + m['Writeback'])}, anon "
            f"{gib(m['AnonPages'])}, mapped {gib(m['Mapped'])}, {swap}; cache "
            f"{'dropped' if s['cache_dropped'] else s.get('drop_note', 'kept')}; waited "
            f"{s['waited_s']:.0f} s; load {s['loadavg'][0]:.2f}, CPU busy "
            f"{100 * s['cpu_busy']:.0f}%" + (f"; others: {others}" if others else ""))


# ----------------------------------------------------------------------------- workers

def word_tokenizer(vocab: int) -> bytes:
    """t0 ... t{vocab-1}, split on whitespace (as the tests' tiny checkpoints have)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok.to_str().encode()


def model_config(name: str, layers: int | None):
    from llm_onnx.families import get_config

    cfg = get_config(name)
    if layers is None:
        return cfg
    # what is given per layer is cut with the layers (kinds; SmolLM3's RoPE flags)
    kinds = cfg.layer_types[:layers] if cfg.layer_types is not None else None
    rope = cfg.no_rope_layers[:layers] if cfg.no_rope_layers is not None else None
    return cfg.replace(num_hidden_layers=layers, layer_types=kinds, no_rope_layers=rope)


def worker_export(a: argparse.Namespace) -> dict:
    """export_model (what `llm-onnx export --config NAME --random-weights` runs), in this process."""
    from llm_onnx.checkpoints.load import random_checkpoint
    from llm_onnx.export import ExportOptions, export_model
    from llm_onnx.model_folder import read_manifest

    cfg = model_config(a.config, a.layers)
    ckpt = random_checkpoint(cfg, a.config)
    ckpt.tokenizer_files = {"tokenizer.json": word_tokenizer(cfg.vocab_size)}
    start = time.perf_counter()
    export_model(ckpt, Path(a.folder), ExportOptions(
        precision=a.precision, target="cpu", block_size=a.block_size,
        experts_accuracy_level=a.experts_accuracy_level,
        experts_block_size=a.experts_block_size, experts_scheme=a.experts_scheme),
                 force=True, progress=True)
    m = read_manifest(Path(a.folder))
    return {"seconds": round(time.perf_counter() - start, 1), "weights_bytes": m.weights.bytes,
            "parity": {"scope": m.parity.scope, "kl": m.parity.kl_divergence,
                       "greedy_agreement": m.parity.greedy_agreement},
            "quantized": list(m.precision.quantization.quantized)
            if m.precision.quantization else []}


def worker_ours(a: argparse.Namespace) -> dict:
    """Load the folder, generate once (memory after the prompt and the new tokens), then
    llm-onnx bench's measurement (run_bench)."""
    import numpy as np

    from llm_onnx.bench import BenchConfig, expert_bytes, run_bench, weight_bytes_read
    from llm_onnx.runtime import Model

    before = memory()
    start = time.perf_counter()
    model = Model.load(a.folder, provider="cpu", threads=a.threads)
    load_s = time.perf_counter() - start
    loaded = memory()
    m = model.engine.manifest
    prompt = np.random.default_rng(0).integers(100, m.config.vocab_size, a.prompt_len).tolist()
    first = model.generate(prompt, max_new_tokens=a.new_tokens, temperature=0.0, ignore_eos=True)
    generated = memory()
    bench = run_bench(model, BenchConfig(prompt_len=a.prompt_len, new_tokens=a.new_tokens,
                                         repeat=a.repeat, prompt_ids=prompt), before["rss"])
    t = first.timings
    return {"load_s": round(load_s, 1), "memory_before_load": before, "memory_after_load": loaded,
            "memory_after_generate": generated, "weights_bytes": m.weights.bytes,
            "kv_bytes": cache_bytes(model.engine, a.prompt_len + a.new_tokens),
            "expert_bytes": expert_bytes(m), "weight_bytes_read_batch1": weight_bytes_read(m),
            "first_run": {"ttft_s": t.ttft_s, "prefill_tok_s": t.prefill_tok_s,
                          "decode_tok_s": t.decode_tok_s},
            "bench": {k: v for k, v in bench.data.items() if k not in ("folder",)},
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


WORKERS = {"export": worker_export, "ours": worker_ours}


def run_worker(kind: str, log: Path, env: dict[str, str] | None = None, **opts) -> dict:
    """This script as a worker in a child process (``env`` added to its environment); its peak
    RSS from wait4, and its RSS sampled every second with the export's progress-bar stage at
    that moment."""
    result = log.with_suffix(".json")
    result.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--worker", kind, "--result", str(result)]
    for k, v in opts.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    samples: list[tuple[float, float, str]] = []
    start = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=err, stderr=err, env={**os.environ, **(env or {})})
        done = threading.Event()

        def sample() -> None:
            while not done.wait(1.0):
                try:
                    with open(f"/proc/{proc.pid}/status") as f:
                        rss = next(int(x.split()[1]) for x in f if x.startswith("VmRSS:"))
                except (OSError, StopIteration):
                    continue
                samples.append((round(time.perf_counter() - start, 1), round(rss / 1024),
                                progress_stage(log)))

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        _, status, usage = os.wait4(proc.pid, 0)
        done.set()
        thread.join()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{kind} worker failed; see {log}:\n{log.read_text()[-2000:]}")
    out = json.loads(result.read_text())
    out["process_peak_rss_mib"] = round(usage.ru_maxrss / 1024, 1)
    out["wall_s"] = round(time.perf_counter() - start, 1)
    out["rss_timeline"] = samples
    stages: dict[str, float] = {}
    for _, rss, stage in samples:
        stages[stage] = max(stages.get(stage, 0), rss)
    out["peak_rss_by_stage_mib"] = stages
    return out


def progress_stage(log: Path) -> str:
    """The export's progress-bar description last written to ``log`` (tqdm redraws with \\r)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 400))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    stages = re.findall(r"([A-Za-z][A-Za-z ]+?)\s+\d+%\|", tail)
    return stages[-1].strip() if stages else ""


# ----------------------------------------------------------------------------- llama.cpp

def llama_run(a, gguf: Path, prompt: list[int], binaries: dict, logs: Path) -> dict:
    """llama-server on ``gguf``: load time and memory, then --repeat requests of the prompt ids
    and --new-tokens tokens (one warm-up first), with llama.cpp's own timings."""
    import httpx

    import serve_load

    port = serve_load.free_port()
    cmd = [binaries["llama-server"], "-m", gguf, "--host", "127.0.0.1", "--port", port,
           "-np", 1, "-c", a.prompt_len + a.new_tokens + 16, "-t", a.threads, "-tb", a.threads,
           "--no-webui", "--load-mode", a.llama_load_mode]
    start = time.perf_counter()
    server = SlowServer("llama-server", cmd, port, logs / f"llama-{gguf.stem}.log")
    out: dict = {"load_s": round(time.perf_counter() - start, 1)}
    try:
        out["memory_after_load"] = memory(server.proc.pid)
        body = {"prompt": prompt, "n_predict": a.new_tokens, "temperature": 0.0,
                "ignore_eos": True, "cache_prompt": False}
        runs = []
        for i in range(a.repeat + 1):
            r = httpx.post(server.url + "/completion", json=body, timeout=3600).json()
            if i:  # the first is the warm-up
                runs.append(r["timings"])
        out["memory_after_generate"] = memory(server.proc.pid)
        out["runs"] = runs
        for key, name in (("prompt_per_second", "prefill_tok_s"),
                          ("predicted_per_second", "decode_tok_s"), ("prompt_ms", "prompt_ms")):
            out[name] = statistics.median(t[key] for t in runs)
    finally:
        server.stop()
    return out


def SlowServer(system: str, cmd: list, port: int, logfile: Path):
    """serve_load's Server, given time to load a model of tens of GB (imported here: the workers
    measure their own memory and import nothing they do not use)."""
    import serve_load

    class Slow(serve_load.Server):
        def _wait(self, timeout: float = 1800) -> None:
            super()._wait(timeout)

    return Slow(system, cmd, port, logfile)


# ----------------------------------------------------------------------------- serving

def serve_runs(a, system: str, model: Path, name: str, binaries: dict, logs: Path,
               prompts: list[list[int]]) -> list[dict]:
    """``system`` (llm-onnx or llama-server) with each --clients count of streaming clients."""
    import asyncio

    import serve_load

    rows = []
    for clients in a.clients:
        port = serve_load.free_port()
        if system == serve_load.OURS:
            cmd = [sys.executable, "-m", "llm_onnx.cli", "serve", "--model", model, "--port", port,
                   "--threads", a.threads, "--log-level", "warning"]
        else:
            cmd = [binaries["llama-server"], "-m", model, "--host", "127.0.0.1", "--port", port,
                   "-np", clients, "-c", (a.serve_prompt_len + a.serve_new_tokens + 16) * clients,
                   "-t", a.threads, "-tb", a.threads, "-cb", "--no-webui",
                   "--load-mode", a.llama_load_mode]
        alone = settle(a.drop_caches, f"serve {system} {name} x{clients}")
        server = SlowServer(system, cmd, port, logs / f"serve-{system}-{clients}.log")
        try:
            asyncio.run(serve_load.warm_up(server.url, name, prompts[-1]))
            row = asyncio.run(serve_load.load(server.url, name, prompts, clients,
                                              a.serve_requests, a.serve_new_tokens))
            row.update(system=system, clients=clients, memory=memory(server.proc.pid),
                       settle=alone)
        finally:
            server.stop()
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- the run

def measure(a) -> dict:
    import numpy as np

    import serve_load
    from moe_gguf import write_random_gguf

    cfg = model_config(a.config, a.layers)
    work, logs = a.work, a.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, cfg.vocab_size, a.prompt_len).tolist()  # what worker_ours sends
    serve_prompts = [rng.integers(100, cfg.vocab_size, a.serve_prompt_len).tolist()
                     for _ in range(max(a.clients) * a.serve_requests + 1)]
    results: dict = {"machine": serve_load.machine(), "config": a.config,
                     "layers": cfg.num_hidden_layers, "args": {k: str(v) for k, v in vars(a).items()},
                     "export": {}, "ours": {}, "llama": {}, "serve": {}}
    amx = serve_load.llama_amx(a.bench_work, a.llama_amx)
    binaries = serve_load.llama_binaries(a.bench_work, logs, amx) if a.llama else {}
    results["llama_build"] = serve_load.llama_build_label(amx) if a.llama else None
    for precision in dict.fromkeys(a.export + a.run):
        block = "" if a.block_size == 32 else f"-b{a.block_size}"
        for tag, value in (("acc", a.experts_accuracy_level), ("eb", a.experts_block_size),
                           ("", a.experts_scheme)):
            block += "" if value is None else f"-{tag}{value}"
        folder = work / f"{a.config}-L{cfg.num_hidden_layers}-{precision}{block}"
        record = folder.with_name(folder.name + ".export.json")
        if a.reuse and (folder / "manifest.json").is_file() and record.is_file():
            log(f"export {precision}: reusing {folder} (--reuse; its figures from {record.name})")
            results["export"][precision] = json.loads(record.read_text())
        else:
            log(f"export {precision} -> {folder}")
            alone = settle(a.drop_caches, f"export {precision}")
            env = export_env(a)
            results["export"][precision] = run_worker(
                "export", logs / f"export-{precision}.log", env, config=a.config,
                layers=cfg.num_hidden_layers, precision=precision, folder=folder,
                block_size=a.block_size, **{k: v for k, v in (
                    ("experts_accuracy_level", a.experts_accuracy_level),
                    ("experts_block_size", a.experts_block_size),
                    ("experts_scheme", a.experts_scheme)) if v is not None})
            results["export"][precision].update(settle=alone, cpu_busy_before=alone["cpu_busy"])
            results["export"][precision]["env"] = env
            if a.keep:
                record.write_text(json.dumps(results["export"][precision], indent=1))
        log(f"  {results['export'][precision]['seconds']:.0f} s, peak RSS "
            f"{results['export'][precision]['process_peak_rss_mib']:.0f} MiB")
        if precision in a.run:
            variants = [("", folder)]
            if a.qmoe_int8_activations and precision == "int4":
                variants.append(("qmoe-acc4", qmoe_variant(folder, work / f"{folder.name}-acc4")))
            for label, path in variants:
                key = f"{precision}-{label}" if label else precision
                log(f"ours {key}: load, generate, bench")
                alone = settle(a.drop_caches, f"ours {key}")
                results["ours"][key] = run_worker("ours", logs / f"ours-{key}.log", folder=path,
                                                  threads=a.threads, prompt_len=a.prompt_len,
                                                  new_tokens=a.new_tokens, repeat=a.repeat)
                results["ours"][key].update(settle=alone, cpu_busy_before=alone["cpu_busy"])
            if a.serve:
                log(f"serve llm-onnx {precision}")
                results["serve"][precision] = serve_runs(a, serve_load.OURS, folder, folder.name,
                                                         binaries, logs, serve_prompts)
            for label, path in variants[1:]:
                shutil.rmtree(path, ignore_errors=True)
        if not a.keep:
            shutil.rmtree(folder, ignore_errors=True)
            record.unlink(missing_ok=True)
        if a.llama and precision in a.run:
            qtype = MATCH[precision]
            gguf = work / f"{a.config}-L{cfg.num_hidden_layers}-{qtype}.gguf"
            log(f"llama.cpp: random {qtype} GGUF -> {gguf}")
            start = time.perf_counter()
            write_random_gguf(cfg, qtype, gguf)
            results["llama"][qtype] = {"gguf_bytes": gguf.stat().st_size,
                                       "write_s": round(time.perf_counter() - start, 1)}
            alone = settle(a.drop_caches, f"llama {qtype}")  # the GGUF just written: dirty
            results["llama"][qtype].update(settle=alone, cpu_busy_before=alone["cpu_busy"])
            results["llama"][qtype].update(llama_run(a, gguf, prompt, binaries, logs))
            if a.serve:
                log(f"serve llama-server {qtype}")
                results["serve"][qtype] = serve_runs(a, serve_load.LLAMA, gguf, gguf.stem,
                                                     binaries, logs, serve_prompts)
            if not a.keep:
                gguf.unlink(missing_ok=True)
    return results


def export_env(a) -> dict[str, str]:
    """The export worker's allocator setting: glibc's own by default. The export hands freed
    heap back as the weights go through (HeapTrim, malloc_trim): Qwen3.6-35B-A3B peaked at
    3.03 GiB so, in 10 minutes. A fixed threshold was the earlier workaround: at
    128 KiB every 2-16 MiB tensor is a fresh mapping and the calibration spent most of its time
    in the kernel zeroing pages (7.5 s a step against 3.3); at 32 MiB, without the trims, the
    heap grew 0.2 GiB a layer (9.1 GiB). Huge pages, as `llm-onnx export` turns them on
    (unless --no-export-huge-pages): glibc backs its mappings with transparent huge pages (where
    glibc is 2.35+ and the kernel's THP mode madvise or always), 512 times fewer page faults: a
    2-layer cut of gemma4_26b_a4b exported in 167 s instead of 362 (system time 1.8 minutes
    instead of 6.9), at a 0.09 GiB higher peak (docs/exporting.md)."""
    from llm_onnx.export.hugepages import huge_pages_env, this_machine

    env = {}
    if a.export_mmap_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = str(a.export_mmap_threshold)
    if a.export_huge_pages:
        env.update(huge_pages_env(os.environ, *this_machine()))
    return env


def qmoe_variant(folder: Path, out: Path) -> Path:
    """``folder`` with its QMoE nodes at accuracy_level 4 (int8 activations), weights.data
    hard-linked: the same bytes, ONNX Runtime's int8 kernels for the experts."""
    import hashlib

    import onnx

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for f in folder.iterdir():
        if f.name == "weights.data":
            os.link(f, out / f.name)
        elif f.suffix != ".onnx":
            shutil.copy2(f, out / f.name)
    manifest = json.loads((folder / "manifest.json").read_text())
    for graph in ("prefill.onnx", "decode.onnx"):
        model = onnx.load(str(folder / graph), load_external_data=False)
        for node in model.graph.node:
            if node.op_type == "QMoE":
                kept = [x for x in node.attribute if x.name != "accuracy_level"]
                del node.attribute[:]
                node.attribute.extend(kept + [onnx.helper.make_attribute("accuracy_level", 4)])
        onnx.save(model, str(out / graph))
        data = (out / graph).read_bytes()
        manifest["files"][graph] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return out


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- report

def gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.2f}"


def table(r: dict) -> str:
    lines = [f"{r['config']}, {r['layers']} layers; {r['machine']['date']}, onnxruntime "
             f"{r['machine']['onnxruntime']}, {r['machine']['cpus']} cores",
             "", "| export | weights.data GiB | peak RSS GiB | time s | parity KL |",
             "|---|---|---|---|---|"]
    for p, e in r["export"].items():
        lines.append(f"| {p} | {e['weights_bytes'] / 2**30:.2f} | {gib(e['process_peak_rss_mib'])}"
                     f" | {e['seconds']:.0f} | {e['parity']['kl']:.2g} |")
    for p, e in r["export"].items():
        stages = ", ".join(f"{k} {v / 1024:.2f}" for k, v in e["peak_rss_by_stage_mib"].items() if k)
        lines.append(f"export {p}, RSS sampled each second, peak by stage (GiB): {stages}")
    lines += ["", "| system | load s | RSS / PSS after load GiB | after generate GiB | peak GiB | "
              "TTFT s | prefill tok/s | decode tok/s | ceiling tok/s (reached) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for key, o in r["ours"].items():
        b, load, gen = o["bench"], o["memory_after_load"], o["memory_after_generate"]
        lines.append(
            f"| llm-onnx {key} | {o['load_s']:.1f} | {gib(load['rss'])} / {gib(load['pss'])} | "
            f"{gib(gen['rss'])} / {gib(gen['pss'])} | {gib(b['peak_rss_mib'])} | "
            f"{b['ttft_s']['median']:.2f} | {b['prefill_tok_s']['median']:.1f} | "
            f"{b['decode_tok_s']['median']:.2f} | {b['decode_ceiling_tok_s']:.1f} "
            f"({100 * b['decode_ceiling_reached']:.0f}%) |")
    for q, l in r["llama"].items():
        load, gen = l["memory_after_load"], l["memory_after_generate"]
        lines.append(f"| llama.cpp {q} | {l['load_s']:.1f} | {gib(load['rss'])} / {gib(load['pss'])}"
                     f" | {gib(gen['rss'])} / {gib(gen['pss'])} | {gib(gen.get('vmhwm'))} | "
                     f"{l['prompt_ms'] / 1e3:.2f} | {l['prefill_tok_s']:.1f} | "
                     f"{l['decode_tok_s']:.2f} | |")
    lines.append("(peak: the process's before bench's 1 GiB bandwidth probe; llama.cpp: VmHWM)")
    for key, o in r["ours"].items():
        w = (o["weights_bytes"] + o["kv_bytes"]) / 2**20
        peak, gen = o["bench"]["peak_rss_mib"], o["memory_after_generate"]["rss"]
        lines.append(f"llm-onnx {key}: RSS after generating {gen / w:.2f} x and peak "
                     f"{peak / w:.2f} x (weights + a row's cache of {r['args']['prompt_len']}+"
                     f"{r['args']['new_tokens']} positions, {w / 1024:.2f} GiB); a decode step "
                     f"reads {o['weight_bytes_read_batch1'] / 2**30:.2f} GiB of weights, the "
                     f"memory {o['bench']['memory_bandwidth_gb_s']:.1f} GB/s")
    before = [(f"export {p}", e) for p, e in r["export"].items()]
    before += [(f"llm-onnx {k}", o) for k, o in r["ours"].items()]
    before += [(f"llama.cpp {q}", l) for q, l in r["llama"].items()]
    before += [(f"serve {s['system']} {k} x{s['clients']}", s)
               for k, rows in r["serve"].items() for s in rows]
    before = [(label, e["settle"]) for label, e in before if e.get("settle")]
    if before:
        lines += ["", ("The machine before each stage, GiB (settle(): earlier stages' processes "
                       "ended, sync and writeback, the page cache dropped, a quiet CPU):")]
        lines += [f"- {label}: {settle_line(s)}" for label, s in before]
    if r["serve"]:
        lines += ["", "| serving | clients | aggregate tok/s | TTFT p50 / p99 s | inter-token "
                  "p50 ms | per-request tok/s | errors |", "|---|---|---|---|---|---|---|"]
        for key, rows in r["serve"].items():
            for s in rows:
                lines.append(f"| {s['system']} {key} | {s['clients']} | {s['aggregate_tok_s']:.2f} | "
                             f"{s['ttft_p50_s'] or 0:.2f} / {s['ttft_p99_s'] or 0:.2f} | "
                             f"{1e3 * (s['itl_p50_s'] or 0):.0f} | {s['per_request_tok_s'] or 0:.2f} "
                             f"| {s['error_count']} |")
    return "\n".join(lines)


def check_config(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """--config names a preset moe_gguf.py writes a GGUF of (cut to --layers, in a form llama.cpp's
    architecture can express); the expert options need experts."""
    from llm_onnx.families import get_config
    from moe_gguf import ARCHS, gguf_arch

    try:
        full = get_config(a.config)
    except Exception as e:  # an unknown preset: the registry's own message
        p.error(str(e))
    if a.layers is not None and not 1 <= a.layers <= full.num_hidden_layers:
        p.error(f"--layers {a.layers}: {a.config} has {full.num_hidden_layers} layers")
    cfg = model_config(a.config, a.layers)
    if cfg.architecture not in ARCHS:
        p.error(f"--config {a.config}: {cfg.architecture}, not an architecture moe_gguf.py "
                f"writes a GGUF of ({', '.join(ARCHS)})")
    if a.llama:
        try:
            gguf_arch(cfg)
        except ValueError as e:
            p.error(f"--config {a.config}: {e}")
    if cfg.moe is None:
        for flag, given in (("--qmoe-int8-activations", a.qmoe_int8_activations),
                            ("--experts-accuracy-level 4", a.experts_accuracy_level == 4),
                            ("--experts-block-size", getattr(a, "experts_block_size", None)),
                            ("--experts-scheme", getattr(a, "experts_scheme", None))):
            if given:
                p.error(f"{flag}: {a.config} is dense (no experts, no QMoE nodes); leave it out")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        w = argparse.ArgumentParser()
        w.add_argument("--worker")
        w.add_argument("--result", type=Path)
        for opt in ("config", "folder", "precision", "experts-scheme"):
            w.add_argument(f"--{opt}")
        for opt in ("layers", "threads", "prompt-len", "new-tokens", "repeat", "block-size",
                    "experts-accuracy-level", "experts-block-size"):
            w.add_argument(f"--{opt}", type=int)
        a = w.parse_args()
        a.result.write_text(json.dumps(WORKERS[a.worker](a)))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="qwen3_30b_a3b",
                   help="a preset moe_gguf.py writes GGUFs of: the mixtures of experts "
                        "qwen3_30b_a3b, qwen3_6_35b_a3b, gpt_oss_20b, gemma4_26b_a4b, the dense "
                        "smollm3_3b (or their tiny presets)")
    p.add_argument("--layers", type=int, help="cut the preset to this many layers (default: all)")
    p.add_argument("--export", nargs="+", choices=list(MATCH), default=["int4", "int8"],
                   help="precisions exported (time, peak RSS, size)")
    p.add_argument("--run", nargs="*", choices=list(MATCH), default=["int4"],
                   help="precisions also loaded, decoded, served and compared with llama.cpp")
    p.add_argument("--block-size", type=int, default=32,
                   help="the export's quantization block (experts: the largest power of two up "
                        "to it that divides their widths)")
    p.add_argument("--experts-accuracy-level", type=int, choices=(0, 4),
                   help="the export's QMoE accuracy level (llm-onnx export "
                        "--experts-accuracy-level): 4 = int8 activations, also when serving "
                        "(default: the export's, 4 on CPU)")
    p.add_argument("--experts-block-size", type=int,
                   help="the experts' block (llm-onnx export --experts-block-size; default: "
                        "the export's, 64 for 4-bit zero-point experts)")
    p.add_argument("--experts-scheme", choices=("zero_point", "symmetric"),
                   help="llm-onnx export --experts-scheme (default: the export's)")
    p.add_argument("--export-mmap-threshold", type=int, default=0, metavar="BYTES",
                   help="glibc's MALLOC_MMAP_THRESHOLD_ for the export worker: blocks this large "
                        "or larger are mapped and given back when freed (default 0: glibc's own "
                        "dynamic threshold, what `llm-onnx export` runs under)")
    p.add_argument("--no-export-huge-pages", dest="export_huge_pages", action="store_false",
                   help="run the export worker without the GLIBC_TUNABLES=glibc.malloc.hugetlb=1 "
                        "that `llm-onnx export` adds by itself where glibc and the kernel take "
                        "it (transparent huge pages for glibc's mappings: far fewer page faults "
                        "on big models)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3, help="timed runs of ours and of llama.cpp")
    p.add_argument("--clients", nargs="+", type=int, default=[1, 4])
    p.add_argument("--serve-requests", type=int, default=2, help="requests per client")
    p.add_argument("--serve-prompt-len", type=int, default=128)
    p.add_argument("--serve-new-tokens", type=int, default=64)
    p.add_argument("--no-llama", dest="llama", action="store_false")
    p.add_argument("--no-serve", dest="serve", action="store_false")
    p.add_argument("--llama-load-mode", choices=("auto", "none"), default="auto",
                   help="llama-server --load-mode: auto maps the GGUF (llama.cpp's default; it "
                        "repacks the matrices into its own memory and the mapped pages stay "
                        "resident while memory allows), none reads it into memory (one copy)")
    p.add_argument("--no-drop-caches", dest="drop_caches", action="store_false",
                   help="before each stage, sync and wait for the writeback and a quiet CPU but "
                        "keep the page cache (by default it is dropped, as root; for comparison)")
    p.add_argument("--qmoe-int8-activations", action="store_true",
                   help="also load and decode the int4 folder with its QMoE nodes at "
                        "accuracy_level 4 (int8 activations; ~50%% more memory for the experts)")
    p.add_argument("--work", type=Path,
                   default=Path.home() / ".cache" / "llm-onnx-bench" / "moe-full")
    p.add_argument("--bench-work", type=Path, default=Path.home() / ".cache" / "llm-onnx-bench",
                   help="where serve_load.py builds llama-server (shared with it)")
    p.add_argument("--llama-amx", choices=["auto", "on", "off"], default="auto",
                   help="llama.cpp's AMX kernels: on (a native build), off (the CPU's other "
                        "extensions), auto: native unless serve_load.py or compare_peers.py "
                        "recorded a crash of the native build on this CPU (BENCH_WORK/llama-amx.json)")
    p.add_argument("--keep", action="store_true", help="keep the model folders and GGUFs")
    p.add_argument("--reuse", action="store_true",
                   help="take a folder an earlier --keep run exported (and its export figures) "
                        "instead of exporting again: export while the machine is shared, then "
                        "time the rest alone")
    p.add_argument("--out", type=Path, help="the JSON (default: WORK/results/moe-full-TIME.json)")
    a = p.parse_args()
    check_config(p, a)
    a.work.mkdir(parents=True, exist_ok=True)
    results = measure(a)
    out = a.out or a.work / "results" / f"moe-full-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(table(results))
    print(f"\nresults: {out}")


if __name__ == "__main__":
    main()

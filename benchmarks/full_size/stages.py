"""The full-size run's stages: the export and our folder loaded and benched (workers), llama.cpp's
llama-server on a GGUF of the same shape, and both servers under streaming clients; measure()
runs them in order, each after settle()."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from benchmarks.core.clients import load, warm_up
from benchmarks.core.llama import llama_amx, llama_binaries, llama_build_label
from benchmarks.core.proc import log
from benchmarks.core.server import Server, free_port
from benchmarks.full_size.alone import memory, settle
from benchmarks.full_size.random_gguf import write_random_gguf
from benchmarks.full_size.workers import model_config, run_worker
from benchmarks.serving.load import machine
from benchmarks.serving.load_report import LLAMA, OURS

MATCH = {"int4": "Q4_0", "int8": "Q8_0"}


def llama_run(a, gguf: Path, prompt: list[int], binaries: dict, logs: Path) -> dict:
    """llama-server on ``gguf``: load time and memory, then --repeat requests of the prompt ids
    and --new-tokens tokens (one warm-up first), with llama.cpp's own timings."""
    import httpx


    port = free_port()
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
    """A Server (benchmarks.core.server) given time to load a model of tens of GB."""

    class Slow(Server):
        def _wait(self, timeout: float = 1800) -> None:
            super()._wait(timeout)

    return Slow(system, cmd, port, logfile)


def serve_runs(a, system: str, model: Path, name: str, binaries: dict, logs: Path,
               prompts: list[list[int]]) -> list[dict]:
    """``system`` (llm-onnx or llama-server) with each --clients count of streaming clients."""
    import asyncio


    rows = []
    for clients in a.clients:
        port = free_port()
        if system == OURS:
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
            asyncio.run(warm_up(server.url, name, prompts[-1]))
            row = asyncio.run(load(server.url, name, prompts, clients,
                                              a.serve_requests, a.serve_new_tokens))
            row.update(system=system, clients=clients, memory=memory(server.proc.pid),
                       settle=alone)
        finally:
            server.stop()
        rows.append(row)
    return rows


def measure(a) -> dict:
    import numpy as np


    cfg = model_config(a.config, a.layers)
    work, logs = a.work, a.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, cfg.vocab_size, a.prompt_len).tolist()  # what worker_ours sends
    serve_prompts = [rng.integers(100, cfg.vocab_size, a.serve_prompt_len).tolist()
                     for _ in range(max(a.clients) * a.serve_requests + 1)]
    results: dict = {"machine": machine(), "config": a.config,
                     "layers": cfg.num_hidden_layers, "args": {k: str(v) for k, v in vars(a).items()},
                     "export": {}, "ours": {}, "llama": {}, "serve": {}}
    amx = llama_amx(a.bench_work, a.llama_amx)
    binaries = llama_binaries(a.bench_work, logs, amx) if a.llama else {}
    results["llama_build"] = llama_build_label(amx) if a.llama else None
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
                results["serve"][precision] = serve_runs(a, OURS, folder, folder.name,
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
                results["serve"][qtype] = serve_runs(a, LLAMA, gguf, gguf.stem,
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

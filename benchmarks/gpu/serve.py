"""Serving on a GPU: `llm-onnx serve` on CUDA under 1-64 concurrent streaming clients, against the
engine's own static batches measured in the same lease, plus the parts a server leans on there:
the prefix copy between cache rows on the device, the cost of a speculative verify run, and
JSON-schema requests under load.

    python -m benchmarks.gpu.serve --model DIR --out OUT   # DIR: exported with --target cuda
    python -m benchmarks.gpu.serve --smoke --out OUT       # on the CPU, tiny: checks the script

Parts, each recorded on its own in OUT/gpu_serve.json (a failing part is written down and the next
one runs; --deadline stops starting parts once that many seconds have passed):

  engine      the engine alone, CUDA graphs on: batch-1 decode (its step time is what inter-token
              latency is compared with), static batch-32 decode (what the server's aggregate at 32
              clients is compared with), the time of a verify run of k = 2, 4, 8 tokens on a row
              with a 128-token past against one decode step (what speculation costs per step on
              this device), and the prefix copy between two rows on the device (KVCache.copy_prefix:
              the copied row must continue exactly like the source)
  serve       `llm-onnx serve --provider cuda --max-batch 64`, N clients each streaming requests of
              --prompt-len prompt token ids and --new-tokens new tokens (greedy, end of sequence
              ignored), one after another: aggregate tok/s, time to first token and inter-token
              latency (p50 / p99), where the server's time went (its /metrics), GPU memory
  structured  8 clients asking /v1/chat/completions with a JSON schema (response_format): the
              same figures, the mask time per step from /metrics, and whether every finished reply
              parses and has the schema's required keys (needs a folder with a tokenizer)
  speculative the same greedy tokens with and without prompt-lookup speculation through
              Model.generate on the device, and the runs it took

Targets (benchmarks/core/targets.py): at 32 clients the server keeps >= 80% of the engine's
static batch-32 decode rate; p99 inter-token latency <= 2x the batch-1 step.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from benchmarks.core import record, targets
from benchmarks.core.clients import chat_stream, load, scrape, summarize, where_time_went
from benchmarks.core.server import Server, free_port
from benchmarks.gpu.device import decode_rate, environment, gpu_memory_mib

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False}


def _run_async(coro):
    """asyncio.run, also from a thread whose event loop is already running (a test runner's):
    then on a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


# ----------------------------------------------------------------------------- engine

def engine_part(folder: Path, provider: str, steps: int) -> dict:
    from llm_onnx.model_folder import read_manifest
    from llm_onnx.runtime.core.engine import Engine, RuntimeOptions

    vocab = read_manifest(folder).vocab_size
    engine = Engine(folder, RuntimeOptions(provider=provider, verify=False))
    out: dict = {"provider": engine.provider, "cuda_graph": bool(engine.cuda_graph),
                 "memory_loaded_mib": gpu_memory_mib()}
    for batch in (1, 32):
        rate = decode_rate(engine, batch, 128, steps, vocab)
        out[f"decode_tok_s_b{batch}"] = rate
        out[f"decode_step_ms_b{batch}"] = 1e3 * batch / rate
        # the same steps returning greedy ids picked on the device (what a server's greedy
        # step does: Engine.decode(greedy=True)), not the logits
        ids = decode_rate(engine, batch, 128, steps, vocab, greedy=True)
        out[f"decode_ids_tok_s_b{batch}"] = ids
        print(f"engine batch {batch}: {rate:.1f} tok/s with logits, {ids:.1f} with ids picked "
              "on the device", flush=True)
    verify = _verify_runs(engine, vocab)
    out["verify_run"] = verify
    out["verify_k8_over_decode_b1"] = verify["k8_ms"] / out["decode_step_ms_b1"]
    out["prefix_copy"] = _prefix_copy(engine, vocab)
    print(f"engine verify {verify}, prefix copy {out['prefix_copy']}", flush=True)
    del engine
    gc.collect()
    return out


def _verify_runs(engine, vocab: int) -> dict:
    """Median ms of a verify run: k tokens run on a row with a 128-token past (a prefill
    continuing it), for k = 1, 2, 4, 8. Its cache is freed on return."""
    rng = np.random.default_rng(3)
    cache = engine.new_cache(1, 256)
    engine.prefill(cache, 0, rng.integers(0, vocab, 128))
    verify = {}
    for k in (1, 2, 4, 8):
        tokens = rng.integers(0, vocab, k)

        def run() -> None:
            engine.prefill(cache, 0, tokens)
            cache.truncate(0, 128)

        run()  # this shape's first run
        verify[f"k{k}_ms"] = _median_ms(run, 10)
    return verify


def _prefix_copy(engine, vocab: int) -> dict:
    """Row 1 takes row 0's first 60 positions on the device, then runs the rest of the same
    prompt: its logits must be row 0's (up to a batch-1 prefill's own run-to-run noise)."""
    rng = np.random.default_rng(4)
    prompt = rng.integers(0, vocab, 100)
    cache = engine.new_cache(2, 160)
    want = np.asarray(engine.prefill(cache, 0, prompt)).copy()
    start = time.perf_counter()
    copied = cache.copy_prefix(0, 1, 60)
    copy_ms = 1e3 * (time.perf_counter() - start)
    if not copied:
        return {"ok": False, "copied": False}
    got = np.asarray(engine.prefill(cache, 1, prompt[60:])).copy()
    keys = cache.host_view(0)
    same_keys = bool(np.array_equal(keys[0, :, :60], keys[1, :, :60]))
    diff = float(np.abs(want - got).max() / max(1.0, float(np.abs(want).max())))
    return {"ok": same_keys and diff < 2e-2 and int(want.argmax()) == int(got.argmax()),
            "copied": True, "copy_ms": copy_ms, "layer0_keys_equal": same_keys,
            "relative_logits_diff": diff, "cache_length": cache.length}


# ----------------------------------------------------------------------------- server

def _prompts(vocab: int, count: int, length: int) -> list[list[int]]:
    rng = np.random.default_rng(5)
    # token ids from the low range: every tokenizer the folder may carry decodes them
    return [[int(t) for t in rng.integers(100, min(vocab, 30000), length)] for _ in range(count)]


async def _schema_request(client, url: str, model: str, k: int, new_tokens: int) -> dict:
    body = {"model": model, "max_tokens": new_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": f"Describe person number {k} as JSON."}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "person", "schema": SCHEMA}}}
    return await chat_stream(client, url, body)


async def _schema_load(url: str, model: str, clients: int, per_client: int,
                       new_tokens: int) -> tuple[dict, list[dict]]:
    import httpx

    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        start = time.perf_counter()

        async def user(k: int) -> list[dict]:
            return [await _schema_request(client, url, model, k * per_client + j, new_tokens)
                    for j in range(per_client)]

        done = await asyncio.gather(*(user(k) for k in range(clients)))
    requests = [r for rs in done for r in rs]
    return summarize(requests, start), requests


def _valid(reply: dict) -> bool | None:
    """Whether a finished reply parses and holds the schema's required keys (None: cut short)."""
    if reply.get("finish") != "stop":
        return None
    try:
        value = json.loads(reply["text"])
    except ValueError:
        return False
    return isinstance(value, dict) and set(SCHEMA["required"]) <= set(value) \
        and isinstance(value["age"], int) and isinstance(value["name"], str)


def serve_part(folder: Path, provider: str, clients: list[int], args, logs: Path,
               results: dict, save) -> None:
    from llm_onnx.model_folder import read_manifest

    manifest = read_manifest(folder)
    vocab = manifest.vocab_size
    has_tokenizer = (folder / "tokenizer.json").is_file()
    name = folder.name
    longest = args.prompt_len + args.new_tokens + 16
    cmd = [sys.executable, "-m", "llm_onnx.cli", "serve", "--model", folder, "--provider",
           provider, "--max-batch", max(clients), "--max-queue", 4 * max(clients),
           "--max-seq-len", longest, "--log-level", "warning", "--no-web-ui"]
    if provider == "cpu":
        cmd += ["--threads", "2"]
    port = free_port()
    t0 = time.perf_counter()
    server = Server("llm-onnx", [*cmd, "--port", port], port, logs / "server.log")
    serve: dict = {"start_s": time.perf_counter() - t0, "command": " ".join(map(str, cmd)),
                   "memory_loaded_mib": gpu_memory_mib(), "levels": {}}
    results["serve"] = serve
    try:
        for n in clients:
            per_client = args.requests_per_client
            prompts = _prompts(vocab, n * per_client + 1, args.prompt_len)
            # warm-up at this concurrency: captures the CUDA graphs of the batch sizes it meets
            _run_async(load(server.url, name, prompts, n, 1, 4))
            before = scrape(server.url)
            row = _run_async(load(server.url, name, prompts, n, per_client, args.new_tokens))
            row["profile"] = where_time_went(before, scrape(server.url), row["wall_s"])
            row["memory_mib"] = gpu_memory_mib()
            serve["levels"][str(n)] = row
            print(f"serve {n} clients: {row['aggregate_tok_s']:.1f} tok/s, TTFT p50/p99 "
                  f"{row['ttft_p50_s']}/{row['ttft_p99_s']} s, ITL p50/p99 {row['itl_p50_s']}/"
                  f"{row['itl_p99_s']} s, errors {row['error_count']}", flush=True)
            save()
        if has_tokenizer and "structured" in args.parts:
            n = 8
            before = scrape(server.url)
            row, replies = _run_async(_schema_load(server.url, name, n, 2, args.new_tokens))
            after = scrape(server.url)
            masks = after.get("llm_onnx_constraint_masks_total", 0) - \
                before.get("llm_onnx_constraint_masks_total", 0)
            mask_s = after.get("llm_onnx_constraint_mask_seconds_total", 0) - \
                before.get("llm_onnx_constraint_mask_seconds_total", 0)
            wait_s = after.get("llm_onnx_constraint_mask_wait_seconds_total", 0) - \
                before.get("llm_onnx_constraint_mask_wait_seconds_total", 0)
            row["profile"] = where_time_went(before, after, row["wall_s"])
            verdicts = [_valid(r) for r in replies if "error" not in r]
            row.update(masks=masks, mask_ms_per_mask=1e3 * mask_s / masks if masks else None,
                       mask_wait_s=wait_s, finished=sum(v is not None for v in verdicts),
                       valid=sum(v is True for v in verdicts),
                       invalid=sum(v is False for v in verdicts),
                       sample=[r.get("text", "")[:160] for r in replies[:2]])
            results["structured"] = row
            print(f"structured 8 clients: {row['aggregate_tok_s']:.1f} tok/s, ITL p50/p99 "
                  f"{row['itl_p50_s']}/{row['itl_p99_s']} s, mask {row['mask_ms_per_mask']} ms, "
                  f"valid {row['valid']}/{row['finished']} finished", flush=True)
            save()
    finally:
        server.stop()
        serve["server_log_tail"] = (logs / "server.log").read_text(errors="replace")[-3000:]


# ----------------------------------------------------------------------------- speculative

def speculative_part(folder: Path, provider: str, new_tokens: int) -> dict:
    """Greedy tokens with and without prompt lookup on the device: they must be the same."""
    from llm_onnx.model_folder import read_manifest
    from llm_onnx.runtime.model import Model

    vocab = read_manifest(folder).vocab_size
    rng = np.random.default_rng(6)
    motif = [int(t) for t in rng.integers(100, min(vocab, 30000), 24)]
    prompt = motif * 6  # something to look up
    out = {}
    tokens = {}
    for mode in ("off", "ngram"):
        model = Model.load(folder, provider=provider, verify=False, speculative=mode)
        model.generate(prompt, max_new_tokens=4, ignore_eos=True)  # warm-up
        start = time.perf_counter()
        result = model.generate(prompt, max_new_tokens=new_tokens, ignore_eos=True)
        seconds = time.perf_counter() - start
        tokens[mode] = result.token_ids
        out[mode] = {"seconds": seconds, "decode_tok_s": result.timings.decode_tok_s,
                     "tokens": len(result.token_ids)}
        del model
        gc.collect()
    out["same_tokens"] = tokens["off"] == tokens["ngram"]
    out["ok"] = out["same_tokens"]
    return out


# ----------------------------------------------------------------------------- main

def smoke_folder(root: Path) -> Path:
    """A tiny Qwen3 with SmolLM2's tokenizer (read from the GGUF llm-onnx's default model comes
    from), so that text, chat and schema requests work: the script's own check on the CPU."""
    from llm_onnx.checkpoints import open_checkpoint
    from llm_onnx.checkpoints.load import random_checkpoint
    from llm_onnx.default_model import gguf_path
    from llm_onnx.export import ExportOptions, export_model
    from llm_onnx.families import PRESETS

    out = root / "qwen3_tiny-smollm2-tokenizer"
    if not (out / "manifest.json").is_file():
        source = open_checkpoint(gguf_path())
        checkpoint = random_checkpoint(PRESETS["qwen3_tiny"].replace(
            vocab_size=source.config.vocab_size), "qwen3_tiny")
        checkpoint.tokenizer_files = source.tokenizer_files
        checkpoint.eos_token_ids = source.eos_token_ids
        export_model(checkpoint, out, ExportOptions(precision="fp32", max_seq_len=512),
                     force=True, progress=False)
    return out



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Example: python -m benchmarks.gpu.serve --model "
                                        "/tmp/m/qwen3_8b-fp16 --out gpu-serve")
    ap.add_argument("--model", type=Path, help="a folder exported with --target cuda")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default="engine,serve,structured,speculative")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=64, help="timed steps of the engine's decode")
    ap.add_argument("--deadline", type=float, default=0,
                    help="seconds after which no further part starts (0: none)")
    ap.add_argument("--provider", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: the same runs on the CPU (profiling the host side, e.g. with a "
                         "tiny model of a large vocabulary)")
    ap.add_argument("--smoke", action="store_true",
                    help="on the CPU with a tiny model (checks the script, measures nothing)")
    args = ap.parse_args()
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    provider = "cpu" if args.smoke else args.provider
    if args.smoke:
        args.model = args.model or smoke_folder(args.out / "models")
        args.clients, args.new_tokens, args.steps = [1, 2], 8, 4
    if args.model is None:
        ap.error("--model is required (except with --smoke)")
    results: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "model": str(args.model),
                     "args": {k: str(v) for k, v in vars(args).items()}, "errors": {}}

    def save() -> None:
        record.write(args.out / "gpu_serve.json", "gpu.serve", results, indent=2, default=str)

    def part(name: str, fn, *fargs) -> None:
        if args.deadline and time.monotonic() - start > args.deadline:
            results["errors"][name] = "skipped: past --deadline"
            save()
            return
        t0 = time.monotonic()
        try:
            value = fn(*fargs)
            if value is not None:
                results[name] = value
        except Exception as e:  # noqa: BLE001 - every part runs
            results["errors"][name] = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"
            print(f"{name} FAILED: {e}", flush=True)
        results.setdefault("seconds", {})[name] = time.monotonic() - t0
        save()

    part("environment", environment)
    wanted = args.parts.split(",")
    if "engine" in wanted:
        part("engine", engine_part, args.model, provider, args.steps)
    if "serve" in wanted:
        part("serve_run", serve_part, args.model, provider, args.clients, args, args.out,
             results, save)
    if "speculative" in wanted:
        part("speculative", speculative_part, args.model, provider, min(args.new_tokens, 96))
    engine, serve = results.get("engine", {}), results.get("serve", {}).get("levels", {})
    if engine and str(32) in serve:
        results["targets"] = {
            "serve32_over_static32": serve["32"]["aggregate_tok_s"] / engine["decode_tok_s_b32"],
            # against the faster static rate: its steps returning ids picked on the device
            "serve32_over_static32_ids": serve["32"]["aggregate_tok_s"] / max(
                engine["decode_tok_s_b32"], engine.get("decode_ids_tok_s_b32", 0)),
            "itl_p99_over_b1_step": {n: 1e3 * row["itl_p99_s"] / engine["decode_step_ms_b1"]
                                     for n, row in serve.items() if row.get("itl_p99_s")}}
        t = results["targets"]
        t["met"] = {"serve32_over_static32": t["serve32_over_static32"]
                    >= targets.GPU_SERVE_VS_STATIC,
                    "itl_p99_over_b1_step": {n: v <= targets.GPU_ITL_P99_VS_STEP
                                             for n, v in t["itl_p99_over_b1_step"].items()}}
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    save()
    print(json.dumps(results.get("targets", {}), indent=1))
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

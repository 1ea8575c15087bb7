"""Speculative decoding, measured on SmolLM2-135M-Instruct: decode tok/s, time to first token
and acceptance, with and without speculation, on workloads whose answers repeat the prompt and
on free text.

    python -m benchmarks.generation.speculative --fp32 models/smollm2-fp32 \\
        --int8 models/smollm2-int8 --int4 models/smollm2-int4 \\
        --out results/speculative-2026-11-24.json --plot docs/speculative.png

Workloads (chat prompts, greedy, up to --new-tokens tokens):
  edit     return a paragraph with one spelling fixed
  code     rename a variable in a 12-line Python function
  quote    answer a question about a passage, quoting it
  story    a short story (free text: little to look up)
  chat     the third turn of a conversation

Configurations: each folder plain ("off") and with prompt lookup ("ngram"); fp32 with the int4
(or int8) folder as a draft model ("draft"). Each configuration runs every workload --repeat
times, interleaved with plain runs on the same session (this machine's speed drifts, and two
sessions over the same weights differ by up to 10%); medians.
``same`` says whether the greedy tokens equal the plain run's (fp32: they must).

llama.cpp (--llama-server BIN --gguf FILE, e.g. the load test's build and its f32 / q8_0 GGUFs
of the same weights): llama-server at 2 threads, one slot, without speculation and with each
of its n-gram drafters (--spec-type ngram-simple, ngram-mod, ngram-cache), the same chat
messages, greedy, the same token budget; decode tok/s and draft counts from its response's
``timings``, runs alternated, medians.

    python -m benchmarks.generation.speculative --fp32 DIR --skip-ours \
        --llama-server ~/.cache/llm-onnx-bench/bin/llama-server \
        --gguf ~/.cache/llm-onnx-bench/models/llama-server/smollm2-135m-instruct-f32.gguf

Rows re-measured for one workload (--workloads code --out new.json) can be merged into the
earlier JSON by hand and the plot drawn again from it:

    python -m benchmarks.generation.speculative --replot results/speculative-2026-11-24.json \
        --plot docs/speculative.png
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from benchmarks.core import record
from benchmarks.core.server import Server, free_port
from llm_onnx.runtime import Model
from llm_onnx.runtime.generation.speculative import SpeculativeOptions

PARAGRAPH = ("The quick brown fox jumpd over the lazy dog. It was a sunny day in the village, "
             "and the children were playing in the park while their parents watched from the "
             "benches. Nobody noticed the fox, who was very pleased with himself. Later that "
             "afternoon, the baker closed his shop early and walked down to the river to feed "
             "the ducks.")
CODE = '''def summarize_orders(orders, tax_rate, discount=0.0):
    subtotal = 0.0
    count = 0
    for order in orders:
        if order.cancelled:
            continue
        subtotal += order.price * order.quantity
        count += 1
    if discount:
        subtotal -= subtotal * discount
    tax = subtotal * tax_rate
    return {"count": count, "subtotal": subtotal, "tax": tax, "total": subtotal + tax}
'''
WORKLOADS = {
    "edit": [{"role": "user", "content": "Fix the spelling mistake in this paragraph and return "
                                         f"the whole paragraph, otherwise unchanged:\n\n{PARAGRAPH}"}],
    # SmolLM2-135M answered "Rename ... and return the whole function:" over a 6-line function
    # with a sentence; it returns this one, though unrenamed (docs/speculative-decoding.md).
    "code": [{"role": "user", "content": "Rewrite this function with the variable `subtotal` "
                                         f"renamed to `net`:\n\n```python\n{CODE}```"}],
    "quote": [{"role": "user", "content": f"{PARAGRAPH}\n\nWhat did the baker do? Quote the "
                                          "sentence from the passage."}],
    "story": [{"role": "user", "content": "Write a short story about a lighthouse keeper who "
                                          "finds a message in a bottle."}],
    "chat": [{"role": "user", "content": "What is a good name for a cat?"},
             {"role": "assistant", "content": "How about Whiskers, Luna or Oliver?"},
             {"role": "user", "content": "I like Luna. Can you suggest three more names like "
                                         "Luna, and say why each one is like Luna?"}]}


def run_one(model: Model, prompt: list[int], new_tokens: int, speculative) -> dict:
    gen = model.generator(model.options(max_new_tokens=new_tokens, temperature=0),
                          speculative=speculative)
    start = time.perf_counter()
    gen.append_tokens(prompt)
    first = None
    n = 0
    for _ in gen.events():
        n += 1
        if first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    s = gen.stats
    return {"tokens": gen.result().token_ids, "ttft_s": first - start,
            "decode_tok_s": (n - 1) / (end - first) if n > 1 and end > first else 0.0,
            "runs": s.decode_runs + s.verify_runs, "drafted": s.drafted_tokens,
            "accepted": s.accepted_tokens}


def compare(model: Model, prompt: list[int], new_tokens: int, repeat: int, speculative) -> dict:
    """Plain and ``speculative`` runs of one prompt on one session, interleaved after a warm-up
    of each: medians, the speedup, acceptance, runs, and whether the tokens equal plain's."""
    run_one(model, prompt, 8, "off")  # warm-up
    run_one(model, prompt, 8, speculative)
    base, spec = [], []
    for _ in range(repeat):
        base.append(run_one(model, prompt, new_tokens, "off"))
        spec.append(run_one(model, prompt, new_tokens, speculative))
    b = statistics.median(r["decode_tok_s"] for r in base)
    f = statistics.median(r["decode_tok_s"] for r in spec)
    drafted = sum(r["drafted"] for r in spec)
    return {"tokens": len(spec[0]["tokens"]),
            "plain_decode_tok_s": b, "decode_tok_s": f, "speedup": f / b if b else 0.0,
            "plain_ttft_s": statistics.median(r["ttft_s"] for r in base),
            "ttft_s": statistics.median(r["ttft_s"] for r in spec),
            "acceptance": sum(r["accepted"] for r in spec) / drafted if drafted else 0.0,
            "runs": spec[0]["runs"], "plain_runs": base[0]["runs"],
            "same": all(r["tokens"] == base[0]["tokens"] for r in spec)}


def crossover(args) -> list[dict]:
    """n rows decoding together in one generator (the server's case), each speculating alone
    (max_rows n) or all in one batched decode run (max_rows 0): aggregate tok/s."""
    model = Model.load(args.fp32, threads=args.threads, speculative="off")
    rows = []
    for name in ("edit", "story"):
        prompt = model.chat_prompt(WORKLOADS[name])
        for n in args.crossover:
            speeds: dict = {0: [], n: []}
            for _ in range(args.repeat):
                for max_rows in (0, n):
                    spec = SpeculativeOptions(method="ngram", max_rows=max_rows)
                    gen = model.generator(model.options(max_new_tokens=args.new_tokens,
                                                        temperature=0), batch=n,
                                          speculative=spec)
                    for row in range(n):
                        gen.append_tokens(prompt, row=row)
                    gen.prefill_step()
                    start, count = time.perf_counter(), 0
                    for _ in gen.events():
                        count += 1
                    speeds[max_rows].append(count / (time.perf_counter() - start))
            plain, fast = statistics.median(speeds[0]), statistics.median(speeds[n])
            rows.append({"workload": name, "rows": n, "plain_tok_s": plain,
                         "speculative_tok_s": fast, "ratio": fast / plain})
            print(f"crossover {name:6} {n} rows: batched {plain:6.1f}  each speculating "
                  f"{fast:6.1f} tok/s  x{fast / plain:.2f}", flush=True)
    return rows


def llama_part(args) -> list[dict]:
    """llama-server without and with its n-gram speculation, the same workloads."""
    import httpx

    rows = []
    for gguf in args.gguf:
        servers = {}
        for spec in ["none"] + args.spec_types:
            port = free_port()
            cmd = [args.llama_server, "-m", gguf, "--host", "127.0.0.1", "--port", port, "-np",
                   1, "-c", 4096, "-t", args.threads, "-tb", args.threads, "--no-webui",
                   "--log-disable", "--spec-type", spec]
            servers[spec] = Server(f"llama-server {spec}", cmd, port,
                                   Path("/tmp") / f"llama-spec-{spec}.log")
        try:
            for name in args.workloads:
                body = {"messages": WORKLOADS[name], "max_tokens": args.new_tokens,
                        "temperature": 0, "cache_prompt": False}
                got: dict = {spec: [] for spec in servers}
                for _ in range(args.repeat + 1):  # the first round warms up
                    for spec, server in servers.items():
                        r = httpx.post(server.url + "/v1/chat/completions", json=body,
                                       timeout=300).json()
                        got[spec].append((r["timings"], r["choices"][0]["message"]["content"]))
                base = statistics.median(t["predicted_per_second"] for t, _ in got["none"][1:])
                for spec in args.spec_types:
                    runs = got[spec][1:]
                    speed = statistics.median(t["predicted_per_second"] for t, _ in runs)
                    drafted = sum(t.get("draft_n", 0) for t, _ in runs)
                    accepted = sum(t.get("draft_n_accepted", 0) for t, _ in runs)
                    row = {"gguf": gguf.name, "spec_type": spec, "workload": name,
                           "tokens": runs[0][0]["predicted_n"], "plain_decode_tok_s": base,
                           "decode_tok_s": speed, "speedup": speed / base if base else 0.0,
                           "acceptance": accepted / drafted if drafted else 0.0,
                           "same": all(text == got["none"][1][1] for _, text in runs)}
                    rows.append(row)
                    print(f"llama.cpp {gguf.stem[-4:]} {spec:12} {name:6} {row['tokens']:4d} tok  "
                          f"plain {base:6.1f}  spec {speed:6.1f} tok/s  x{row['speedup']:.2f}  "
                          f"acceptance {row['acceptance']:.2f}  same {row['same']}", flush=True)
        finally:
            for server in servers.values():
                server.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fp32", type=Path)
    ap.add_argument("--int8", type=Path)
    ap.add_argument("--int4", type=Path)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--llama-server", type=Path, help="llama-server binary (llama.cpp's part)")
    ap.add_argument("--gguf", type=Path, nargs="+", default=[], help="GGUF files for it")
    ap.add_argument("--spec-types", nargs="+", default=["ngram-simple", "ngram-mod", "ngram-cache"])
    ap.add_argument("--skip-ours", action="store_true", help="only llama.cpp's part")
    ap.add_argument("--crossover", type=int, nargs="*", default=[],
                    help="also: N rows decoding together, speculating each or batched (e.g. 1 2 4)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--replot", type=Path, metavar="JSON",
                    help="only draw --plot from the rows of an earlier run's JSON")
    args = ap.parse_args()
    if args.replot is not None:
        if args.plot is None:
            ap.error("--replot JSON needs --plot PNG")
        plot(json.loads(args.replot.read_text())["rows"], args.plot)
        return
    if args.fp32 is None:
        ap.error("--fp32 DIR is required (the target model folder)")

    folders = {"fp32": args.fp32, "int8": args.int8, "int4": args.int4}
    configs = [("fp32", "ngram", None)]
    draft = args.int4 or args.int8
    if draft is not None:
        configs.append(("fp32", "draft", draft))
    for precision in ("int8", "int4"):
        if folders[precision] is not None:
            configs.append((precision, "ngram", None))
    models: dict = {}
    rows = []
    for precision, method, draft_folder in ([] if args.skip_ours else configs):
        # One session per folder, plain and speculative runs alike: two sessions over the same
        # weights differ by up to 10% in speed here, which would swamp what is measured.
        if precision not in models:
            models[precision] = Model.load(folders[precision], threads=args.threads,
                                           speculative="off")
        plain = models[precision]
        speculative = SpeculativeOptions(method=method)
        if draft_folder is not None:
            speculative = SpeculativeOptions(method="draft", draft_model=Model.load(
                draft_folder, threads=args.threads, speculative="off"))
        for name in args.workloads:
            prompt = plain.chat_prompt(WORKLOADS[name])
            row = {"precision": precision, "method": method,
                   "draft": draft_folder.name if draft_folder else None, "workload": name,
                   **compare(plain, prompt, args.new_tokens, args.repeat, speculative)}
            b, f = row["plain_decode_tok_s"], row["decode_tok_s"]
            rows.append(row)
            print(f"{precision:5} {method:5} {name:6} {row['tokens']:4d} tok  plain "
                  f"{b:6.1f}  spec {f:6.1f} tok/s  x{row['speedup']:.2f}  acceptance "
                  f"{row['acceptance']:.2f}  runs {row['runs']}/{row['plain_runs']}  "
                  f"same {row['same']}", flush=True)
    data = {"date": time.strftime("%Y-%m-%d"), "machine": platform.machine(),
            "threads": args.threads, "new_tokens": args.new_tokens, "repeat": args.repeat,
            "model": "SmolLM2-135M-Instruct", "rows": rows}
    if args.crossover:
        data["crossover"] = crossover(args)
    if args.llama_server is not None:
        data["llama_server"] = llama_part(args)
    if args.out:
        record.write(args.out, "generation.speculative", data)
    if args.plot:
        plot(rows, args.plot)


def plot(rows: list[dict], path: Path) -> None:
    """Bars of the speed-up per workload, one colour per precision and drafter."""
    from llm_onnx.bench import pyplot

    plt = pyplot()
    order = [w for w in WORKLOADS if any(r["workload"] == w for r in rows)]
    labels = list(dict.fromkeys(f"{r['precision']} {r['method']}" for r in rows))
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        by_workload = {r["workload"]: r for r in rows if f"{r['precision']} {r['method']}" == label}
        xs = [j for j, w in enumerate(order) if w in by_workload]
        ax.bar([j + i * width for j in xs], [by_workload[order[j]]["speedup"] for j in xs], width,
               label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(order))], order)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("decode speed-up over plain")
    ax.set_title("Speculative decoding, SmolLM2-135M, 2 CPU threads, greedy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)

if __name__ == "__main__":
    main()

"""Server soak: mixed traffic from concurrent clients against one `llm-onnx serve` for a long
time, reporting the server's memory, errors and latency per time window.

    python -m benchmarks.serving.soak                        # 60 minutes, 8 clients
    python -m benchmarks.serving.soak --minutes 5 --window 1  # a smoke run

The server runs the given model folder (default: SmolLM2-135M-Instruct fp32, the default model)
with the `chatml-tools` template, 2 threads, its default 8 rows. Each client sends requests one
after another, drawn (seeded) from this mix:

  stream      streamed chat answer, 64 tokens at most (time to first token, inter-token gaps)
  complete    plain completion, 32 tokens, not streamed
  cancel      streamed chat, the client disconnects after a few chunks (the row must be freed)
  bad         a malformed request (bad JSON, temperature 7, unknown model, n = 0): must be a 4xx
  long        a prompt of about 1,500 tokens, 16 new tokens
  schema      a JSON-schema-constrained chat answer (response_format json_schema), validated
  tool        a tool call with tool_choice "required", its arguments parsed (finish reason
              "length" counts as an answer: a weak model may write a long argument)

Every window (default 10 minutes) reports requests by kind and status, 5xx answers and
connection errors, the server's RSS (sampled every 5 s), time to first token and inter-token
latency (p50 / p99 of the streamed kinds). Targets: zero 5xx, RSS after the first window within
5% of its value there, p99 inter-token latency of every later window within 20% of the first's.
Results go to --out (JSON) and a table on stdout. Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from benchmarks.core import record, targets
from benchmarks.core.server import free_port
from benchmarks.core.timing import nearest_rank as percentile

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                           "age": {"type": "integer", "minimum": 0}},
          "required": ["name", "age"]}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TOPICS = ["the sea", "a lighthouse", "bread", "trains", "the moon", "a garden", "winter",
          "a library", "bees", "a river"]
MIX = {"stream": 30, "complete": 15, "cancel": 12, "bad": 10, "long": 8, "schema": 15, "tool": 10}
BAD = [b'{"model": "m", "messages": [', b'{"messages": [{"role": "user", "content": "x"}], '
       b'"temperature": 7}', b'{"model": "no-such-model", "messages": [{"role": "user", '
       b'"content": "x"}]}', b'{"messages": [{"role": "user", "content": "x"}], "n": 0}']


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Soak:
    def __init__(self, url: str, model: str, seed: int) -> None:
        self.url, self.model = url, model
        self.rng = random.Random(seed)
        self.events: list[dict] = []  # one per request: t, kind, status, ttft, gaps, error

    def record(self, **event) -> None:
        self.events.append({"t": time.monotonic(), **event})

    def chat(self, kind: str) -> dict:
        topic = self.rng.choice(TOPICS)
        body: dict = {"model": self.model, "max_tokens": 64, "temperature": 0.7,
                      "seed": self.rng.randrange(1 << 30),
                      "messages": [{"role": "user", "content": f"Tell me about {topic}."}]}
        if kind == "long":
            text = " ".join(f"Paragraph {i} is about {self.rng.choice(TOPICS)}." for i in range(170))
            body.update(max_tokens=16, messages=[{"role": "user",
                                                  "content": text + " Summarize."}])
        elif kind == "schema":
            body["messages"][0]["content"] = f"Invent a person who likes {topic}, as JSON."
            body.update(max_tokens=120, response_format={
                "type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
        elif kind == "tool":
            body.update(max_tokens=100, tools=[WEATHER], tool_choice="required",
                        messages=[{"role": "user", "content": f"Weather near {topic}?"}])
        return body

    async def one(self, client: httpx.AsyncClient, kind: str) -> None:
        start = time.monotonic()
        try:
            if kind == "bad":
                r = await client.post(self.url + "/v1/chat/completions",
                                      content=self.rng.choice(BAD),
                                      headers={"Content-Type": "application/json"})
                ok = 400 <= r.status_code < 500 and "error" in r.json()
                self.record(kind=kind, status=r.status_code, error=None if ok else r.text[:200])
                return
            if kind == "complete":
                r = await client.post(self.url + "/v1/completions", json={
                    "model": self.model, "prompt": f"A short note on {self.rng.choice(TOPICS)}:",
                    "max_tokens": 32, "temperature": 0.8, "seed": self.rng.randrange(1 << 30)})
                ok = r.status_code == 200 and r.json()["choices"][0]["text"] is not None
                self.record(kind=kind, status=r.status_code, error=None if ok else r.text[:200])
                return
            body = self.chat(kind)
            if kind in ("schema", "tool"):
                r = await client.post(self.url + "/v1/chat/completions", json=body)
                error = None
                if r.status_code == 200:
                    message = r.json()["choices"][0]["message"]
                    finish = r.json()["choices"][0]["finish_reason"]
                    if kind == "schema" and finish == "stop":
                        doc = json.loads(message["content"])
                        if not (isinstance(doc.get("name"), str)
                                and isinstance(doc.get("age"), int)):
                            error = f"invalid document {message['content'][:100]}"
                    if kind == "tool" and finish != "length":  # a weak model may run long
                        calls = message.get("tool_calls") or []
                        if finish != "tool_calls" or not calls:
                            error = f"no tool call ({finish})"
                        else:
                            json.loads(calls[0]["function"]["arguments"])
                else:
                    error = r.text[:200]
                self.record(kind=kind, status=r.status_code, error=error)
                return
            body["stream"] = True
            stop_after = self.rng.randint(2, 8) if kind == "cancel" else None
            arrivals: list[float] = []
            async with client.stream("POST", self.url + "/v1/chat/completions",
                                     json=body) as r:
                if r.status_code != 200:
                    self.record(kind=kind, status=r.status_code,
                                error=(await r.aread())[:200].decode(errors="replace"))
                    return
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                        arrivals.append(time.monotonic())
                        if stop_after is not None and len(arrivals) >= stop_after:
                            break  # leaving the block closes the connection mid-stream
            gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
            self.record(kind=kind, status=200, error=None,
                        ttft=arrivals[0] - start if arrivals else None, gaps=gaps)
        except (httpx.HTTPError, json.JSONDecodeError, KeyError) as e:
            self.record(kind=kind, status=None, error=f"{type(e).__name__}: {e}"[:200])

    async def client(self, deadline: float) -> None:
        kinds, weights = list(MIX), list(MIX.values())
        async with httpx.AsyncClient(timeout=300) as client:
            while time.monotonic() < deadline:
                await self.one(client, self.rng.choices(kinds, weights)[0])


def windows(events: list[dict], rss: list[tuple[float, float]], start: float, window_s: float,
            count: int) -> list[dict]:
    out = []
    for w in range(count):
        lo, hi = start + w * window_s, start + (w + 1) * window_s
        mine = [e for e in events if lo <= e["t"] < hi]
        gaps = [g for e in mine for g in e.get("gaps") or []]
        ttfts = [e["ttft"] for e in mine if e.get("ttft") is not None]
        samples = [m for t, m in rss if lo <= t < hi]
        kinds: dict[str, dict[str, int]] = {}
        for e in mine:
            k = kinds.setdefault(e["kind"], {})
            k[str(e["status"])] = k.get(str(e["status"]), 0) + 1
        out.append({
            "window": w + 1, "minutes": [round(w * window_s / 60, 1),
                                         round((w + 1) * window_s / 60, 1)],
            "requests": len(mine), "by_kind": kinds,
            "server_errors_5xx": sum(1 for e in mine if (e["status"] or 0) >= 500),
            "connection_errors": sum(1 for e in mine if e["status"] is None),
            "wrong_answers": [e["error"] for e in mine
                              if e["error"] and e["status"] is not None
                              and (e["status"] or 0) < 500][:5],
            "rss_mib_end": samples[-1] if samples else None,
            "rss_mib_max": max(samples) if samples else None,
            "ttft_ms": {"p50": _ms(percentile(ttfts, 0.5)), "p99": _ms(percentile(ttfts, 0.99))},
            "itl_ms": {"p50": _ms(percentile(gaps, 0.5)), "p99": _ms(percentile(gaps, 0.99))},
        })
    return out


def _ms(value: float | None) -> float | None:
    return None if value is None else round(1000 * value, 1)


def verdict(rows: list[dict]) -> dict:
    first, later = rows[0], rows[1:] or rows
    growth = (max(r["rss_mib_max"] for r in later) / first["rss_mib_end"] - 1
              if first["rss_mib_end"] else None)
    base = first["itl_ms"]["p99"]
    drift = max(abs(r["itl_ms"]["p99"] / base - 1) for r in later) if base else None
    fives = sum(r["server_errors_5xx"] for r in rows)
    return {"server_errors_5xx": fives,
            "connection_errors": sum(r["connection_errors"] for r in rows),
            "rss_growth_after_first_window": growth, "itl_p99_drift": drift,
            "targets": {
                "zero 5xx": fives == targets.SOAK_SERVER_ERRORS,
                f"RSS flat (<= {targets.SOAK_RSS_GROWTH:.0%} growth)":
                    growth is not None and growth <= targets.SOAK_RSS_GROWTH,
                f"p99 ITL within {targets.SOAK_ITL_P99_DRIFT:.0%}":
                    drift is not None and drift <= targets.SOAK_ITL_P99_DRIFT}}


def table(rows: list[dict]) -> str:
    lines = ["| window (min) | requests | 5xx | conn. errors | RSS end (MiB) | TTFT p50/p99 ms "
             "| ITL p50/p99 ms |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['minutes'][0]:g}-{r['minutes'][1]:g} | {r['requests']} | "
                     f"{r['server_errors_5xx']} | {r['connection_errors']} | "
                     f"{r['rss_mib_end']:.0f} | {r['ttft_ms']['p50']} / {r['ttft_ms']['p99']} | "
                     f"{r['itl_ms']['p50']} / {r['itl_ms']['p99']} |")
    return "\n".join(lines)


async def run(args, url: str, model: str, pid: int) -> dict:
    soak = Soak(url, model, args.seed)
    rss: list[tuple[float, float]] = []
    start = time.monotonic()
    deadline = start + args.minutes * 60

    async def sample() -> None:
        while time.monotonic() < deadline:
            rss.append((time.monotonic(), rss_mib(pid)))
            await asyncio.sleep(5)

    clients = [Soak(url, model, args.seed + i) for i in range(args.clients)]
    for c in clients:
        c.events = soak.events  # one log
    await asyncio.gather(sample(), *(c.client(deadline) for c in clients))
    count = max(1, round(args.minutes / args.window))
    rows = windows(soak.events, rss, start, args.window * 60, count)
    return {"windows": rows, "verdict": verdict(rows),
            "rss_series_mib": [(round(t - start, 1), round(m, 1)) for t, m in rss]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model folder (default: the default model)")
    p.add_argument("--minutes", type=float, default=60)
    p.add_argument("--window", type=float, default=10, help="minutes per reported window")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path,
                   default=Path.home() / ".cache" / "llm-onnx-bench" / "soak" / "results.json")
    args = p.parse_args()
    if args.model is None:
        from llm_onnx.default_model import default_model_folder

        args.model = str(default_model_folder(progress=True))
    port = free_port()
    log = args.out.parent / "server.log"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "llm_onnx.cli", "serve", "--model", args.model, "--port",
           str(port), "--threads", str(args.threads), "--chat-template", "chatml-tools",
           "--log-level", "warning"]
    with open(log, "w") as out:
        server = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None:
                sys.exit(f"the server exited (code {server.returncode}); see {log}")
            time.sleep(0.5)
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        print(f"soak: {args.minutes:g} min, {args.clients} clients, model {model}, server pid "
              f"{server.pid}", flush=True)
        result = asyncio.run(run(args, url, model, server.pid))
        metrics = httpx.get(url + "/metrics").text
        result["metrics_tail"] = [line for line in metrics.splitlines()
                                  if line.startswith(("llm_onnx_requests", "llm_onnx_running",
                                                      "llm_onnx_queue"))][:40]
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    result.update(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  machine=f"{os.uname().machine}, {os.cpu_count()} cores, {args.threads} threads",
                  settings=vars(args) | {"out": str(args.out)}, mix=MIX)
    record.write(args.out, "serving.soak", result, indent=2)
    print(table(result["windows"]))
    print(json.dumps(result["verdict"], indent=2))
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()

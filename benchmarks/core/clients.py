"""Streaming clients against an OpenAI-style server: N clients each sending their requests one
after another (completions, or chat for the structured-output benchmarks), every token chunk
time-stamped on arrival; the aggregate rate, time to first token and inter-token latency; and the
server's own account of its time (its /metrics)."""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import time

from benchmarks.core.timing import percentile


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


async def chat_stream(client, url: str, body: dict) -> dict:
    """One streamed chat request: when it was sent, when each content chunk arrived, the reply's
    text and finish reason, and its completion tokens."""
    sent = time.perf_counter()
    stamps, text, usage, finish = [], [], None, None
    async with client.stream("POST", url + "/v1/chat/completions",
                             json={**body, "stream": True,
                                   "stream_options": {"include_usage": True}}) as response:
        if response.status_code != 200:
            return {"error": f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"}
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            usage = data.get("usage") or usage
            choices = data.get("choices") or []
            if choices:
                piece = (choices[0].get("delta") or {}).get("content")
                if piece:
                    stamps.append(time.perf_counter())
                    text.append(piece)
                finish = choices[0].get("finish_reason") or finish
    return {"sent": sent, "stamps": stamps, "text": "".join(text), "finish": finish,
            "tokens": usage["completion_tokens"] if usage else len(stamps)}


async def clients_load(url: str, body: dict, clients: int, per_client: int) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:
        start = time.perf_counter()

        async def user() -> list[dict]:
            return [await chat_stream(client, url, body) for _ in range(per_client)]

        done = await asyncio.gather(*(user() for _ in range(clients)))
    requests = [r for rs in done for r in rs]
    ok = [r for r in requests if "error" not in r and r["stamps"]]
    end = max((r["stamps"][-1] for r in ok), default=start)
    tokens = sum(r["tokens"] for r in ok)
    ttft = [r["stamps"][0] - r["sent"] for r in ok]
    itl = [b - a for r in ok for a, b in zip(r["stamps"], r["stamps"][1:])]
    return {"aggregate_tok_s": tokens / (end - start) if end > start else 0.0, "tokens": tokens,
            "errors": len(requests) - len(ok), "ttft_p50_s": percentile(ttft, 0.5),
            "ttft_p99_s": percentile(ttft, 0.99), "itl_p50_s": percentile(itl, 0.5),
            "itl_p99_s": percentile(itl, 0.99)}

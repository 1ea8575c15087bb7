"""Prometheus metrics of a server (``GET /metrics``), fed by the scheduler as it works.

Names follow Prometheus' conventions (``_total`` counters, ``_seconds`` units):

    llm_onnx_requests_total{endpoint, status}      HTTP answers by status code ("499": the client
                                                    went away before the answer was complete)
    llm_onnx_request_finish_total{reason}          stop | length | cancelled (by a client or at
                                                    shutdown) | error
    llm_onnx_prompt_tokens_total                   prompt tokens of requests that started
    llm_onnx_prompt_tokens_cached_total            ... of which a row's cache already held
    llm_onnx_generation_tokens_total               tokens generated
    llm_onnx_queue_depth                           requests waiting for a row
    llm_onnx_running_requests                      rows decoding (the running batch size)
    llm_onnx_batch_rows                            rows the scheduler has (--max-batch)
    llm_onnx_time_to_first_token_seconds           submit to first token (histogram)
    llm_onnx_inter_token_latency_seconds           between a request's tokens (histogram)
    llm_onnx_request_duration_seconds              submit to last token (histogram)
    llm_onnx_model_run_seconds_total{phase}        inside the model: prefill | decode runs
    llm_onnx_scheduler_step_seconds_total          inside scheduler steps (model runs plus the
                                                    host work: sampling, text, delivery)
    llm_onnx_decode_runs_total, llm_onnx_decode_rows_total, llm_onnx_decode_row_slots_total
                                                    batched decode runs, the rows they
                                                    decoded (rows / runs: the mean batch), and
                                                    the rows in their ranges (idle ones ride
                                                    along)
    llm_onnx_prefill_tokens_total                  prompt tokens run (cached ones are not)
    llm_onnx_constrained_requests_total{kind}      replies under a constraint: json_schema |
                                                    json_object | regex | grammar | choice |
                                                    tools (a tool choice's grammar)
    llm_onnx_constraint_mask_seconds_total         filling constrained rows' token masks (on a
                                                    helper thread, overlapping the model runs)
    llm_onnx_constraint_mask_wait_seconds_total    ... of it the steps waited for after a run
    llm_onnx_constraint_masks_total                masks filled (one per constrained row a step)
    llm_onnx_forced_tokens_total                   tokens a grammar forced, appended without a
                                                    pick (fast-forward)
    llm_onnx_tool_calls_total                      tool calls in replies
    llm_onnx_ignored_fields_total{api, field}      request fields accepted and ignored (the
                                                    field policy: policy.py)

The time counters let a load test say where its wall time went: model runs, host work in the
scheduler, or idle (waiting for requests).
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from llm_onnx.runtime.generation.results import Result, TokenEvent
from llm_onnx.runtime.generation.scheduler import Request, Scheduler

CONTENT_TYPE = CONTENT_TYPE_LATEST

_LATENCY = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
            10.0)
_DURATION = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


class Metrics:
    """The server's metrics in a registry of their own (several servers in one process, as in
    tests, do not mix). Implements the scheduler's Observer protocol."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("llm_onnx_requests", "HTTP answers by endpoint and status code.",
                                ["endpoint", "status"], registry=r)
        self.finished = Counter("llm_onnx_request_finish", "Generations ended, by reason.",
                                ["reason"], registry=r)
        self.prompt_tokens = Counter("llm_onnx_prompt_tokens", "Prompt tokens of started "
                                     "requests.", registry=r)
        self.cached_tokens = Counter("llm_onnx_prompt_tokens_cached", "Prompt tokens a row's "
                                     "cache already held (not run again).", registry=r)
        self.generated = Counter("llm_onnx_generation_tokens", "Tokens generated.", registry=r)
        self.queue_depth = Gauge("llm_onnx_queue_depth", "Requests waiting for a row.",
                                 registry=r)
        self.running = Gauge("llm_onnx_running_requests", "Rows decoding: the running batch "
                             "size.", registry=r)
        self.rows = Gauge("llm_onnx_batch_rows", "Rows of the scheduler (--max-batch).",
                          registry=r)
        self.cache_committed = Gauge("llm_onnx_cache_committed_bytes", "Most bytes the running "
                                     "requests' rows of the cache may hold (their prompt and "
                                     "max_tokens, a recurrent state with its checkpoints).",
                                     registry=r)
        self.cache_limit = Gauge("llm_onnx_cache_limit_bytes", "--max-cache-memory (0: rows "
                                 "only).", registry=r)
        self.ttft = Histogram("llm_onnx_time_to_first_token_seconds", "Submit to first token.",
                              buckets=_LATENCY, registry=r)
        self.itl = Histogram("llm_onnx_inter_token_latency_seconds", "Time between a request's "
                             "consecutive tokens.", buckets=_LATENCY, registry=r)
        self.duration = Histogram("llm_onnx_request_duration_seconds", "Submit to last token.",
                                  buckets=_DURATION, registry=r)
        self.constrained = Counter("llm_onnx_constrained_requests", "Replies under a constraint, "
                                   "by kind.", ["kind"], registry=r)
        self.tool_calls = Counter("llm_onnx_tool_calls", "Tool calls in replies.", registry=r)
        self.ignored_fields = Counter("llm_onnx_ignored_fields", "Request fields accepted and "
                                      "ignored, by API and field.", ["api", "field"], registry=r)

    def attach(self, scheduler: Scheduler) -> None:
        self.queue_depth.set_function(lambda: scheduler.queued)
        self.running.set_function(lambda: scheduler.running)
        self.rows.set(scheduler.max_batch)
        self.cache_committed.set_function(lambda: scheduler.committed_bytes)
        self.cache_limit.set(scheduler.max_cache_bytes or 0)
        self.registry.register(_SchedulerTimes(scheduler))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    # ------------------------------------------------------------------ Observer

    def request_started(self, request: Request) -> None:
        self.prompt_tokens.inc(len(request.prompt))

    def token(self, request: Request, event: TokenEvent, now: float) -> None:
        if event.token_id < 0:  # an end without a token (max_tokens 0, a failed constraint)
            return
        self.generated.inc()
        if request.first_token_at is None:
            self.ttft.observe(now - request.submitted_at)
        elif request.last_token_at is not None:
            self.itl.observe(now - request.last_token_at)

    def request_finished(self, request: Request, result: Result | None,
                         error: BaseException | None) -> None:
        if error is not None:
            self.finished.labels("error").inc()
            return
        reason = result.finish_reason if result is not None else "cancelled"
        self.finished.labels("stop" if reason == "stop_string" else reason).inc()
        if result is not None and request.row is not None:
            self.cached_tokens.inc(max(0, result.prompt_tokens - result.timings.prefill_tokens))
        if request.last_token_at is not None:
            self.duration.observe(request.last_token_at - request.submitted_at)


class _SchedulerTimes:
    """Counters read from the scheduler and its generator when scraped."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def collect(self):  # type: ignore[no-untyped-def]
        stats = self.scheduler.generator.stats
        runs = CounterMetricFamily("llm_onnx_model_run_seconds", "Seconds inside the model, by "
                                   "phase.", labels=["phase"])
        runs.add_metric(["prefill"], stats.prefill_s)
        runs.add_metric(["decode"], stats.decode_s)
        runs.add_metric(["verify"], stats.verify_s)
        runs.add_metric(["draft"], stats.draft_s)
        yield runs
        yield CounterMetricFamily("llm_onnx_scheduler_step_seconds", "Seconds inside scheduler "
                                  "steps (model runs and host work).",
                                  value=self.scheduler.step_seconds)
        yield CounterMetricFamily("llm_onnx_decode_runs", "Batched decode runs.",
                                  value=stats.decode_runs)
        yield CounterMetricFamily("llm_onnx_decode_rows", "Rows decoded by those runs.",
                                  value=stats.decode_rows)
        yield CounterMetricFamily("llm_onnx_decode_row_slots", "Rows in those runs' ranges, idle "
                                  "rows riding along included.", value=stats.decode_row_slots)
        yield CounterMetricFamily("llm_onnx_prefill_tokens", "Prompt tokens run through the "
                                  "model.", value=stats.prefill_tokens)
        yield CounterMetricFamily("llm_onnx_constraint_mask_seconds", "Seconds filling "
                                  "constrained rows' token masks.", value=stats.mask_s)
        yield CounterMetricFamily("llm_onnx_constraint_mask_wait_seconds", "Seconds steps waited "
                                  "for masks after their model run.", value=stats.mask_wait_s)
        yield CounterMetricFamily("llm_onnx_constraint_masks", "Token masks filled.",
                                  value=stats.mask_rows)
        yield CounterMetricFamily("llm_onnx_forced_tokens", "Tokens a grammar forced (appended "
                                  "without a pick).", value=stats.forced_tokens)
        yield CounterMetricFamily("llm_onnx_speculative_verify_runs", "Speculative steps: a "
                                  "row's last token and its draft checked in one run.",
                                  value=stats.verify_runs)
        yield CounterMetricFamily("llm_onnx_speculative_drafted_tokens", "Tokens drafted "
                                  "(prompt lookup or a draft model).", value=stats.drafted_tokens)
        yield CounterMetricFamily("llm_onnx_speculative_accepted_tokens", "Drafted tokens the "
                                  "model picked itself (kept).", value=stats.accepted_tokens)
        yield CounterMetricFamily("llm_onnx_speculative_draft_runs", "Draft-model runs.",
                                  value=stats.draft_runs)
        acceptance = GaugeMetricFamily("llm_onnx_speculative_acceptance_ratio", "Accepted / "
                                       "drafted tokens since the start (0 before any draft).",
                                       value=stats.acceptance)
        yield acceptance


def merge_replicas(parts: list[tuple[str, str]]) -> bytes:
    """Several replicas' expositions as one, each sample with a ``replica`` label (the Ray
    deployment's /metrics): the same metric names, summable across replicas in PromQL."""
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, tuple[str, str, list[str]]] = {}
    for replica, text in parts:
        for family in text_string_to_metric_families(text):
            kind = "untyped" if family.type == "unknown" else family.type
            entry = families.setdefault(family.name, (family.documentation, kind, []))
            for sample in family.samples:
                labels = {**sample.labels, "replica": replica}
                inside = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                entry[2].append(f"{sample.name}{{{inside}}} {_number(sample.value)}")
    lines = []
    for name, (doc, kind, samples) in families.items():
        shown = f"{name}_total" if kind == "counter" else name  # as generate_latest writes it
        lines += [f"# HELP {shown} {doc}", f"# TYPE {shown} {kind}", *samples]
    return ("\n".join(lines) + "\n").encode()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    if value == float("-inf"):
        return "-Inf"
    return repr(float(value))

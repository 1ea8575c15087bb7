"""The batching scheduler without HTTP, against fake engines: join/leave order, chunked prefill
bounds, cancellation, prefix reuse, fairness, errors, and answers equal to solo runs."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from llm_onnx.errors import GenerationError
from llm_onnx.runtime import GenerationOptions, Model
from llm_onnx.runtime.generation.scheduler import QueueFull, Scheduler, SchedulerClosed
from tests.runtime.fakes import FakeEngine, HistoryEngine, tokenizer


def history_model(vocab: int = 50, context: int = 128) -> Model:
    return Model.from_parts(HistoryEngine(vocab, context), None)


def greedy(n: int, **kw) -> GenerationOptions:
    return GenerationOptions(max_new_tokens=n, temperature=0.0, **kw).validated()


def drain(scheduler: Scheduler, limit: int = 10_000) -> int:
    steps = 0
    while scheduler.step():
        steps += 1
        assert steps < limit, "the scheduler never finished"
    return steps


def prompts(n: int, vocab: int = 50, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, int(k)).tolist() for k in rng.integers(1, 30, n)]


def solo(model: Model, prompt, options) -> list[int]:
    return model.generate(prompt, options).token_ids


def test_answers_equal_solo_runs_with_mixed_options():
    """16 requests, mixed prompt lengths and options (greedy, seeded sampling with top-k/top-p,
    penalties, stop ids), 4 rows, 5-token chunks: each answer is the one it gets alone."""
    model = history_model()
    rng = np.random.default_rng(1)
    options = []
    for i in range(16):
        kind = i % 4
        if kind == 0:
            options.append(greedy(int(rng.integers(3, 12))))
        elif kind == 1:
            options.append(GenerationOptions(max_new_tokens=10, temperature=0.9, top_k=10, seed=i)
                           .validated())
        elif kind == 2:
            options.append(GenerationOptions(max_new_tokens=8, temperature=1.2, top_p=0.8,
                                             repetition_penalty=1.3, presence_penalty=0.5,
                                             seed=i).validated())
        else:
            options.append(greedy(12, stop_token_ids=(7, 11)))
    ps = prompts(16)
    scheduler = Scheduler(model, max_batch=4, prefill_chunk=5)
    requests = [scheduler.submit(p, o) for p, o in zip(ps, options)]
    drain(scheduler)
    for p, o, r in zip(ps, options, requests):
        assert r.result().token_ids == solo(model, p, o)


def test_join_and_leave_in_order():
    """Two rows, four requests: the first two run, the third takes the first row that frees,
    the fourth the next; nobody runs before an earlier submission."""
    model = history_model()
    scheduler = Scheduler(model, max_batch=2)
    lengths = [2, 6, 3, 3]
    requests = [scheduler.submit([1 + i, 2, 3], greedy(n)) for i, n in enumerate(lengths)]
    started: list[int] = []
    while scheduler.step():
        for r in requests:
            if r.row is not None and r.id not in started:
                started.append(r.id)
        assert scheduler.running <= 2
    assert started == [r.id for r in requests]
    assert requests[2].row == requests[0].row  # the first row to free
    assert [len(r.result().token_ids) for r in requests] == lengths


def test_chunked_prefill_delays_running_rows_by_one_chunk():
    model = history_model()
    engine = model.engine
    scheduler = Scheduler(model, max_batch=2, prefill_chunk=4)
    first = scheduler.submit([1, 2, 3], greedy(30))
    for _ in range(3):
        scheduler.step()  # first is decoding
    long_prompt = list(range(1, 23))  # 22 tokens
    second = scheduler.submit(long_prompt, greedy(3))
    engine.calls.clear()
    steps = 0
    while second.first_token_at is None:
        scheduler.step()
        steps += 1
    prefills = [c for c in engine.calls if c[0] == "prefill"]
    decodes = [c for c in engine.calls if c[0] == "decode"]
    assert all(len(c[2]) <= 4 for c in prefills)
    assert sum(len(c[2]) for c in prefills) == 22
    assert steps == 6 and len(decodes) == 6  # the running row got a token in every step
    drain(scheduler)
    assert first.result().token_ids == solo(model, [1, 2, 3], greedy(30))
    assert second.result().token_ids == solo(model, long_prompt, greedy(3))


def test_a_prompt_runs_whole_when_nobody_is_decoding():
    model = history_model()
    scheduler = Scheduler(model, max_batch=2, prefill_chunk=4)
    scheduler.submit(list(range(1, 23)), greedy(2))
    drain(scheduler)
    assert model.engine.calls[0] == ("prefill", 0, list(range(1, 23)))


def test_several_short_prompts_share_one_step_budget():
    model = history_model()
    scheduler = Scheduler(model, max_batch=4, prefill_chunk=8)
    runner = scheduler.submit([1, 2], greedy(20))
    scheduler.step()
    engine = model.engine
    engine.calls.clear()
    newcomers = [scheduler.submit([5 + i, 6, 7], greedy(2)) for i in range(3)]
    scheduler.step()
    prefills = [c for c in engine.calls if c[0] == "prefill"]
    # 8 tokens: the third prompt is cut short, and never so that one token is left alone
    assert [len(c[2]) for c in prefills] == [3, 3, 1]
    assert [r.first_token_at is not None for r in newcomers] == [True, True, False]
    engine.calls.clear()
    scheduler.step()
    assert engine.calls[0] == ("prefill", 3, [6, 7])  # its last two tokens, then it decodes
    assert newcomers[2].first_token_at is not None
    drain(scheduler)
    for i, r in enumerate(newcomers):
        assert r.result().token_ids == solo(model, [5 + i, 6, 7], greedy(2))
    assert runner.result().finish_reason == "length"


def test_cancelled_requests_free_their_row_at_the_next_step():
    model = history_model()
    scheduler = Scheduler(model, max_batch=1)
    running = scheduler.submit([1, 2, 3], greedy(50))
    queued = scheduler.submit([4, 5], greedy(50))
    waiting = scheduler.submit([6, 7], greedy(3))
    for _ in range(3):
        scheduler.step()
    running.cancel()
    queued.cancel()
    scheduler.step()
    assert running.finished and running.result().finish_reason == "cancelled"
    assert 0 < len(running.result().token_ids) < 50
    assert queued.finished and queued.result().token_ids == []
    assert waiting.row == 0  # the freed row went to the next request in the same step
    drain(scheduler)
    assert waiting.result().token_ids == solo(model, [6, 7], greedy(3))
    assert not any(c == ("prefill", 0, [4, 5]) for c in model.engine.calls)


def test_a_continued_conversation_prefills_only_the_new_tokens():
    model = history_model()
    scheduler = Scheduler(model, max_batch=3)
    first_prompt = list(range(1, 21))
    other = scheduler.submit([30, 31, 32], greedy(4))  # takes a row first
    first = scheduler.submit(first_prompt, greedy(6))
    drain(scheduler)
    answer = first.result().token_ids
    follow_up = first_prompt + answer + [40, 41, 42]
    engine = model.engine
    engine.calls.clear()
    second = scheduler.submit(follow_up, greedy(5))
    drain(scheduler)
    # the lowest free row (the other request's) takes first's cached prefix, copied from its row
    assert (other.row, first.row, second.row) == (0, 1, 0)
    assert engine.caches[0].copies == [(1, 0, len(first_prompt) + len(answer) - 1)]
    prefilled = sum(len(c[2]) for c in engine.calls if c[0] == "prefill")
    # The cache holds the prompt and every answer token but the last (never run): 4 to run.
    assert prefilled == 4
    assert second.result().timings.prefill_tokens == 4
    assert second.result().token_ids == solo(model, follow_up, greedy(5))


def test_a_shared_system_prompt_is_reused_from_a_free_row():
    model = history_model()
    scheduler = Scheduler(model, max_batch=2)
    system = list(range(1, 31))
    a = scheduler.submit(system + [40, 41], greedy(3))
    drain(scheduler)
    b = scheduler.submit(system + [42, 43, 44], greedy(3))
    drain(scheduler)
    assert b.result().timings.prefill_tokens == 3
    assert b.result().token_ids == solo(model, system + [42, 43, 44], greedy(3))
    assert a.row == b.row


def test_no_request_starves():
    """A long request keeps decoding while a stream of short ones passes through the other row;
    the queue is served in order and everything finishes."""
    model = history_model()
    scheduler = Scheduler(model, max_batch=2, max_queue=100)
    long_one = scheduler.submit([1, 2, 3], greedy(60))
    shorts = [scheduler.submit([4 + i % 40], greedy(2)) for i in range(25)]
    finished_order = []
    while scheduler.step():
        for r in shorts:
            if r.finished and r.id not in finished_order:
                finished_order.append(r.id)
    assert long_one.result().finish_reason == "length" and len(long_one.result().token_ids) == 60
    assert finished_order == [r.id for r in shorts]


def test_queue_limit_and_closing():
    model = history_model()
    scheduler = Scheduler(model, max_batch=1, max_queue=2)
    a = scheduler.submit([1, 2], greedy(3))
    scheduler.submit([3, 4], greedy(3))
    with pytest.raises(QueueFull, match="queue is full"):
        scheduler.submit([5, 6], greedy(3))
    with pytest.raises(QueueFull):  # all or none
        scheduler.submit_many([([7], greedy(1))] * 2)
    scheduler.step()  # a runs: one place frees in the queue
    scheduler.submit([5, 6], greedy(3))
    scheduler.close(timeout=0.0)
    assert a.result().finish_reason in ("cancelled", "length")
    with pytest.raises(SchedulerClosed):
        scheduler.submit([1], greedy(1))


@pytest.mark.parametrize("prompt, fragment", [([], "no tokens"), ([1, 99], "outside the vocabulary"),
                                              (list(range(1, 50)) * 3, "context is 128")])
def test_bad_prompts_are_refused_at_submit(prompt, fragment):
    scheduler = Scheduler(history_model(), max_batch=2)
    with pytest.raises(GenerationError, match=fragment):
        scheduler.submit(prompt, greedy(3))


class _Failing(HistoryEngine):
    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def decode(self, cache, tokens, active=None, first_row=0):
        if self.fail:
            self.fail = False
            raise RuntimeError("device lost")
        return super().decode(cache, tokens, active, first_row)


def test_a_failed_step_fails_the_running_requests_and_the_scheduler_goes_on():
    engine = _Failing()
    model = Model.from_parts(engine, None)
    scheduler = Scheduler(model, max_batch=2)
    a = scheduler.submit([1, 2, 3], greedy(10))
    b = scheduler.submit([4, 5], greedy(10))
    scheduler.step()
    engine.fail = True
    scheduler.step()
    for r in (a, b):
        with pytest.raises(GenerationError, match="RuntimeError: device lost"):
            r.result()
    c = scheduler.submit([1, 2, 3], greedy(4))
    drain(scheduler)
    assert c.result().token_ids == solo(model, [1, 2, 3], greedy(4))


def test_threads_submitting_concurrently_get_their_own_answers():
    model = history_model()
    ps = prompts(12, seed=3)
    opts = [GenerationOptions(max_new_tokens=6, temperature=0.8, seed=i).validated()
            for i in range(12)]
    expected = [solo(model, p, o) for p, o in zip(ps, opts)]
    got: dict[int, list[int]] = {}
    with Scheduler(model, max_batch=4) as scheduler:
        def client(i):
            got[i] = [e.token_id for e in scheduler.submit(ps[i], opts[i])]

        threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert [got[i] for i in range(12)] == expected


def test_text_events_and_logprobs_are_per_request():
    """Word-piece tokens: each request's streamed text is its own, and logprobs are the
    log-softmax of the logits its row produced."""
    script = [[1, 3], [2, 4], [0, 0]]
    model = Model.from_parts(FakeEngine(script), tokenizer(), eos_token_ids=[0])
    scheduler = Scheduler(model, max_batch=2)
    a = scheduler.submit([7, 7], greedy(5), logprobs=2)
    b = scheduler.submit([8], greedy(5), logprobs=0)
    drain(scheduler)
    ra, rb = a.result(), b.result()
    assert (ra.text, rb.text) == ("Hello", " world")
    assert ra.token_ids == [1, 2, 0] and rb.token_ids == [3, 4, 0]
    top = ra.logprobs[0]
    logits = np.zeros(10)
    logits[1] = 10.0
    expected = logits - np.log(np.exp(logits).sum())
    assert top.token_id == 1 and top.logprob == pytest.approx(expected[1])
    assert [t for t, _ in top.top] == [1, 0] and top.top[1][1] == pytest.approx(expected[0])
    assert rb.logprobs[0].top == ()


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 8])
def test_a_prompts_last_run_is_never_a_lone_token(chunk):
    """Whatever the chunk size and the reused prefix, a prompt of two or more tokens gets its
    first token from a prefill run of at least two (the int8 kernels round one-token runs
    differently, see generator._last_run_start)."""
    model = history_model()
    engine = model.engine
    scheduler = Scheduler(model, max_batch=3, prefill_chunk=chunk)
    lone: list[list[int]] = []
    decode = engine.decode

    def checked_decode(cache, tokens, active=None, first_row=0):
        for row in first_row + np.flatnonzero(active):
            request = scheduler._running[int(row)]
            if request.first_token_at is None and len(request.prompt) > 1:
                lone.append(request.prompt)  # its first token would come from this run
        return decode(cache, tokens, active, first_row)

    engine.decode = checked_decode
    rng = np.random.default_rng(chunk)
    base = rng.integers(1, 50, 12).tolist()
    requests = []
    for _ in range(12):  # prompts sharing prefixes of every length with earlier ones
        prompt = base[:int(rng.integers(0, 12))] + rng.integers(1, 50, int(rng.integers(1, 6))).tolist()
        requests.append(scheduler.submit(prompt, greedy(3)))
        scheduler.step()
    drain(scheduler)
    assert lone == []
    engine.decode = decode
    for r in requests:
        assert r.result().token_ids == solo(model, r.prompt, greedy(3))


def test_admission_counts_each_rows_memory_at_its_longest(tiny_export):
    """--max-cache-memory: with room for one and a half rows at their longest, requests take a
    row one after another (a second waits, its row free, until the first finishes); a request
    that alone needs more is refused at once, naming the bound."""
    from llm_onnx.runtime import Model
    from llm_onnx.runtime.generation.scheduler import Scheduler as RealScheduler

    model = Model.load(tiny_export("qwen3_5_tiny", "fp32"), provider="cpu", threads=1)
    opts = GenerationOptions(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    row = model.engine.row_bytes(4 + 8)
    assert row > model.engine.state_bytes_per_row > 0
    batch = RealScheduler(model, max_batch=3, max_length=64, max_cache_bytes=row * 3 // 2)
    requests = [batch.submit([5, 6, 7, 8], opts) for _ in range(3)]
    batch.step()
    assert batch.running == 1 and batch.queued == 2 and batch.committed_bytes == row
    while batch.step():
        assert batch.committed_bytes <= row * 3 // 2 and batch.running <= 1
    assert all(r.result().token_ids == requests[0].result().token_ids for r in requests)
    assert model.engine.row_bytes(64) > row * 3 // 2
    with pytest.raises(GenerationError, match=r"needs .* MiB of cache .*--max-cache-memory"):
        batch.submit(list(range(5, 45)), GenerationOptions(max_new_tokens=20))

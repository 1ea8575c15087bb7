"""The official `openai` client against a real `llm-onnx serve` process: completions and chat,
streamed and not, equal to the runtime's own generation; logprobs equal to the log-softmax of
the model's logits; several choices; 16 concurrent clients."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from llm_onnx.runtime import GenerationOptions
from tests.serve.conftest import wait_until

MODEL = "tiny-chat"


def words(ids) -> str:
    return " ".join(f"t{i}" for i in ids)


def expected_text(model, ids) -> str:
    return model.decode(ids)


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_completion_equals_generate(client, model):
    prompt = "t10 t20 t30 t40"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    ref = model.generate(prompt, max_new_tokens=12, temperature=0)
    assert r.choices[0].text == ref.text
    assert r.choices[0].finish_reason == {"stop": "stop", "length": "length"}[ref.finish_reason]
    assert r.usage.prompt_tokens == 4 and r.usage.completion_tokens == len(ref.token_ids)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")


def test_completion_of_token_ids_and_several_prompts(client, model):
    prompts = [[7, 8, 9], [100, 101, 102, 103, 104, 105, 106, 107]]
    r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    for choice, p in zip(r.choices, prompts):
        assert choice.text == model.generate(p, max_new_tokens=6, temperature=0).text


def test_streamed_completion_equals_generate(client, model):
    prompt = "t3 t1 t4 t1 t5 t9 t2 t6"
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    ref = model.generate(prompt, max_new_tokens=20, temperature=0)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == ref.text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ref.token_ids)
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_equals_model_chat_streamed_and_not(client, model):
    messages = [{"role": "system", "content": "t7 t8"}, {"role": "user", "content": "t11 t12 t13"}]
    ref = model.chat(messages, max_new_tokens=15, temperature=0)
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=15,
                                       temperature=0)
    assert r.choices[0].message.content == ref.text and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(model.chat_prompt(messages))
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    stream = client.chat.completions.create(model=MODEL, messages=messages,
                                            max_completion_tokens=15, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_sampling_options_reach_the_sampler(client, model):
    """seed, temperature, top_p, penalties, stop strings and the extra options each change the
    answer exactly as the runtime's own options do."""
    prompt = "t50 t51 t52"
    body = dict(temperature=1.3, top_p=0.9, seed=42, presence_penalty=0.7, frequency_penalty=0.4,
                max_tokens=25)
    extra = dict(top_k=40, min_p=0.01, repetition_penalty=1.2)
    r = client.completions.create(model=MODEL, prompt=prompt, extra_body=extra, **body)
    opts = GenerationOptions(max_new_tokens=25, temperature=1.3, top_p=0.9, seed=42,
                             presence_penalty=0.7, frequency_penalty=0.4, top_k=40, min_p=0.01,
                             repetition_penalty=1.2)
    ref = model.generate(prompt, opts)
    assert r.choices[0].text == ref.text
    # a stop string taken from the middle of that answer cuts it there
    cut = ref.text.split(" ")
    if len(cut) > 4:
        stop = " " + cut[3]
        s = client.completions.create(model=MODEL, prompt=prompt, stop=[stop], extra_body=extra,
                                      **body)
        assert s.choices[0].text == ref.text[:ref.text.index(stop)]
        assert s.choices[0].finish_reason == "stop"


def test_several_choices_use_seed_plus_index(client, model):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "t9"}],
                                       n=3, temperature=1.0, seed=5, max_tokens=10)
    assert [c.index for c in r.choices] == [0, 1, 2]
    messages = [{"role": "user", "content": "t9"}]
    for j, choice in enumerate(r.choices):
        ref = model.chat(messages, max_new_tokens=10, temperature=1.0, seed=5 + j)
        assert choice.message.content == ref.text
    assert len({c.message.content for c in r.choices}) > 1


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - (x.max() + np.log(np.exp(x - x.max()).sum()))


def test_logprobs_are_the_log_softmax_of_the_models_logits(client, model):
    prompt_ids = [30, 31, 32, 33, 34]
    r = client.completions.create(model=MODEL, prompt=prompt_ids, max_tokens=6, temperature=0.8,
                                  seed=1, logprobs=3)
    lp = r.choices[0].logprobs
    tokens = prompt_ids + [int(t[1:]) for t in lp.tokens]
    engine = model.engine
    for i, (tok, value, top) in enumerate(zip(lp.tokens, lp.token_logprobs, lp.top_logprobs)):
        cache = engine.new_cache(1, len(tokens))
        ref = _log_softmax(engine.prefill(cache, 0, tokens[:len(prompt_ids) + i]))
        assert value == pytest.approx(ref[int(tok[1:])], abs=1e-4)
        best = np.argsort(-ref, kind="stable")[:3]
        assert list(top) == [f"t{j}" for j in best]
        assert list(top.values()) == pytest.approx(ref[best].tolist(), abs=1e-4)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "t1"}],
                                          max_tokens=4, temperature=0, logprobs=True,
                                          top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob == c.logprob
               for c in content)  # greedy: the chosen token is the most likely


def test_sixteen_concurrent_clients_get_their_solo_answers(client, model):
    """Mixed prompt lengths (1 to 60 tokens, longer than a 6-token chunk), lengths and options,
    streamed and not, 16 at once on 4 rows: each answer equals its solo run."""
    rng = np.random.default_rng(4)
    jobs = []
    for i in range(16):
        ids = rng.integers(3, 256, int(rng.integers(1, 60))).tolist()
        opts = dict(max_tokens=int(rng.integers(4, 30)))
        opts.update(temperature=0.0) if i % 2 == 0 else opts.update(temperature=0.9, seed=i,
                                                                    top_p=0.95)
        jobs.append((words(ids), opts, i % 3 == 0))
    answers: dict[int, str] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        prompt, opts, stream = jobs[i]
        try:
            if stream:
                chunks = client.completions.create(model=MODEL, prompt=prompt, stream=True,
                                                   **opts)
                answers[i] = "".join(c.choices[0].text for c in chunks if c.choices)
            else:
                answers[i] = client.completions.create(model=MODEL, prompt=prompt,
                                                       **opts).choices[0].text
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    for i, (prompt, opts, _) in enumerate(jobs):
        runtime_opts = {"max_new_tokens": opts["max_tokens"], "temperature": opts["temperature"]}
        runtime_opts.update({k: opts[k] for k in ("seed", "top_p") if k in opts})
        assert answers[i] == model.generate(prompt, **runtime_opts).text, i


def test_metrics_count_what_was_served(server, client):
    import httpx

    before = httpx.get(server.url + "/metrics").text
    client.completions.create(model=MODEL, prompt="t1 t2 t3", max_tokens=5, temperature=0,
                              extra_body={"ignore_eos": True})
    text = httpx.get(server.url + "/metrics").text

    def value(body: str, name: str) -> float:
        for line in body.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    assert value(text, "llm_onnx_generation_tokens_total") - \
        value(before, "llm_onnx_generation_tokens_total") == 5
    assert value(text, "llm_onnx_prompt_tokens_total") - \
        value(before, "llm_onnx_prompt_tokens_total") == 3
    assert 'llm_onnx_requests_total{endpoint="/v1/completions",status="200"}' in text
    # 3 prompt tokens in one prefill run (the first token), then 4 one-row decode runs
    for name, delta in (("llm_onnx_prefill_tokens_total", 3), ("llm_onnx_decode_runs_total", 4),
                        ("llm_onnx_decode_rows_total", 4)):
        assert value(text, name) - value(before, name) == delta, name
    assert value(text, 'llm_onnx_model_run_seconds_total{phase="decode"}') > \
        value(before, 'llm_onnx_model_run_seconds_total{phase="decode"}')
    # A step's seconds are added as it ends, after it delivered the answer: waited for.
    wait_until(lambda: server.metric("llm_onnx_scheduler_step_seconds_total") >
               value(before, "llm_onnx_scheduler_step_seconds_total"))
    for name in ("llm_onnx_queue_depth", "llm_onnx_running_requests",
                 "llm_onnx_time_to_first_token_seconds_bucket",
                 "llm_onnx_inter_token_latency_seconds_bucket", "llm_onnx_batch_rows"):
        assert name in text

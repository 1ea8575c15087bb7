"""Ray Serve: `llm-onnx serve --ray --replicas 2 --chat-template chatml-tools` (a local Ray
instance on this machine's 2 CPUs, 2 replicas of the tiny byte-level model, 1 thread each)
through the official openai client; requests spread over the replicas; structured output and
tool calls; a replica killed under load; nothing of Ray left after shutdown."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import psutil
import pytest
import ray.serve  # noqa: E402,F401  (the [ray] extra is a required test dependency)

from tests.serve.browser import ChatPage
from tests.serve.conftest import ServerProcess, wait_until

MODEL = "tiny-bytes"
ALIAS = "bytes-alias"  # a second --model-name


def ray_processes() -> list[str]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if proc.info["status"] != psutil.STATUS_ZOMBIE and any(
                    mark in cmd for mark in ("ray::", "raylet", "gcs_server")):
                found.append(f"{proc.pid} {cmd[:80]}")
        except psutil.Error:
            pass
    return found


@pytest.fixture(scope="module")
def model(byte_model_folder):
    from llm_onnx.runtime import Model

    return Model.load(byte_model_folder, provider="cpu", threads=1, chat_template="chatml-tools")


@pytest.fixture(scope="module")
def cluster(byte_model_folder):
    assert not ray_processes(), "a Ray instance is already running on this machine"
    server = ServerProcess(byte_model_folder, "--ray", "--replicas", "2", "--chat-template",
                           "chatml-tools", "--model-name", f"{MODEL},{ALIAS}", timeout=180)
    yield server
    code = server.stop(timeout=60)
    deadline = time.monotonic() + 30
    while ray_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert code == 0, server.output()
    assert not ray_processes(), ray_processes()


def replica_of(response) -> str:
    return response.headers["x-llm-onnx-replica"]


def live_replicas(url: str, want: int, timeout: float = 60.0) -> dict:
    """/health once ``want`` replicas answer it (Ray may still be replacing one), or the last
    answer after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        health = httpx.get(url + "/health", timeout=30).json()
        if len(health["replicas"]) >= want or time.monotonic() > deadline:
            return health
        time.sleep(0.5)


def test_answers_equal_the_runtime_streamed_and_not(cluster, model):
    from openai import OpenAI

    client = OpenAI(base_url=cluster.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    prompt = "t10 t20 t30 t40 t50"
    expected = model.generate(prompt, max_new_tokens=16, temperature=0).text
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
    assert r.choices[0].text == expected
    chunks = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0,
                                       stream=True)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    messages = [{"role": "user", "content": "t7 t8 t9"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                          temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chat) == \
        model.chat(messages, max_new_tokens=12, temperature=0).text


def test_the_replicas_answer_to_the_same_names(cluster):
    """--model-name's aliases reach every replica: accepted in any case, answered under the
    primary name; another name is a 404 listing them, as from `llm-onnx serve`."""
    from openai import NotFoundError, OpenAI

    # printed once serve.run returns, which may be just after the proxy first answers
    wait_until(lambda: f"Model name: {MODEL} (also {ALIAS}; any case)" in cluster.output())
    client = OpenAI(base_url=cluster.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    for name in (ALIAS, "Bytes-Alias", "TINY-BYTES"):
        r = client.completions.create(model=name, prompt="t1 t2", max_tokens=2)
        assert r.model == MODEL
    assert [m.id for m in client.models.list().data] == [MODEL]
    with pytest.raises(NotFoundError) as info:
        client.completions.create(model="gpt-4", prompt="t1", max_tokens=2)
    assert f"`{MODEL}` (also `{ALIAS}`)" in info.value.body["message"]


def test_the_chat_page_through_rays_proxy(cluster, model, browser):
    """The page and its policy come through the Frontend; the answer streams from a replica."""
    chat = ChatPage(browser, cluster).open()
    assert "default-src 'none'" in chat.response.headers["content-security-policy"]
    assert chat.page.inner_text("#model-where").endswith("· Ray Serve")
    chat.settings(temperature=0, max_tokens=12)
    answer = chat.ask("t7 t8 t9")
    expected = model.chat([{"role": "user", "content": "t7 t8 t9"}], max_new_tokens=12,
                          temperature=0).text
    assert chat.raw(answer) == expected and answer.get_attribute("data-state") == "done"
    assert chat.errors == [] and chat.off_server() == []
    chat.close()


def test_structured_output_and_tool_calls(cluster, model):
    """The replicas run the chat template given on the command line and the same constraint
    engine: a JSON schema's answer validates and equals the runtime's; a forced tool call
    parses."""
    import jsonschema
    from openai import OpenAI

    client = OpenAI(base_url=cluster.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 999}},
              "required": ["n"], "additionalProperties": False}
    messages = [{"role": "user", "content": "A number, as JSON."}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=100,
                                       temperature=0, response_format={
                                           "type": "json_schema",
                                           "json_schema": {"name": "n", "schema": schema}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    assert r.choices[0].message.content == \
        model.chat(messages, json_schema=schema, max_new_tokens=100, temperature=0).text
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[tool],
                                       tool_choice="required", max_tokens=200,
                                       parallel_tool_calls=False)
    assert r.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(r.choices[0].message.tool_calls[0].function.arguments),
                        schema)


def test_concurrent_requests_spread_over_both_replicas(cluster, model):
    replicas: list[str] = []
    texts: dict[int, str] = {}

    def ask(i: int) -> None:
        r = httpx.post(cluster.url + "/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": [11 + i, 12, 13], "max_tokens": 300, "temperature": 0,
            "ignore_eos": True})
        replicas.append(replica_of(r))
        texts[i] = r.json()["choices"][0]["text"]

    before = live_replicas(cluster.url, 2)
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(set(replicas)) == 2, (replicas, before, httpx.get(cluster.url + "/health").json(),
                                     cluster.output())
    for i in range(8):
        assert texts[i] == model.generate([11 + i, 12, 13], max_new_tokens=300, temperature=0,
                                          ignore_eos=True).text
    metrics = httpx.get(cluster.url + "/metrics", timeout=30).text
    worked = {line.split('replica="')[1].split('"')[0] for line in metrics.splitlines()
              if line.startswith("llm_onnx_generation_tokens_total{")
              and float(line.rsplit(" ", 1)[1]) > 0}
    assert worked == set(replicas)  # each replica's own counters, labelled with its id
    health = httpx.get(cluster.url + "/health", timeout=30).json()
    assert health["status"] == "ok" and len(health["replicas"]) == 2


def test_a_killed_replica_is_replaced_and_no_request_hangs(cluster, model):
    """Under load, one replica's process is killed: every request gets its correct answer (a
    plain one is retried on the other replica) or, for a stream under way on the dead replica,
    a last error event and [DONE], within the timeout; Ray starts a new replica and the
    deployment serves from two replicas again."""
    seen: set[str] = set()
    while len(seen) < 2:
        seen.add(replica_of(httpx.post(cluster.url + "/v1/completions", timeout=30, json={
            "model": MODEL, "prompt": [1, 2], "max_tokens": 2})))
    victim = int(sorted(seen)[0].split(":")[1])
    prompts = [[40 + i, 41, 42] for i in range(8)]
    outcome: dict[int, tuple] = {}

    def ask(i: int) -> None:
        body = {"model": MODEL, "prompt": prompts[i], "max_tokens": 3000, "temperature": 0,
                "ignore_eos": True}
        try:
            if i % 2:
                r = httpx.post(cluster.url + "/v1/completions", json=body, timeout=60)
                outcome[i] = ("plain", r.status_code, r.json())
            else:
                with httpx.stream("POST", cluster.url + "/v1/completions",
                                  json={**body, "stream": True}, timeout=60) as r:
                    outcome[i] = ("stream", r.status_code, [x for x in r.iter_lines() if x])
        except httpx.HTTPError as e:  # a hang or a cut connection fails the test below
            outcome[i] = ("error", type(e).__name__, str(e))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    started = cluster.metric("llm_onnx_prompt_tokens_total")  # of started requests
    for t in threads:
        t.start()
    # Not a fixed sleep: a slow machine would kill the replica before the requests reached it.
    # All 8 have started on the replicas (a count that only grows: some may already be done).
    wait_until(lambda: cluster.metric("llm_onnx_prompt_tokens_total") >= started + 8 * 3,
               timeout=60)
    os.kill(victim, signal.SIGKILL)
    for t in threads:
        t.join(90)
    assert all(not t.is_alive() for t in threads), "a request hung"
    cut = 0
    for i, (kind, status, body) in sorted(outcome.items()):
        assert kind != "error", (i, status, body)
        expected = model.generate(prompts[i], max_new_tokens=3000, temperature=0,
                                  ignore_eos=True).text
        if kind == "plain":
            assert status in (200, 503), (i, status, body)
            if status == 200:
                assert body["choices"][0]["text"] == expected
            else:
                assert body["error"]["code"] == "service_unavailable"
            continue
        assert status == 200 and body[-1] == "data: [DONE]"
        last = json.loads(body[-2][len("data: "):])
        if "error" in last:
            cut += 1
            assert last["error"]["code"] == "service_unavailable"
        else:
            text = "".join(json.loads(x[len("data: "):])["choices"][0]["text"]
                           for x in body[:-1])
            assert text == expected
    assert cut <= 4  # only streams that were on the killed replica
    deadline = time.monotonic() + 60
    after: set[str] = set()
    while time.monotonic() < deadline and len(after - {f"{sorted(seen)[0]}"}) < 2:
        r = httpx.post(cluster.url + "/v1/completions", timeout=30, json={
            "model": MODEL, "prompt": [1, 2], "max_tokens": 2})
        assert r.status_code == 200
        after.add(replica_of(r))
        time.sleep(0.2)
    assert len(after - {sorted(seen)[0]}) == 2, after  # the survivor and a new replica


def test_the_ray_options_are_checked():
    from llm_onnx.serve import ray_app

    for args, fragment in [({}, "needs model=DIR"), ({"model": "m", "replicas": "0"}, ">= 1"),
                           ({"model": "m", "replicas": "two"}, "whole number"),
                           ({"model": "m", "colour": "red"}, "unknown argument 'colour'"),
                           ({"model": "m", "replicas": "2", "autoscale": "1:3"}, "not both"),
                           ({"model": "m", "autoscale": "3:1"}, "MIN:MAX"),
                           ({"model": "m", "web_ui": "maybe"}, "true or false")]:
        with pytest.raises(ray_app.RayConfigError, match=fragment):
            ray_app.app(args)
    assert ray_app.parse_autoscale("0:4") == (0, 4)
    built = ray_app.app({"model": "m", "autoscale": "1:4", "threads": "2", "max_batch": "16",
                         "web_ui": "false"})
    assert built is not None


def test_replica_metrics_merge_with_a_replica_label():
    from prometheus_client.parser import text_string_to_metric_families

    from llm_onnx.serve.metrics import Metrics, merge_replicas

    a, b = Metrics(), Metrics()
    a.requests.labels("/v1/completions", "200").inc(3)
    b.requests.labels("/v1/completions", "200").inc(2)
    b.ttft.observe(0.03)
    merged = merge_replicas([("h:1", a.exposition().decode()), ("h:2", b.exposition().decode())])
    families = {f.name: f for f in text_string_to_metric_families(merged.decode())}
    requests = {s.labels["replica"]: s.value for s in families["llm_onnx_requests"].samples}
    assert requests == {"h:1": 3.0, "h:2": 2.0}
    counts = {s.labels["replica"]: s.value
              for s in families["llm_onnx_time_to_first_token_seconds"].samples
              if s.name.endswith("_count")}
    assert counts == {"h:1": 0.0, "h:2": 1.0}

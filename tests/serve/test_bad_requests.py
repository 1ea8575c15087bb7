"""What bad input and bad clients get: OpenAI's status codes and error bodies naming the field,
and a server that keeps serving; API keys; a full queue; a client that goes away."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest

from tests.serve.conftest import ServerProcess, wait_until

MODEL = "tiny-chat"
USER = [{"role": "user", "content": "t5 t6"}]


def post(server, path: str, body=None, content: bytes | None = None, headers=None):
    return httpx.post(server.url + path, json=body, content=content, headers=headers, timeout=30)


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


@pytest.mark.parametrize("path, body, param, fragment", [
    ("/v1/chat/completions", {"model": MODEL, "messages": USER, "temperature": "hot"},
     "temperature", "must be a number"),
    ("/v1/chat/completions", {"model": MODEL, "messages": USER, "temperature": 3},
     "temperature", "[0, 2]"),
    ("/v1/chat/completions", {"model": MODEL, "messages": USER, "max_tokens": "5"},
     "max_tokens", "must be an integer"),
    ("/v1/chat/completions", {"model": MODEL, "messages": USER, "max_tokens": -1},
     "max_tokens", ">= 1"),
    ("/v1/chat/completions", {"model": MODEL, "messages": USER, "max_tokens": 10**9},
     "max_tokens", "maximum context length is 4096"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, "messages", "must not be empty"),
    ("/v1/chat/completions", {"model": MODEL, "messages": "t5"}, "messages", "must be a list"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user"}]},
     "messages[0].content", "must be a string"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "robot", "content": "t1"}]},
     "messages[0].role", "must be one of"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages[0].content[0]",
     "is an image_url part: this model folder takes text only; export it from the multimodal checkpoint."),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "video", "video": "x"}]}]}, "messages[0].content[0]", "only text content parts"),
    ("/v1/chat/completions", {"model": MODEL, "messages": USER, "n": 0}, "n", "between 1 and"),
    ("/v1/chat/completions", {"model": MODEL, "messages": USER, "stop": 5}, "stop", "string"),
    ("/v1/chat/completions", {"model": MODEL, "messages": USER, "top_p": 0}, "top_p", "(0, 1]"),
    ("/v1/chat/completions", {"model": MODEL, "messages": USER, "stream": "yes"}, "stream",
     "true or false"),
    ("/v1/chat/completions", {"model": MODEL, "messages": USER, "stream_options":
                              {"include_usage": True}}, "stream_options", "only allowed"),
    ("/v1/chat/completions", {"model": MODEL, "messages": USER, "top_logprobs": 2},
     "top_logprobs", "needs 'logprobs'"),
    ("/v1/chat/completions", {"model": MODEL, "messages": USER, "tools": [{"type": "function"}]},
     "tools", "not supported"),
    ("/v1/chat/completions", {"messages": USER}, "model", "must provide a model"),
    ("/v1/completions", {"model": MODEL, "prompt": ""}, "prompt", "empty"),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 999]}, "prompt", "outside the vocabulary"),
    ("/v1/completions", {"model": MODEL, "prompt": "t1 " * 5000}, "prompt",
     "maximum context length is 4096"),
    ("/v1/completions", {"model": MODEL, "prompt": "t1", "logprobs": 9}, "logprobs",
     "between 0 and 5"),
    ("/v1/completions", {"model": MODEL, "prompt": "t1", "seed": 1.5}, "seed", "integer"),
    ("/v1/completions", {"model": MODEL, "prompt": "t1", "best_of": 3}, "best_of",
     "not supported"),
])
def test_bad_fields_are_400s_naming_the_field(server, path, body, param, fragment):
    error = error_of(post(server, path, body), 400)
    assert error["param"] == param and fragment in error["message"]
    assert error["type"] == "invalid_request_error"


def test_unknown_and_hint_fields_are_accepted_and_reported(server):
    """The field policy (llm_onnx/serve/policy.py): a field the server does not know (a newer
    client's, a typo) and a hint it does not use are accepted; the answer names them in its
    llm-onnx-ignored header and /metrics counts them. A field that asks for what the server
    cannot do stays a 400."""
    before = server.metric('llm_onnx_ignored_fields_total{api="chat.completions",'
                           'field="max_tokenz"}')
    r = post(server, "/v1/chat/completions", {"model": MODEL, "messages": USER, "max_tokens": 2,
                                              "max_tokenz": 5, "user": "u1"})
    assert r.status_code == 200 and r.headers["llm-onnx-ignored"] == "max_tokenz, user"
    assert server.metric('llm_onnx_ignored_fields_total{api="chat.completions",'
                         'field="max_tokenz"}') == before + 1
    r = post(server, "/v1/chat/completions", {"model": MODEL, "messages": USER, "max_tokens": 2})
    assert r.status_code == 200 and "llm-onnx-ignored" not in r.headers
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": "t1", "max_tokens": 2,
                                         "stream": True, "client_metadata": {"a": "b"}})
    assert r.status_code == 200 and r.headers["llm-onnx-ignored"] == "client_metadata"
    r = post(server, "/v1/chat/completions", {"model": MODEL, "messages": USER, "max_tokens": 2,
                                              "web_search_options": {}})  # asks for nothing
    assert r.status_code == 200 and "llm-onnx-ignored" not in r.headers
    error = error_of(post(server, "/v1/chat/completions", {
        "model": MODEL, "messages": USER, "web_search_options": {"search_context_size": "low"}}),
        400)
    assert error["param"] == "web_search_options" and "not supported" in error["message"]


def test_integers_written_with_a_zero_fraction_are_integers(server):
    """JSON Schema's "integer" (OpenAI's API description) counts 6.0 as an integer: accepted as
    6; a real fraction is still refused, naming the field."""
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": "t5 t6", "max_tokens": 3.0,
                                         "best_of": 1.0, "n": 1, "seed": 7.0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 3
    error = error_of(post(server, "/v1/completions", {"model": MODEL, "prompt": "t5",
                                                      "max_tokens": 2.5}), 400)
    assert error["param"] == "max_tokens" and "must be an integer" in error["message"]


def test_no_null_where_openais_schema_has_a_string(server):
    """system_fingerprint is an optional string in OpenAI's response schemas: left out rather
    than null, in whole replies and in stream chunks."""
    r = post(server, "/v1/chat/completions", {"model": MODEL, "messages": USER, "max_tokens": 2})
    assert r.status_code == 200 and "system_fingerprint" not in r.json()
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=30, json={
            "model": MODEL, "messages": USER, "max_tokens": 2, "stream": True}) as s:
        chunks = [line for line in s.iter_lines() if line.startswith("data: {")]
    assert chunks and all("system_fingerprint" not in c for c in chunks)


def test_context_overflow_has_openais_code(server):
    error = error_of(post(server, "/v1/completions", {"model": MODEL, "prompt": "t1 " * 5000}), 400)
    assert error["code"] == "context_length_exceeded"


def test_malformed_json_and_non_object_bodies(server):
    error = error_of(post(server, "/v1/chat/completions", content=b'{"model": ',
                          headers={"Content-Type": "application/json"}), 400)
    assert "could not parse the JSON body" in error["message"]
    error_of(post(server, "/v1/completions", [1, 2, 3]), 400)
    error_of(post(server, "/v1/completions", content=b"\xff\xfe",
                  headers={"Content-Type": "application/json"}), 400)


def test_unknown_model_route_and_method(server):
    error = error_of(post(server, "/v1/chat/completions", {"model": "gpt-4", "messages": USER}),
                     404)
    assert error["code"] == "model_not_found" and "tiny-chat" in error["message"]
    error_of(httpx.get(server.url + "/v1/nothing"), 404)
    error_of(httpx.get(server.url + "/v1/chat/completions"), 405)
    error_of(httpx.get(server.url + "/v1/models/gpt-4"), 404)


def test_the_server_keeps_serving_after_bad_requests(server, model):
    for _ in range(3):
        post(server, "/v1/completions", content=b"nonsense")
        post(server, "/v1/completions", {"model": MODEL, "prompt": "t1", "max_tokens": -5})
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": "t9 t8", "max_tokens": 5,
                                         "temperature": 0})
    assert r.status_code == 200
    assert r.json()["choices"][0]["text"] == model.generate("t9 t8", max_new_tokens=5,
                                                            temperature=0).text


LONG = {"model": MODEL, "prompt": "t7 t8 t9", "max_tokens": 4000, "temperature": 0,
        "ignore_eos": True}
CANCELLED = 'llm_onnx_request_finish_total{reason="cancelled"}'
GONE = 'llm_onnx_requests_total{endpoint="/v1/completions",status="499"}'


def row_freed_by_cancel(server) -> bool:
    """The request was cancelled and its row freed (the running gauge drops when the row is
    released, the cancelled count a moment later: both are waited for)."""
    return (server.metric(CANCELLED) == 1 and server.metric(GONE) == 1
            and server.metric("llm_onnx_running_requests") == 0)


# These run on held servers (ServerProcess(held=N)): the long request cannot finish before the
# client has gone, whatever the machine's speed, and the row can only come free through the
# cancellation.
def test_a_client_that_disconnects_mid_stream_frees_its_row(chat_model_folder):
    server = ServerProcess(chat_model_folder, "--max-batch", "4", "--prefill-chunk", "6",
                           held=8)
    try:
        with httpx.stream("POST", server.url + "/v1/completions",
                          json={**LONG, "stream": True}, timeout=30) as response:
            lines = response.iter_lines()
            got = [next(lines) for _ in range(6)]  # 3 tokens of the 8 runs let through
            assert all(line.startswith("data: ") or line == "" for line in got)
            assert server.metric("llm_onnx_running_requests") == 1
        # the connection is closed: the request is cancelled and its row freed
        wait_until(lambda: row_freed_by_cancel(server))
    finally:
        server.stop()


def test_a_client_that_gives_up_on_a_plain_request_frees_its_row(chat_model_folder):
    """The client sends a plain request, waits until it runs, and hangs up before any answer
    (what a client's read timeout does)."""
    server = ServerProcess(chat_model_folder, "--max-batch", "4", "--prefill-chunk", "6",
                           held=0)
    try:
        body = json.dumps(LONG).encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as client:
            client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           b"Content-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n" % len(body) + body)
            wait_until(lambda: server.metric("llm_onnx_running_requests") == 1)
            client.setblocking(False)
            with pytest.raises(BlockingIOError):  # no answer yet: the client gives up
                client.recv(1)
        wait_until(lambda: row_freed_by_cancel(server))
    finally:
        server.stop()


@pytest.fixture(scope="module")
def guarded(chat_model_folder):
    """One row, a queue of one, an API key, no chat page, and --strict-fields."""
    proc = ServerProcess(chat_model_folder, "--max-batch", "1", "--max-queue", "1",
                         "--no-web-ui", "--strict-fields", api_key="sesame")
    yield proc
    proc.stop()


def test_no_web_ui_leaves_the_chat_page_out(guarded):
    for path in ("/", "/favicon.ico", "/web/chat.js"):
        error_of(httpx.get(guarded.url + path), 404)
    assert httpx.get(guarded.url + "/v1/models", headers=guarded.headers).status_code == 200


def test_strict_fields_refuse_every_field_the_server_would_ignore(guarded):
    """--strict-fields: an unknown field is a 400 naming it, as before the field policy; the
    API's own hints and metadata (user, metadata, ...) are still accepted, and reported."""
    body = {"model": MODEL, "messages": USER, "max_tokens": 2}
    error = error_of(post(guarded, "/v1/chat/completions", {**body, "max_tokenz": 5},
                          headers=guarded.headers), 400)
    assert error["param"] == "max_tokenz"
    assert error["message"] == "Unrecognized request argument supplied: max_tokenz."
    r = post(guarded, "/v1/chat/completions", {**body, "user": "u1"}, headers=guarded.headers)
    assert r.status_code == 200 and r.headers["llm-onnx-ignored"] == "user"


def test_api_key_is_required_except_for_health(guarded):
    from openai import AuthenticationError, OpenAI

    body = {"model": MODEL, "prompt": "t1", "max_tokens": 2}
    error = error_of(post(guarded, "/v1/completions", body), 401)
    assert error["code"] == "invalid_api_key" and "didn't provide" in error["message"]
    error_of(post(guarded, "/v1/completions", body, headers={"Authorization": "Bearer sesam"}),
             401)
    error_of(post(guarded, "/v1/completions", body, headers={"Authorization": "sesame"}), 401)
    error_of(httpx.get(guarded.url + "/metrics"), 401)
    error_of(httpx.get(guarded.url + "/v1/models"), 401)
    assert httpx.get(guarded.url + "/health").status_code == 200
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=guarded.url + "/v1", api_key="wrong", max_retries=0).models.list()
    client = OpenAI(base_url=guarded.url + "/v1", api_key="sesame", max_retries=0)
    assert client.completions.create(**body).choices[0].text is not None


def test_a_full_queue_answers_429_at_once(chat_model_folder):
    """One request runs, one waits; a third gets 429 without waiting, and the two finish. The
    server is the guarded one held (ServerProcess(held=0)): while the 429 comes back nothing
    has moved, so the third did not wait for a place."""
    server = ServerProcess(chat_model_folder, "--max-batch", "1", "--max-queue", "1",
                           "--no-web-ui", api_key="sesame", held=0)
    results = {}

    def request(name):
        results[name] = post(server, "/v1/completions", {**LONG, "max_tokens": 5},
                             headers=server.headers)

    threads = [threading.Thread(target=request, args=(n,)) for n in ("a", "b")]
    try:
        threads[0].start()
        wait_until(lambda: server.metric("llm_onnx_running_requests") == 1)
        threads[1].start()
        wait_until(lambda: server.metric("llm_onnx_queue_depth") == 1)
        r = post(server, "/v1/completions", {**LONG, "max_tokens": 5}, headers=server.headers)
        error = error_of(r, 429)
        assert error["code"] == "rate_limit_exceeded" and "queue is full" in error["message"]
        assert server.metric("llm_onnx_running_requests") == 1
        assert server.metric("llm_onnx_queue_depth") == 1
        assert not results  # held: neither could have finished
        server.release()
        for t in threads:
            t.join(60)
    finally:
        server.stop()
    assert [results[n].status_code for n in ("a", "b")] == [200, 200]

"""Requests shaped as the coding agents send them, through a real `llm-onnx serve` (the tiny
byte-level model with the Hermes tools template): Claude Code's Messages requests (``?beta=true``,
``anthropic-beta``, ``metadata``, ``context_management``, ``output_config.effort``,
``thinking: adaptive``, tools without a type, ``cache_control`` blocks, a system message after
the user's turn, ``HEAD /``) and Codex CLI's Responses requests (``developer`` messages with ids,
function, namespace, custom and built-in tools, ``client_metadata``, ``prompt_cache_key``,
``reasoning.summary``, ``store: false``, its call items round-tripped). Each is served, and what
was ignored is named in the ``llm-onnx-ignored`` header and counted in /metrics; under
``--strict-fields`` the same requests are 400s naming the field, as before the field policy.
The real clients run in tests/serve/test_agent_clients.py."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.byte_model import HERMES_TEMPLATE
from tests.serve.conftest import ServerProcess

NAME = "tiny-bytes"
READ = {"name": "Read", "description": "Read a file.", "input_schema": {
    "type": "object", "properties": {"file_path": {"type": "string", "maxLength": 12}},
    "required": ["file_path"], "additionalProperties": False},
    "cache_control": {"type": "ephemeral"}}
CLAUDE_HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01",
                  "anthropic-beta": "claude-code-20250219,context-management-2025-06-27,"
                                    "mid-conversation-system-2026-04-07,effort-2025-11-24"}


def claude_body(**extra) -> dict:
    """Claude Code's main request, in small."""
    return {"model": NAME, "max_tokens": 6, "stream": True,
            "system": [{"type": "text", "text": "You are an agent."},
                       {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                {"type": "text", "text": "Read notes.txt", "cache_control": {"type": "ephemeral"}}]},
                {"role": "system", "content": "Agents available: none."}],
            "tools": [READ], "metadata": {"user_id": "{\"device_id\": \"d\"}"},
            "thinking": {"type": "adaptive"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "high"}, **extra}


FUNCTION = {"type": "function", "name": "exec_command", "description": "Run a command.",
            "strict": False, "parameters": {"type": "object", "properties": {
                "cmd": {"type": "string", "maxLength": 12}}, "required": ["cmd"],
                "additionalProperties": False}}
NAMESPACE = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
             "tools": [{"type": "function", "name": "spawn_agent", "strict": False,
                        "parameters": {"type": "object", "properties": {
                            "task_name": {"type": "string", "maxLength": 8}},
                            "required": ["task_name"], "additionalProperties": False}}]}
PATCH_GRAMMAR = 'start: "*** Begin\\n" /[a-z"]{1,6}/ "\\n*** End"'
CUSTOM = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
          "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_GRAMMAR}}


def codex_body(**extra) -> dict:
    """Codex CLI's request, in small."""
    return {"model": NAME, "stream": True, "max_output_tokens": 6,
            "input": [{"type": "message", "id": "msg_1", "role": "developer",
                       "content": [{"type": "input_text", "text": "You are Codex."}]},
                      {"type": "message", "id": "msg_2", "role": "developer",
                       "content": [{"type": "input_text", "text": "<skills/>"}]},
                      {"type": "message", "id": "msg_3", "role": "user",
                       "content": [{"type": "input_text", "text": "Read notes.txt"}]}],
            "tools": [FUNCTION, NAMESPACE, {"type": "web_search", "external_web_access": False}],
            "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"},
            "store": False, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "01a222f1", "client_metadata": {"session_id": "01a222f1"},
            **extra}


@pytest.fixture(scope="module")
def server(byte_model_folder):
    proc = ServerProcess(byte_model_folder, "--max-batch", "2", "--chat-template",
                         str(HERMES_TEMPLATE))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def strict(byte_model_folder):
    proc = ServerProcess(byte_model_folder, "--max-batch", "1", "--chat-template",
                         str(HERMES_TEMPLATE), "--strict-fields", "--no-web-ui")
    yield proc
    proc.stop()


def events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def ignored(response) -> list[str]:
    return response.headers.get("llm-onnx-ignored", "").split(", ")


# ------------------------------------------------------------------ Claude Code

def test_claude_codes_request_is_served_and_what_it_ignored_is_reported(server):
    r = httpx.post(server.url + "/v1/messages?beta=true", json=claude_body(), timeout=60,
                   headers=CLAUDE_HEADERS)
    assert r.status_code == 200, r.text
    assert [e["type"] for e in events(r.text)][-1] == "message_stop"
    assert ignored(r) == ["cache_control", "context_management", "metadata",
                          "output_config.effort", "thinking"]
    assert server.metric('llm_onnx_ignored_fields_total{api="messages",'
                         'field="context_management"}') >= 1
    counted = httpx.post(server.url + "/v1/messages/count_tokens?beta=true", timeout=60,
                         headers=CLAUDE_HEADERS,
                         json={k: v for k, v in claude_body().items()
                               if k not in ("max_tokens", "stream")})
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 100


def test_claude_codes_title_request_is_held_to_its_schema(server):
    """Its session title: output_config with effort and a JSON schema, streamed."""
    schema = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 8}},
              "required": ["title"], "additionalProperties": False}
    body = claude_body(max_tokens=32000, tools=[], output_config={
        "effort": "high", "format": {"type": "json_schema", "schema": schema}})
    r = httpx.post(server.url + "/v1/messages?beta=true", json=body, timeout=60,
                   headers=CLAUDE_HEADERS)
    assert r.status_code == 200, r.text
    text = "".join(e["delta"]["text"] for e in events(r.text)
                   if e["type"] == "content_block_delta")
    assert set(json.loads(text)) == {"title"}
    assert events(r.text)[-2]["delta"]["stop_reason"] == "end_turn"


def test_a_system_message_after_the_users_turn_is_a_system_turn(server):
    """The tools template renders a later system message where it stands: its text is in the
    prompt, after the user's (count_tokens grows by it)."""
    body = {k: v for k, v in claude_body().items() if k not in ("max_tokens", "stream")}
    without = dict(body, messages=body["messages"][:1])
    count = [httpx.post(server.url + "/v1/messages/count_tokens", json=b, timeout=60,
                        headers=CLAUDE_HEADERS).json()["input_tokens"] for b in (body, without)]
    turn = "<|im_start|>system\nAgents available: none.<|im_end|>\n"
    # the byte tokenizer: a token a byte, the two markers one each
    assert count[0] - count[1] == len(turn.encode()) - len("<|im_start|><|im_end|>") + 2


def test_a_server_tool_is_left_out_and_a_client_tool_called(server):
    body = claude_body(stream=False, max_tokens=120, tool_choice={"type": "any"},
                       tools=[{"type": "web_search_20250305", "name": "web_search"}, READ])
    r = httpx.post(server.url + "/v1/messages", json=body, timeout=60, headers=CLAUDE_HEADERS)
    assert r.status_code == 200, r.text
    [call] = [b for b in r.json()["content"] if b["type"] == "tool_use"]
    assert call["name"] == "Read" and r.json()["stop_reason"] == "tool_use"
    assert "tools.web_search_20250305" in ignored(r)


def test_a_gzipped_body_is_read(server):
    """Claude Code gzips its bodies when told to (CLAUDE_CODE_GZIP_REQUEST_BODIES)."""
    import gzip

    body = json.dumps(claude_body(stream=False)).encode()
    r = httpx.post(server.url + "/v1/messages", content=gzip.compress(body), timeout=60,
                   headers={**CLAUDE_HEADERS, "content-type": "application/json",
                            "content-encoding": "gzip"})
    assert r.status_code == 200, r.text
    r = httpx.post(server.url + "/v1/messages", content=body, timeout=60,
                   headers={**CLAUDE_HEADERS, "content-encoding": "br"})
    assert r.status_code == 415 and "gzip" in r.json()["error"]["message"]


def test_head_of_the_root_answers(server, strict):
    for proc in (server, strict):
        r = httpx.head(proc.url + "/")
        assert r.status_code == 200 and not r.content


@pytest.mark.parametrize("change, field", [
    ({}, "context_management"),
    ({"context_management": None, "frobnicate": 1}, "frobnicate"),
    ({"context_management": None, "tools": [{"type": "web_search_20250305",
                                             "name": "web_search"}]}, "tools.0.type"),
])
def test_strict_fields_refuse_what_claude_code_sends(strict, change, field):
    r = httpx.post(strict.url + "/v1/messages", json=claude_body(**change), timeout=60,
                   headers=CLAUDE_HEADERS)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith(field + ": ")


# ------------------------------------------------------------------ Codex CLI

def test_codexs_request_is_served_and_what_it_ignored_is_reported(server):
    r = httpx.post(server.url + "/v1/responses", json=codex_body(), timeout=60,
                   headers={"authorization": "Bearer x", "accept-encoding": "zstd,gzip"})
    assert r.status_code == 200, r.text
    done = events(r.text)[-1]
    assert done["type"] in ("response.completed", "response.incomplete")
    assert ignored(r) == ["client_metadata", "prompt_cache_key", "reasoning.summary",
                          "tools.web_search"]
    assert httpx.get(f"{server.url}/v1/responses/{done['response']['id']}").status_code == 404


def test_a_namespaced_function_comes_back_with_its_namespace(server):
    r = httpx.post(server.url + "/v1/responses", timeout=60, json=codex_body(
        stream=False, max_output_tokens=120,
        tool_choice={"type": "function", "name": "spawn_agent"}))
    assert r.status_code == 200, r.text
    [call] = [i for i in r.json()["output"] if i["type"] == "function_call"]
    assert call["name"] == "spawn_agent" and call["namespace"] == "multi_agent_v1"
    assert json.loads(call["arguments"])["task_name"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_custom_tool_is_called_with_text_in_its_grammar_and_its_output_goes_back(server,
                                                                                   stream):
    body = codex_body(stream=stream, max_output_tokens=120, tools=[FUNCTION, CUSTOM],
                      tool_choice={"type": "custom", "name": "apply_patch"})
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 200, r.text
    response = events(r.text)[-1]["response"] if stream else r.json()
    [call] = [i for i in response["output"] if i["type"] == "custom_tool_call"]
    assert call["name"] == "apply_patch"
    assert re.fullmatch(r'\*\*\* Begin\n[a-z"]{1,6}\n\*\*\* End', call["input"]), call
    if stream:
        kinds = [e["type"] for e in events(r.text)]
        assert "response.custom_tool_call_input.done" in kinds
        assert "response.function_call_arguments.delta" not in kinds
    follow = codex_body(stream=False, max_output_tokens=4, tools=[FUNCTION, CUSTOM], input=[
        *body["input"], {k: call[k] for k in ("type", "id", "call_id", "name", "input")},
        {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "Done!"}])
    r = httpx.post(server.url + "/v1/responses", json=follow, timeout=60)
    assert r.status_code == 200, r.text


def test_call_items_with_their_ids_and_encrypted_reasoning_go_back(server):
    from llm_onnx.serve.openai_responses_request import sealed

    items = [*codex_body()["input"],
             {"type": "reasoning", "id": "rs_1", "summary": [], "content": None,
              "encrypted_content": sealed("Reading it is best.")},
             {"type": "function_call", "id": "fc_1", "call_id": "call_1", "status": "completed",
              "name": "exec_command", "arguments": "{\"cmd\": \"head -1 notes.txt\"}"},
             {"type": "function_call_output", "call_id": "call_1", "output": "first line"},
             {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "gAAAA"}]
    r = httpx.post(server.url + "/v1/responses", json=codex_body(stream=False, input=items),
                   timeout=60)
    assert r.status_code == 200, r.text
    assert "input.reasoning.encrypted_content" in ignored(r)  # another server's: unreadable


def test_a_bad_grammar_is_a_400_naming_it(server):
    tool = {**CUSTOM, "format": {**CUSTOM["format"], "definition": 'start: "a" ('}}
    r = httpx.post(server.url + "/v1/responses", json=codex_body(tools=[tool]), timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].format.definition"


@pytest.mark.parametrize("change, field", [
    ({}, "client_metadata"),
    ({"client_metadata": None}, "tools[2].type"),
    ({"client_metadata": None, "tools": [], "frobnicate": 1}, "frobnicate"),
])
def test_strict_fields_refuse_what_codex_sends(strict, change, field):
    r = httpx.post(strict.url + "/v1/responses", json=codex_body(**change), timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


def test_the_docs_tables_name_every_declared_field():
    """docs/serving.md's field policy names every field an API module declares it ignores,
    tolerates or refuses (a field added to a module without its row fails here)."""
    from pathlib import Path

    from llm_onnx.serve import (
        anthropic_messages_request,
        embeddings,
        openai_chat,
        openai_choices,
        openai_completions,
        openai_responses_request,
    )

    text = (Path(__file__).parents[2] / "docs" / "serving.md").read_text(encoding="utf-8")
    section = text[text.index("## The field policy"):text.index("### System messages after")]
    named = set(re.findall(r"`([a-z_.]+)", section))
    declared = set(openai_choices.IGNORED_FIELDS) | set(embeddings.IGNORED_FIELDS)
    for api in (openai_chat, openai_completions, openai_responses_request,
                anthropic_messages_request):
        declared |= set(getattr(api, "IGNORED_FIELDS", ())) | set(api.TOLERATED_FIELDS) | \
            set(api.UNSUPPORTED_FIELDS)
    assert declared - named == set()

"""POST /tokenize, /detokenize and GET /tokenizer_info through a real `llm-onnx serve`, in
vLLM's shapes (text or a chat in, ids, count and max_model_len out) and llama.cpp's
({"content"} in, {"tokens"} out): the ids are the in-process Model's for the same text or
rendered chat; bad input is an OpenAI-shaped 400 naming the field."""

from __future__ import annotations

import httpx
import pytest

from llm_onnx.runtime import Model
from tests.byte_model import CONTEXT, HERMES_TEMPLATE
from tests.serve.conftest import ServerProcess

NAME = "tiny-bytes"
USER = [{"role": "user", "content": "Où est la gare ?"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def server(byte_model_folder):
    proc = ServerProcess(byte_model_folder, "--chat-template", str(HERMES_TEMPLATE))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def model(byte_model_folder):
    return Model.load(byte_model_folder, provider="cpu", threads=1, chat_template=HERMES_TEMPLATE)


def post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=30)


def test_tokenize_text_as_vllm_does(server, model):
    r = post(server, "/tokenize", {"prompt": "Hello, wörld", "return_token_strs": True})
    assert r.status_code == 200, r.text
    ids = model.encode("Hello, wörld")
    assert r.json() == {"tokens": ids, "count": len(ids), "max_model_len": CONTEXT,
                        "token_strs": ["H", "e", "l", "l", "o", ",", " ", "w", "\ufffd",
                                       "\ufffd", "r", "l", "d"]}
    # special tokens' text is parsed as the special token (what lm-eval's eos lookup needs)
    r = post(server, "/tokenize", {"model": NAME, "prompt": "<|im_end|>",
                                   "add_special_tokens": False})
    assert r.json()["tokens"] == [2] and r.json()["token_strs"] is None


def test_tokenize_a_chat_as_vllm_does(server, model):
    r = post(server, "/tokenize", {"messages": USER})
    assert r.json()["tokens"] == model.chat_prompt(USER)
    r = post(server, "/tokenize", {"messages": USER, "add_generation_prompt": False})
    assert r.json()["tokens"] == model.encode_chat(model.render_chat(USER, False))
    with_tools = post(server, "/tokenize", {"messages": USER, "tools": TOOLS}).json()
    assert with_tools["tokens"] == model.chat_prompt(USER, tools=TOOLS)
    prefill = [*USER, {"role": "assistant", "content": "Elle est"}]
    r = post(server, "/tokenize", {"messages": prefill, "add_generation_prompt": False,
                                   "continue_final_message": True})
    text = model.render_chat(prefill, continue_final_message=True)
    assert text.endswith("assistant\nElle est") and r.json()["tokens"] == model.encode_chat(text)


def test_llama_cpp_shapes_and_detokenize(server, model):
    ids = model.encode("Hi!")
    assert post(server, "/tokenize", {"content": "Hi!"}).json() == {"tokens": ids}
    pieces = post(server, "/tokenize", {"content": "Hi!", "with_pieces": True}).json()
    assert pieces == {"tokens": [{"id": i, "piece": c} for i, c in zip(ids, "Hi!")]}
    chat = model.chat_prompt(USER)
    r = post(server, "/detokenize", {"tokens": chat})
    text = model.render_chat(USER)  # special tokens kept: the round trip is exact
    assert r.json() == {"prompt": text, "content": text}


def test_tokenizer_info(server, model):
    info = httpx.get(server.url + "/tokenizer_info").json()
    assert info["eos_token"] == "<|im_end|>" and info["bos_token"] is None
    assert info["chat_template"] == model.chat_template
    assert info["model_max_length"] == CONTEXT and info["vocab_size"] == \
        model.engine.vocab_size


@pytest.mark.parametrize(("path", "body", "param", "words"), [
    ("/tokenize", {"prompt": "a", "messages": USER}, "prompt", "not both"),
    ("/tokenize", {}, "prompt", "or neither"),
    ("/tokenize", {"prompt": ["a"]}, "prompt", "must be a string"),
    ("/tokenize", {"messages": [{"role": "robot", "content": "a"}]}, "messages[0].role",
     "must be one of"),
    ("/tokenize", {"messages": USER, "add_generation_prompt": True,
                   "continue_final_message": True}, "continue_final_message",
     "cannot both be true"),
    ("/tokenize", {"messages": [*USER, {"role": "assistant", "content": ""}],
                   "continue_final_message": True}, "messages", "cannot be continued"),
    ("/tokenize", {"content": 5}, "content", "must be a string"),
    ("/detokenize", {"tokens": [1, 99999]}, "tokens", "outside the vocabulary"),
    ("/detokenize", {"tokens": "abc"}, "tokens", "list of token ids"),
])
def test_bad_input_is_a_400_naming_the_field(server, path, body, param, words):
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_a_field_of_the_other_form_is_accepted_and_reported(server):
    r = post(server, "/tokenize", {"prompt": "a", "add_generation_prompt": True})
    assert r.status_code == 200 and r.headers["llm-onnx-ignored"] == "add_generation_prompt"
    r = post(server, "/detokenize", {"tokens": [1], "skip": True})
    assert r.status_code == 200 and r.headers["llm-onnx-ignored"] == "skip"


def test_a_wrong_model_is_a_404_and_the_server_keeps_counting(server):
    r = post(server, "/tokenize", {"model": "other", "prompt": "a"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    # a lone surrogate (valid JSON, not UTF-8) named in an error comes back escaped
    r = httpx.post(server.url + "/tokenize", content=b'{"model": "\\ud800", "prompt": "a"}',
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 404 and "`\\ud800`" in r.json()["error"]["message"]
    assert post(server, "/detokenize", {"tokens": [40]}).json()["prompt"] == "!"
    assert post(server, "/detokenize", {"tokens": "no"}).status_code == 400
    assert post(server, "/tokenize", {"prompt": "a"}).status_code == 200
    assert server.metric('llm_onnx_requests_total{endpoint="/tokenize",status="200"}') >= 1
    assert server.metric('llm_onnx_requests_total{endpoint="/detokenize",status="400"}') >= 1
    assert server.metric('llm_onnx_requests_total{endpoint="/tokenize",status="500"}') == 0

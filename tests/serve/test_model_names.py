"""The names a served model answers to: a real `llm-onnx serve` of a copy of the tiny chat model
in a folder of another name, with two `--model-name`s. The official openai and anthropic clients
get answers under each accepted name (in any case), always carrying the primary name; any other
name is a 404 in each API's error shape, listing the names; the server prints them."""

from __future__ import annotations

import shutil

import anthropic
import httpx
import openai
import pytest

from llm_onnx.serve.names import ModelNames, split_names
from tests.serve.conftest import ServerProcess

PRIMARY, ALIAS, FOLDER, CHECKPOINT = "local", "gpt-4o-mini", "renamed-folder", "tiny-chat"
ACCEPTED = [PRIMARY, ALIAS, FOLDER, CHECKPOINT, "LOCAL", "Tiny-Chat", "GPT-4o-Mini"]
USER = [{"role": "user", "content": "t11 t12"}]


def test_the_names_and_their_order():
    assert split_names(None) == [] and split_names("a, b,,c") == ["a", "b", "c"]
    assert split_names(("a,b", "c")) == ["a", "b", "c"]
    names = ModelNames.of(["Local", "local", "other"], "folder", "FOLDER")
    assert names.all == ("Local", "other", "folder")   # each once, whatever its case
    assert names.accepts("OTHER") and names.accepts("Folder") and not names.accepts("folder2")
    assert ModelNames.of(None, "folder", "ckpt").all == ("folder", "ckpt")
    assert ModelNames.of((), None, None).primary == "model"
    assert names.listed() == "`Local` (also `other`, `folder`)"


@pytest.fixture(scope="module")
def named_server(chat_model_folder, tmp_path_factory):
    folder = tmp_path_factory.mktemp("names") / FOLDER
    shutil.copytree(chat_model_folder, folder)
    proc = ServerProcess(folder, "--model-name", f"{PRIMARY},{ALIAS}")
    yield proc
    proc.stop()


def test_the_server_prints_the_names_it_answers_to(named_server):
    assert f"Model name: {PRIMARY} (also {ALIAS}, {FOLDER}, {CHECKPOINT}; any case)" in \
        named_server.output()


@pytest.mark.parametrize("name", ACCEPTED)
def test_the_openai_client_is_answered_under_each_name(named_server, name):
    client = openai.OpenAI(base_url=named_server.url + "/v1", api_key="unused", max_retries=0,
                           timeout=60)
    chat = client.chat.completions.create(model=name, messages=USER, max_tokens=3)
    text = client.completions.create(model=name, prompt="t5 t6", max_tokens=3)
    assert chat.model == text.model == PRIMARY and chat.choices[0].message.content is not None
    assert client.models.retrieve(name).id == PRIMARY


def test_models_lists_the_primary_name_with_its_aliases(named_server):
    client = openai.OpenAI(base_url=named_server.url + "/v1", api_key="unused", max_retries=0)
    (card,) = client.models.list().data
    assert card.id == PRIMARY and card.aliases == [ALIAS, FOLDER, CHECKPOINT]


def test_another_name_is_a_404_in_each_apis_shape_listing_the_names(named_server):
    listed = f"`{PRIMARY}` (also `{ALIAS}`, `{FOLDER}`, `{CHECKPOINT}`)"
    client = openai.OpenAI(base_url=named_server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4", messages=USER, max_tokens=3)
    error = info.value.body
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert error["message"] == f"The model `gpt-4` does not exist. This server serves {listed}."
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="local2", prompt="t5", max_tokens=3)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="tiny", input="t5", max_output_tokens=3)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("renamed")
    messages = anthropic.Anthropic(base_url=named_server.url, api_key="unused", max_retries=0)
    assert messages.messages.create(model="Local", max_tokens=3, messages=USER).model == PRIMARY
    with pytest.raises(anthropic.NotFoundError) as info:
        messages.messages.create(model="claude-none", max_tokens=3, messages=USER)
    assert info.value.type == "not_found_error" and listed in info.value.api_message
    r = httpx.post(named_server.url + "/tokenize", json={"model": "x", "prompt": "t1"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert httpx.post(named_server.url + "/tokenize",
                      json={"model": "TINY-CHAT", "prompt": "t1"}).status_code == 200

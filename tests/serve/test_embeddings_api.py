"""The official `openai` client's embeddings.create against a real `llm-onnx serve` over an
embedding model's folder: equal to Model.embed and to sentence-transformers, in float and base64
(the client's default, decoded by it), with dimensions and token ids; OpenAI's 400s naming the
field; each kind of server refusing the other kind's endpoints."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import signal
import threading
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from llm_onnx.runtime import Model
from llm_onnx.serve import errors as p
from llm_onnx.serve.embeddings import EmbeddingRunner
from tests.embedding_models import reference
from tests.serve.conftest import ServerProcess

NAME = "emb-qwen3-fp32"
TEXTS = ["t5 t9 t33", "t1 t2 t3 t4 t5 t6 t7 t8", "t100", "t7 t7 t7 t7"]


@pytest.fixture(scope="module")
def embed_server(embedding_export):
    proc = ServerProcess(embedding_export("qwen3"))
    yield proc
    assert proc.stop() in (0, -signal.SIGTERM), proc.output()


@pytest.fixture(scope="module")
def local(embedding_export):
    return Model.load(embedding_export("qwen3"), provider="cpu", threads=1)


@pytest.fixture
def client(embed_server):
    from openai import OpenAI

    return OpenAI(base_url=embed_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def vectors(response) -> np.ndarray:
    assert [d.index for d in response.data] == list(range(len(response.data)))
    assert all(d.object == "embedding" for d in response.data)
    return np.array([d.embedding for d in response.data], dtype=np.float32)


def test_create_equals_the_runtime_and_sentence_transformers(client, local, embedding_checkpoint):
    r = client.embeddings.create(model=NAME, input=TEXTS)  # the client asks for base64
    assert r.object == "list" and r.model == NAME
    got = vectors(r)
    np.testing.assert_array_equal(got, local.embed(TEXTS))
    np.testing.assert_allclose(got, reference(embedding_checkpoint("qwen3"), TEXTS), atol=1e-4)
    tokens = sum(len(local.encode(t)) for t in TEXTS)
    assert r.usage.prompt_tokens == r.usage.total_tokens == tokens
    floats = client.embeddings.create(model=NAME, input=TEXTS, encoding_format="float")
    np.testing.assert_array_equal(vectors(floats), got)


def test_one_string_token_ids_and_dimensions(client, local):
    one = client.embeddings.create(model=NAME, input="t3 t4", user="someone")
    np.testing.assert_array_equal(vectors(one)[0], local.embed("t3 t4"))
    ids = local.encode("t3 t4")
    np.testing.assert_array_equal(vectors(client.embeddings.create(model=NAME, input=ids))[0],
                                  vectors(one)[0])
    rows = client.embeddings.create(model=NAME, input=[ids, [1, 2, 3]], dimensions=16)
    np.testing.assert_allclose(vectors(rows), local.embed([ids, [1, 2, 3]], dimensions=16),
                               atol=1e-7)
    np.testing.assert_allclose(np.linalg.norm(vectors(rows), axis=-1), 1.0, atol=1e-6)


def test_base64_is_little_endian_float32(embed_server, local):
    body = {"model": NAME, "input": ["t1 t2"], "encoding_format": "base64"}
    r = httpx.post(embed_server.url + "/v1/embeddings", json=body, timeout=30)
    assert r.status_code == 200
    raw = base64.b64decode(r.json()["data"][0]["embedding"])
    np.testing.assert_array_equal(np.frombuffer(raw, dtype="<f4"), local.embed("t1 t2"))


@pytest.mark.parametrize("body, param, words", [
    ({"model": NAME}, "input", "you must provide 'input'"),
    ({"model": NAME, "input": ""}, "input", "'input[0]' is an empty string"),
    ({"model": NAME, "input": []}, "input", "non-empty"),
    ({"model": NAME, "input": ["t1", 5]}, "input", "'input[1]' must be a string"),
    ({"model": NAME, "input": [[1, 2], []]}, "input", "'input[1]' must be a non-empty list"),
    ({"model": NAME, "input": {"text": "t1"}}, "input", "non-empty string or a non-empty list"),
    ({"model": NAME, "input": " ".join(["t1"] * 200)}, "input",
     "has 201 tokens but the model's context is 128"),
    ({"model": NAME, "input": [[1, 999]]}, "input", "token id 999 is outside the vocabulary"),
    ({"model": NAME, "input": "t1", "dimensions": 0}, "dimensions", "between 1 and 64"),
    ({"model": NAME, "input": "t1", "dimensions": 65}, "dimensions", "between 1 and 64"),
    ({"model": NAME, "input": "t1", "dimensions": "8"}, "dimensions", "must be an integer"),
    ({"model": NAME, "input": "t1", "encoding_format": "hex"}, "encoding_format", "base64"),
    ({"model": NAME, "input": "t1", "user": 7}, "user", "must be a string"),
    ({"model": 3, "input": "t1"}, "model", "must be a string"),
])
def test_bad_requests_are_400s_naming_the_field(embed_server, body, param, words):
    r = httpx.post(embed_server.url + "/v1/embeddings", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert words in error["message"]


def test_an_unknown_field_is_accepted_and_reported(embed_server):
    r = httpx.post(embed_server.url + "/v1/embeddings", timeout=30,
                   json={"model": NAME, "input": "t1", "extra": 1, "user": "u"})
    assert r.status_code == 200 and r.headers["llm-onnx-ignored"] == "extra, user"


def test_the_client_raises_bad_request_and_not_found(client):
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=NAME, input="t1", dimensions=1000)
    assert info.value.body["param"] == "dimensions"
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="other", input="t1")


def test_an_embedding_server_refuses_generation(embed_server, client):
    import openai

    for call in (lambda: client.chat.completions.create(
                     model=NAME, messages=[{"role": "user", "content": "t1"}]),
                 lambda: client.completions.create(model=NAME, prompt="t1"),
                 lambda: client.responses.create(model=NAME, input="t1")):
        with pytest.raises(openai.BadRequestError, match="is an embedding model .*--task "
                                                         "generate"):
            call()
    card = client.models.retrieve(NAME)
    assert card.model_extra["task"] == "embed" and card.model_extra["max_model_len"] == 128
    assert httpx.get(embed_server.url + "/", timeout=10).status_code == 404  # no chat page
    assert embed_server.metric('llm_onnx_requests_total{endpoint="/v1/embeddings",'
                               'status="200"}') >= 1


def test_a_generation_server_refuses_embeddings(chat_model_folder):
    import openai
    from openai import OpenAI

    proc = ServerProcess(chat_model_folder)
    try:
        client = OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError, match=r"is a generation model.*llm-onnx "
                                                         r"export --task embed") as info:
            client.embeddings.create(model="tiny-chat", input="t1")
        assert info.value.body["param"] == "model"
    finally:
        assert proc.stop() in (0, -signal.SIGTERM), proc.output()


def test_a_full_queue_answers_429():
    """One request runs, ``max_queue`` wait; the next is refused at once."""
    gate = threading.Event()

    class Slow:
        engine = SimpleNamespace(embed=lambda rows, dims: np.zeros((len(rows), 4), np.float32))

        def embedding_ids(self, inputs):
            gate.wait(10)
            return [[1]] * len(inputs), False

    runner = EmbeddingRunner(Slow(), max_queue=1)

    async def main() -> None:
        running = asyncio.ensure_future(runner.run(["a"], None))
        waiting = asyncio.ensure_future(runner.run(["b"], None))
        await asyncio.sleep(0.05)
        with pytest.raises(p.ApiError) as info:
            await runner.run(["c"], None)
        assert info.value.status == 429 and info.value.code == "rate_limit_exceeded"
        gate.set()
        for done in await asyncio.gather(running, waiting):
            assert done[0].shape == (1, 4) and done[1] == 1

    # A thread of its own: the session's browser (Playwright's sync API) keeps an event loop
    # running on the main thread once a chat page test has run, and asyncio.run refuses to nest.
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, main()).result()
    finally:
        gate.set()
        runner.close()

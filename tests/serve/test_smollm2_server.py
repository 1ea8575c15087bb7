"""The real SmolLM2-135M-Instruct (int8) behind `llm-onnx serve`, through the official client:
the answers equal the runtime's own, streamed and not, alone and four at once."""

from __future__ import annotations

import threading

import pytest

from tests.serve.conftest import ServerProcess

pytestmark = pytest.mark.slow

QUESTIONS = ["What is the capital of France?", "Name three primary colors.",
             "Write a haiku about the sea.", "What is 12 times 7?"]


@pytest.fixture(scope="module")
def smollm2_server(smollm2_export):
    server = ServerProcess(smollm2_export("int8"), "--max-batch", "4", "--threads", "2")
    yield server
    server.stop()


def test_chat_answers_equal_the_runtime(smollm2_server, smollm2_export):
    from openai import OpenAI

    from llm_onnx.runtime import Model

    model = Model.load(smollm2_export("int8"))
    name = smollm2_export("int8").name
    client = OpenAI(base_url=smollm2_server.url + "/v1", api_key="unused", max_retries=0)
    expected = [model.chat([{"role": "user", "content": q}], max_new_tokens=40,
                           temperature=0).text for q in QUESTIONS]
    answers: dict[int, str] = {}

    def ask(i: int) -> None:
        messages = [{"role": "user", "content": QUESTIONS[i]}]
        if i % 2:
            answers[i] = client.chat.completions.create(
                model=name, messages=messages, max_tokens=40, temperature=0
            ).choices[0].message.content
        else:
            chunks = client.chat.completions.create(model=name, messages=messages, max_tokens=40,
                                                    temperature=0, stream=True)
            answers[i] = "".join(c.choices[0].delta.content or "" for c in chunks)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(QUESTIONS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [answers[i] for i in range(len(QUESTIONS))] == expected
    assert all(expected)

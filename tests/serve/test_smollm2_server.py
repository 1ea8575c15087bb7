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


def test_responses_and_messages_answer_as_the_runtime_and_metrics_count_each(smollm2_server,
                                                                              smollm2_export):
    """One end-to-end run of each newer API on the real model: OpenAI's Responses API (plain and
    streamed through the client's stream helper) and Anthropic's Messages API answer what the
    runtime's chat answers; /metrics counts each endpoint apart."""
    import anthropic
    from openai import OpenAI

    from llm_onnx.runtime import Model

    model = Model.load(smollm2_export("int8"))
    name = smollm2_export("int8").name
    question = QUESTIONS[0]
    want = model.chat([{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": question}], max_new_tokens=30,
                      temperature=0).text
    client = OpenAI(base_url=smollm2_server.url + "/v1", api_key="unused", max_retries=0)
    r = client.responses.create(model=name, instructions="Be brief.", input=question,
                                max_output_tokens=30, temperature=0)
    assert r.output_text == want and r.status in ("completed", "incomplete")
    with client.responses.stream(model=name, instructions="Be brief.", input=question,
                                 max_output_tokens=30, temperature=0) as stream:
        events = list(stream)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    # 30 tokens cut the answer: the last event is response.incomplete (the stream helper's
    # get_final_response waits for response.completed only, as with OpenAI's own server)
    assert events[-1].type == f"response.{r.status}"
    assert text == want == events[-1].response.output_text
    claude = anthropic.Anthropic(base_url=smollm2_server.url, api_key="unused", max_retries=0)
    m = claude.messages.create(model=name, system="Be brief.", max_tokens=30,
                               messages=[{"role": "user", "content": question}],
                               extra_body={"temperature": 0})
    assert m.content[0].text == want
    counted = {endpoint: smollm2_server.metric(
        f'llm_onnx_requests_total{{endpoint="{endpoint}",status="200"}}')
        for endpoint in ("/v1/responses", "/v1/messages", "/v1/chat/completions")}
    assert counted["/v1/responses"] == 2 and counted["/v1/messages"] == 1, counted


def test_embeddings_of_the_real_model_equal_transformers(smollm2_gguf, smollm2_transformers,
                                                        tmp_path):
    """SmolLM2 exported with --task embed (a GGUF without a pooling key: mean pooling, not
    normalised) behind `llm-onnx serve`: the openai client's embeddings equal transformers'
    last hidden states of the same tokens, mean-pooled, within 1e-4."""
    import numpy as np
    import torch
    from openai import OpenAI

    from llm_onnx.checkpoints import open_checkpoint
    from llm_onnx.export import ExportOptions, export_model

    out = tmp_path / "smollm2-embed"
    export_model(open_checkpoint(smollm2_gguf), out, ExportOptions(
        precision="fp32", max_seq_len=256, task="embed"), progress=False)
    texts = ["The capital of France is Paris.", "Embeddings map text to vectors."]
    model, tokenizer = smollm2_transformers
    want = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, return_tensors="pt", add_special_tokens=True).input_ids
            hidden = model.model(ids).last_hidden_state[0]
            want.append(hidden.mean(0).numpy())
    server = ServerProcess(out, "--threads", "2")
    try:
        client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        got = client.embeddings.create(model=out.name, input=texts)
        vectors = np.array([d.embedding for d in got.data], dtype=np.float32)
        np.testing.assert_allclose(vectors, np.stack(want), atol=1e-4, rtol=1e-4)
    finally:
        server.stop()

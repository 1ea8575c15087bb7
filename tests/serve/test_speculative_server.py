"""The server with speculative decoding on (the default for fp32 folders): the same answers as
plain decoding in the runtime, and the drafted / accepted counters in /metrics."""

from __future__ import annotations

import httpx

from llm_onnx.runtime import Model


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "_total "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def test_speculating_server_answers_as_plain_decoding_and_counts_drafts(server, client,
                                                                        chat_model_folder):
    plain = Model.load(chat_model_folder, provider="cpu", threads=1, speculative="off")
    assert Model.load(chat_model_folder, provider="cpu", threads=1).speculative.method == "ngram"
    words = " ".join(f"t{i}" for i in (5, 9, 17, 33, 5, 9, 17, 33, 5, 9))
    for prompt in (words, "t7 t8 t9 t7 t8"):
        expected = plain.generate(prompt, max_new_tokens=48, temperature=0).text
        got = client.completions.create(model="tiny-chat", prompt=prompt, max_tokens=48,
                                        temperature=0)
        assert got.choices[0].text == expected
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model="tiny-chat", prompt=prompt, max_tokens=48, temperature=0, stream=True))
        assert streamed == expected
    metrics = httpx.get(server.url + "/metrics").text
    drafted = _metric(metrics, "llm_onnx_speculative_drafted_tokens")
    accepted = _metric(metrics, "llm_onnx_speculative_accepted_tokens")
    assert drafted > 0 and 0 < accepted <= drafted
    assert 0 < _metric(metrics, "llm_onnx_speculative_acceptance_ratio") <= 1

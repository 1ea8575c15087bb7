"""The default model end to end (real SmolLM2-135M-Instruct weights, exported on first use into
the cache): the README's question, --json, chat with the KV cache kept between turns."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from llm_onnx.cli import main
from llm_onnx.runtime import Model

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def model(smollm2_export):
    return Model.load(smollm2_export("fp32"))


def test_cli_generate_answers_paris(smollm2_export):
    smollm2_export("fp32")  # the first use happened; the CLI finds it in the cache
    result = CliRunner().invoke(main, ["generate", QUESTION], catch_exceptions=False)
    assert result.exit_code == 0
    assert "Paris" in result.stdout


def test_cli_json_output_parses(smollm2_export):
    smollm2_export("fp32")
    result = CliRunner().invoke(main, ["generate", "--json", "-q", QUESTION, "--max-new-tokens", "12"],
                                catch_exceptions=False)
    data = json.loads(result.stdout)
    assert set(data) >= {"text", "token_ids", "finish_reason", "timings"}
    assert "Paris" in data["text"] and data["finish_reason"] in ("stop", "length")
    assert data["timings"]["ttft_s"] > 0 and data["timings"]["decode_tok_s"] > 0


def test_chat_template_matches_transformers(model, smollm2_gguf):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    conversations = [
        [{"role": "user", "content": QUESTION}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello! ¿Qué tal? 你好"}, {"role": "user", "content": "Bye"}],
    ]
    for messages in conversations:
        for gen in (True, False):
            assert model.render_chat(messages, gen) == hf.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=gen)


def test_chat_keeps_the_first_turn_in_the_cache(model):
    session = model.chat_session()
    first = session.send(QUESTION, max_new_tokens=24)
    assert "Paris" in first.text
    second = session.send("And of Germany?", max_new_tokens=24)
    assert 0 < second.timings.prefill_tokens < second.prompt_tokens / 2
    # The same conversation run from scratch gives the same greedy answer.
    fresh = model.chat(session.messages[:-1], max_new_tokens=24)
    assert fresh.token_ids == second.token_ids
    assert "Berlin" in second.text


def test_chat_command_streams_turns(smollm2_export):
    smollm2_export("fp32")
    result = CliRunner().invoke(main, ["chat", "-q", "--max-new-tokens", "16"],
                                input=f"{QUESTION}\n/reset\n/exit\n", catch_exceptions=False)
    assert result.exit_code == 0 and "Paris" in result.stdout

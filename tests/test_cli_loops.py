"""The line `generate` and `chat` print on stderr when an answer ran to the token limit in a
repetition loop, on the tiny byte-level model (tests/byte_model.py): --choice forces the answer
byte by byte, so a repeated phrase cut by --max-new-tokens is a loop the model cannot leave, and
a phrase that never repeats is an answer cut without one."""

from __future__ import annotations

import json
from types import SimpleNamespace

import click
import pytest
from click.testing import CliRunner

from llm_onnx.cli import main
from llm_onnx.cli.generating import loop_mark

PHRASE = "la France, "
LOOP = PHRASE * 8  # 88 bytes: cut at 40 tokens, 3.6 copies
PLAIN = "The capital of France is Paris, a city on the Seine river."  # 58 bytes, no repeat


def run(*args, **kwargs):
    return CliRunner().invoke(main, list(args), **kwargs)


def generate(folder, choice: str, *args):
    return run("generate", "--model", str(folder), "-q", "--max-new-tokens", "40",
               "--choice", choice, *args, "Capital of France?")


def test_generate_says_when_the_answer_looped(byte_model_folder):
    result = generate(byte_model_folder, LOOP)
    assert result.exit_code == 0, result.output
    assert result.stdout == LOOP[:40] + "\n"  # the answer itself is printed as it came
    assert result.stderr.count("\n") == 1  # one line
    assert result.stderr.startswith(f"[looped: {PHRASE!r} over and over, 40 of 40 tokens")
    assert "--repetition-penalty 1.1" in result.stderr and "--temperature" in result.stderr
    assert "fp32" not in result.stderr  # the folder is fp32 already


def test_generate_json_keeps_stdout_json(byte_model_folder):
    result = generate(byte_model_folder, LOOP, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["finish_reason"] == "length" and data["text"] == LOOP[:40]
    assert result.stderr.startswith("[looped: ")


@pytest.mark.parametrize("choice, limit", [(PLAIN, "40"), (LOOP[:33], "200")])
def test_no_line_without_a_loop(byte_model_folder, choice, limit):
    """Cut without repeating itself, or a repeated phrase that ended (finish_reason stop)."""
    result = run("generate", "--model", str(byte_model_folder), "-q", "--max-new-tokens", limit,
                 "--choice", choice, "Capital of France?")
    assert result.exit_code == 0, result.output
    assert result.stdout == choice[:int(limit)] + "\n" and result.stderr == ""


def test_chat_says_looped_instead_of_cut(byte_model_folder):
    result = run("chat", "--model", str(byte_model_folder), "-q", "--max-new-tokens", "40",
                 "--choice", LOOP, input="Capital of France?\n/exit\n")
    assert result.exit_code == 0, result.output
    assert result.stdout == LOOP[:40] + "\n"
    assert result.stderr.startswith(f"[looped: {PHRASE!r}") and "[cut at" not in result.stderr
    result = run("chat", "--model", str(byte_model_folder), "-q", "--max-new-tokens", "40",
                 "--choice", PLAIN, input="Capital of France?\n/exit\n")
    assert result.stderr == "[cut at 40 tokens: --max-new-tokens 40]\n"


def fake_model(precision: str):
    manifest = SimpleNamespace(precision=SimpleNamespace(precision=precision))
    return SimpleNamespace(engine=SimpleNamespace(manifest=manifest), tokenizer=None)


def test_the_line_names_the_remedies_for_a_quantized_folder():
    looped = SimpleNamespace(finish_reason="length", token_ids=[1, 2, 3, 4] * 10)
    mark = click.unstyle(loop_mark(looped, fake_model("int8")))
    assert "a 4-token phrase over and over, 40 of 40 tokens" in mark
    assert mark.endswith("; try --repetition-penalty 1.1, sampling (--temperature 0.8) or an "
                         "fp32 export]")
    assert "fp32 export" not in loop_mark(looped, fake_model("fp32"))
    stopped = SimpleNamespace(finish_reason="stop", token_ids=looped.token_ids)
    assert loop_mark(stopped, fake_model("int8")) is None and loop_mark(None, None) is None

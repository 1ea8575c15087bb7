"""The command line: help, one-line errors with exit code 1, --debug tracebacks."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from llm_onnx.cli import main


def run(*args, **kwargs):
    return CliRunner().invoke(main, list(args), **kwargs)


def test_help_lists_commands_and_examples():
    result = run("--help")
    assert result.exit_code == 0
    for command in ("export", "generate", "chat"):
        assert command in result.output
    assert "Examples" in run("export", "--help").output


@pytest.mark.parametrize("args, message", [
    (["export", "--config", "qwen3_8B", "--random-weights"], "Did you mean 'qwen3_8b'?"),
    (["export"], "Say what to export"),
    (["export", "--config", "qwen3_8b", "--checkpoint", "x"], "either --checkpoint PATH or --config"),
    (["export", "--checkpoint", "/nonexistent/ckpt"], "no such file or folder"),
    (["generate", "--model", "/nonexistent", "hi"], "no such model folder"),
])
def test_errors_are_one_line(args, message):
    result = run(*args)
    assert result.exit_code == 1
    assert message in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_debug_shows_the_traceback():
    result = run("--debug", "export", "--config", "nope", "--random-weights")
    assert result.exit_code != 0 and result.exception is not None


@pytest.mark.parametrize("args, message", [
    (["--max-new-tokens", "0"], "max_new_tokens"),
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "0"], "top_p"),
    (["--top-k", "-1"], "top_k"),
])
def test_bad_sampling_options(tiny_export, args, message):
    folder = tiny_export("llama_tiny", "fp32")
    # The tiny model has no tokenizer: bad options must fail before that matters.
    result = run("generate", "--model", str(folder), "-q", "hello", *args)
    assert result.exit_code == 1 and message in result.output


def test_empty_prompt_and_bad_prompt_file(tmp_path):
    assert "The prompt is empty" in run("generate", "   ").output
    bad = tmp_path / "p.txt"
    bad.write_bytes(b"caf\xe9 au lait")
    result = run("generate", "--prompt-file", str(bad))
    assert result.exit_code == 1 and "not valid UTF-8" in result.output

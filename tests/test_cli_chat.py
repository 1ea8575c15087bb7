"""The CLI's chat template switches (--no-think, --template-var) and a reasoning model's thinking
printed apart from the answer, on the tiny thinking Qwen3 (tests/thinking_model.py)."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from llm_onnx.cli import main
from llm_onnx.runtime import Model

PROMPT = "t30 t31 t32"
USER = [{"role": "user", "content": PROMPT}]
OFF = {"enable_thinking": False}


def run(*args, **kwargs):
    return CliRunner().invoke(main, list(args), **kwargs)


@pytest.fixture(scope="module")
def folder(thinking_model):
    return str(thinking_model[1])


@pytest.fixture(scope="module")
def model(folder):
    return Model.load(folder, provider="cpu")


def generate(folder, *args):
    return run("generate", "--model", folder, "-q", "--max-new-tokens", "8", *args)


def test_generate_prints_the_answer_and_the_thinking_apart(folder, model):
    ref = model.chat(USER, max_new_tokens=8, temperature=0)
    result = generate(folder, PROMPT)
    assert result.exit_code == 0, result.output
    assert result.stdout == ref.text + "\n"  # a pipe gets the answer alone
    assert ref.reasoning.strip() in result.stderr and "think>" not in result.stdout
    data = json.loads(generate(folder, "--json", PROMPT).stdout)
    assert (data["text"], data["reasoning"], data["token_ids"]) == \
        (ref.text, ref.reasoning, ref.token_ids)


@pytest.mark.parametrize("flags", [["--no-think"], ["--template-var", "enable_thinking=false"],
                                   ["--template-var", "enable_thinking=false", "--no-think"]])
def test_no_think_and_template_var_reach_the_template(folder, model, flags):
    ref = model.chat(USER, template_vars=OFF, max_new_tokens=8, temperature=0)
    assert ref.reasoning is None
    data = json.loads(generate(folder, "--json", *flags, PROMPT).stdout)
    assert data["token_ids"] == ref.token_ids and "reasoning" not in data
    result = generate(folder, *flags, PROMPT)
    assert result.exit_code == 0 and result.stdout == ref.text + "\n" and result.stderr == ""


@pytest.mark.parametrize("value, expected", [
    ("enable_thinking=false", False), ("enable_thinking=0", 0), ("enable_thinking=no", "no"),
    ("enable_thinking=[1, \"a\"]", [1, "a"]), ("enable_thinking=", ""),
    (" enable_thinking ={\"x\": null}", {"x": None}),
])
def test_template_var_values_are_json_when_they_parse(value, expected):
    from llm_onnx.cli import _TemplateVar

    assert _TemplateVar().convert(value, None, None) == ("enable_thinking", expected)


@pytest.mark.parametrize("flags, message", [
    (["--template-var", "enable_thinking"], "is not KEY=VALUE"),
    (["--template-var", "=1"], "is not KEY=VALUE"),
    (["--template-var", "enable-thinking=1"], "is not KEY=VALUE"),
    (["--template-var", "enable_thinkin=false"], "does not use 'enable_thinkin'"),
    (["--template-var", "messages=[]"], "set by the renderer itself"),
    (["--no-think", "--template-var", "enable_thinking=true"], "contradicts"),
])
def test_bad_template_vars_name_the_flag(folder, flags, message):
    result = generate(folder, *flags, PROMPT)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "'--template-var'" in result.output or "'--no-think'" in result.output
    assert "Traceback" not in result.output


def test_no_think_needs_a_template_with_the_switch(folder, tmp_path):
    """A copy of the folder whose template has no enable_thinking (the manifest carries the
    template; its own hash is not checked)."""
    copy = tmp_path / "plain-template"
    shutil.copytree(folder, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["tokenizer"]["chat_template"] = (
        "{% for m in messages %}{{ m['content'] }} {% endfor %}")
    (copy / "manifest.json").write_text(json.dumps(manifest))
    result = generate(str(copy), "--no-think", PROMPT)
    assert result.exit_code == 1 and "has no enable_thinking switch" in result.output
    result = generate(str(copy), "--raw", "--no-think", PROMPT)
    assert result.exit_code == 1 and "--raw does not use" in result.output
    result = generate(str(copy), "--template-var", "style=1", PROMPT)
    assert result.exit_code == 2 and "(it reads: no other variables)" in result.output


def test_chat_command_keeps_turns_and_passes_no_think(folder, model):
    result = run("chat", "--model", folder, "-q", "--max-new-tokens", "6",
                 input=f"{PROMPT}\nt40 t41\n/exit\n")
    assert result.exit_code == 0, result.output
    session = model.chat_session()
    first = session.send(PROMPT, max_new_tokens=6, temperature=0)
    second = session.send("t40 t41", max_new_tokens=6, temperature=0)
    assert result.stdout == f"{first.text}\n{second.text}\n"
    assert result.stderr.count(first.reasoning.strip()) == 2  # each turn thought

    result = run("chat", "--model", folder, "-q", "--max-new-tokens", "6", "--no-think",
                 input=f"{PROMPT}\n/exit\n")
    off = model.chat(USER, template_vars=OFF, max_new_tokens=6, temperature=0)
    # stderr holds the mark of a turn cut by the token limit, and nothing else
    cut = "[cut at 6 tokens: --max-new-tokens 6]\n" if off.finish_reason == "length" else ""
    assert result.exit_code == 0 and result.stdout == off.text + "\n" and result.stderr == cut

"""`llm-onnx chat` at a real terminal (a pseudo-terminal driven by pexpect): line editing and
history, Ctrl-C stopping an answer with the conversation kept, the mark of a turn cut by the
token limit, commands, several lines as one message, Ctrl-D leaving. The answers are held to
the same conversation run through Model.chat (the conversation as the terminal showed it)."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

from llm_onnx.cli.chatting import Command, parse_line

pexpect = pytest.importorskip("pexpect")
ROOT = Path(__file__).resolve().parents[1]
LIMIT = 6
LEFT, UP = "\x1b[D", "\x1b[A"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The tiny thinking Qwen3 (tests/thinking_model.py) with a long context, so that an answer
    runs long enough to be stopped."""
    from llm_onnx.checkpoints import open_checkpoint
    from llm_onnx.export import ExportOptions, export_model
    from tests.thinking_model import make_thinking_checkpoint

    ckpt = tmp_path_factory.mktemp("ckpt") / "thinking"
    make_thinking_checkpoint(ckpt, context=8192)
    out = tmp_path_factory.mktemp("model") / "thinking"
    export_model(open_checkpoint(ckpt), out, ExportOptions(precision="fp32", max_seq_len=8192),
                 progress=False)
    return out


@pytest.fixture(scope="module")
def model(folder):
    from llm_onnx.runtime import Model

    return Model.load(folder, provider="cpu")


def spawn(folder, tmp_path, *args):
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONPATH": str(ROOT),
           "NO_COLOR": "1", "TERM": "xterm"}
    child = pexpect.spawn(sys.executable, ["-m", "llm_onnx.cli", "chat", "--model", str(folder),
                                           "-q", "--no-think", "--provider", "cpu", *args],
                          env=env, cwd=str(tmp_path), encoding="utf-8", timeout=60,
                          dimensions=(40, 200))
    child.expect_exact("> ")
    return child


def clean(text: str) -> str:
    """Terminal output without escape sequences and carriage returns."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r", "")


def said(child) -> str:
    """What the terminal showed up to the next prompt."""
    child.expect_exact("\r\n> ")
    return clean(child.before)


def answer_of(model, messages, limit=LIMIT):
    return model.chat(messages, max_new_tokens=limit, temperature=0,
                      template_vars={"enable_thinking": False})


def test_editing_history_cut_mark_and_ctrl_d(folder, model, tmp_path):
    child = spawn(folder, tmp_path, "--max-new-tokens", str(LIMIT))
    messages = []
    # the left arrow moves the cursor: "t5", left, "3" is the message "t35"
    child.send("t5" + LEFT + "3\r")
    first = answer_of(model, [{"role": "user", "content": "t35"}])
    shown = said(child)
    assert first.text.strip() in shown and "\x1b" not in shown
    assert first.finish_reason == "length" and f"[cut at {LIMIT} tokens" in shown
    messages += [{"role": "user", "content": "t35"}, {"role": "assistant", "content": first.text}]
    # the up arrow brings the last line back: the same message again, in the conversation
    child.send(UP + "\r")
    second = answer_of(model, messages + [{"role": "user", "content": "t35"}])
    assert second.text.strip() in said(child)
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.wait()
    assert child.exitstatus == 0
    assert (tmp_path / "state" / "llm-onnx" / "chat_history").read_text().count("t35") >= 1


def test_ctrl_c_stops_the_answer_and_keeps_the_conversation(folder, model, tmp_path):
    child = spawn(folder, tmp_path, "--max-new-tokens", "8000")
    child.send("t30 t31\r")
    child.expect(r"t\d+ t\d+ t\d+")  # the answer is streaming
    head = clean(child.before + child.after)
    child.sendintr()
    shown = head + said(child)
    assert "[stopped]" in shown
    # (the terminal echoes the interrupt as ^C)
    partial = shown.split("[stopped]")[0].split("t30 t31", 1)[-1].replace("^C", "").strip()
    assert partial and not model.chat([{"role": "user", "content": "t30 t31"}], max_new_tokens=8000,
                                      temperature=0, template_vars={"enable_thinking": False}
                                      ).text.strip() == partial  # stopped part-way
    # Ctrl-C at the prompt clears the line and asks again; the process stays
    child.send("t99")
    child.expect_exact("t99")
    time.sleep(0.3)  # readline back in its wait (a signal while it handles a key waits for the next)
    child.sendintr()
    child.expect_exact("> ")
    # the next turn follows the conversation as the terminal showed it (its first tokens)
    child.send("t40\r")
    reply = answer_of(model, [{"role": "user", "content": "t30 t31"},
                              {"role": "assistant", "content": partial},
                              {"role": "user", "content": "t40"}], limit=12)
    child.expect_exact(reply.text.strip())
    child.sendintr()
    assert "[stopped]" in said(child)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.wait()
    assert child.exitstatus == 0


def test_commands_and_several_lines(folder, model, tmp_path):
    child = spawn(folder, tmp_path, "--max-new-tokens", str(LIMIT))
    child.send("/help\r")
    assert "/reset" in said(child)
    child.send("/nonsense\r")
    assert "unknown command /nonsense" in said(child)
    child.send("/image missing.png\r")
    assert "no such file" in said(child)
    (tmp_path / "photo.png").write_bytes(b"\x89PNG")
    child.send("/image photo.png\r")
    assert "takes text only" in said(child)
    child.send("t50 \\\r")  # a backslash at the end: the message goes on
    child.expect_exact("... ")
    child.send("t51\r")
    two_lines = answer_of(model, [{"role": "user", "content": "t50 \nt51"}])
    assert two_lines.text.strip() in said(child)
    child.send("/reset\r")
    assert "conversation cleared" in said(child)
    child.send('"""\r')
    child.send("t60\r")
    child.send('"""\r')
    block = answer_of(model, [{"role": "user", "content": "t60"}])
    assert block.text.strip() in said(child)
    child.sendline("/quit")
    child.expect(pexpect.EOF)


@pytest.mark.parametrize("line, command", [
    ("hello", Command(None, text="hello")),
    ("//etc/hosts is a file", Command(None, text="/etc/hosts is a file")),
    ("/image 'my photo.jpg' b.png", Command("image", ("my photo.jpg", "b.png"))),
    ("/EXIT", Command("exit")),
    ("/bye", Command("exit")),
])
def test_parse_line(line, command):
    assert parse_line(line) == command


def test_parse_line_errors_name_the_command():
    assert parse_line("/image 'unclosed").name == "error"
    assert "unknown command /frob" in parse_line("/frob x").args[0]

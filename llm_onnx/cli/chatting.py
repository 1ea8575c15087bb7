"""`llm-onnx chat`: a conversation at a prompt that behaves like one.

Line editing and history (GNU readline where Python has it; the history is kept in
``$XDG_STATE_HOME/llm-onnx/chat_history``), Ctrl-C stops an answer and returns to the prompt
with the conversation kept (the answer as far as it was shown), Ctrl-C at the prompt clears the
line, Ctrl-D leaves, a line ending in a backslash or a block between two lines of three double
quotes is one message, and a turn cut by the token limit says so (and, when it ran there in
a loop, what to try: generating.loop_mark). Commands start with a slash
(a message that starts with one is sent as ``//...``).
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from llm_onnx.cli.app import _handle_errors, main
from llm_onnx.cli.generating import (
    _constraint_options,
    _load_model,
    _sampling_options,
    _template_options,
    _template_vars,
    cut_mark,
    echo_pieces,
    loop_mark,
)

HELP = """Commands:
  /help            this list
  /reset           start the conversation over (/clear does the same)
  /image PATH      attach an image to the next message (models that take images)
  /exit            leave (/quit, /bye, or Ctrl-D)
Ctrl-C stops an answer (the conversation keeps it as far as it went) or clears the line.
End a line with \\ to go on on the next, or put a message between two lines of \"\"\"."""

COMMANDS = {"help": "help", "reset": "reset", "clear": "reset", "image": "image",
            "exit": "exit", "quit": "exit", "bye": "exit"}


@dataclass(frozen=True)
class Command:
    """A parsed input line: a message to send (``name`` None) or a command with arguments."""

    name: str | None
    args: tuple[str, ...] = ()
    text: str = ""


def parse_line(text: str) -> Command:
    """What the user typed, as a message or a command; a leading ``//`` sends one slash."""
    if text.startswith("//"):
        return Command(None, text=text[1:])
    if not text.startswith("/"):
        return Command(None, text=text)
    word, _, rest = text[1:].partition(" ")
    try:
        args = tuple(shlex.split(rest))
    except ValueError as e:  # an unclosed quote
        return Command("error", (f"/{word}: {e}",))
    name = COMMANDS.get(word.lower())
    if name is None:
        return Command("error", (f"unknown command /{word}; /help lists them (start a message "
                                 "with // to send a slash).",))
    return Command(name, args)


def history_file() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                            "state")
    return Path(base) / "llm-onnx" / "chat_history"


class Prompt:
    """Reads messages: line editing and history when the input is a terminal with readline,
    continuation lines, and Ctrl-C clearing the line being typed."""

    def __init__(self, interactive: bool) -> None:
        self.interactive = interactive
        self.history: Path | None = None
        if interactive:
            try:
                import readline
            except ImportError:  # (Windows without pyreadline: plain input)
                return
            self.readline = readline
            self.history = history_file()
            try:
                readline.read_history_file(self.history)
            except OSError:
                pass
            readline.set_history_length(1000)

    def save(self) -> None:
        if self.history is not None:
            try:
                self.history.parent.mkdir(parents=True, exist_ok=True)
                self.readline.write_history_file(self.history)
            except OSError:
                pass

    def _input(self, prompt: str) -> str:
        return input(prompt if self.interactive else "")

    def read(self) -> str | None:
        """The next message or command line (None at the end of input). Ctrl-C clears what is
        being typed and asks again."""
        while True:
            try:
                return self._read()
            except KeyboardInterrupt:
                if not self.interactive:
                    return None
                click.echo("^C", err=True)
            except EOFError:
                if self.interactive:
                    click.echo()
                return None

    def _read(self) -> str:
        line = self._input("> ")
        if line.strip() == '"""':  # a block, until a line of """
            lines = []
            while (more := self._input("... ")).strip() != '"""':
                lines.append(more)
            return "\n".join(lines)
        lines = [line]
        while lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1]
            lines.append(self._input("... "))
        return "\n".join(lines)


@main.command()
@click.option("--system", help="System message.")
@_template_options
@_constraint_options
@_sampling_options
@_handle_errors
def chat(system, no_think, template_var, **kwargs) -> None:
    """Chat with a model; earlier turns stay in the KV cache. A reasoning model's thinking goes
    to stderr, dimmed.

    Type a message and press Enter; arrow keys edit and recall earlier lines. Ctrl-C stops an
    answer and keeps the conversation; Ctrl-D (or /exit) leaves. /help lists the commands;
    end a line with \\ (or put the message between two lines of \"\"\") for several lines.

    \b
    Examples:
      llm-onnx chat
      llm-onnx chat --model models/qwen3-8b-int4 --temperature 0.7 --seed 1
      llm-onnx chat --model models/qwen3-8b-int4 --no-think
      llm-onnx chat --json-object --system "Answer in JSON."
    """
    from llm_onnx.errors import GenerationError

    model, overrides = _load_model(kwargs)
    if not model.chat_template:
        raise GenerationError("this model has no chat template; use `llm-onnx generate --raw`.")
    session = model.chat_session(system, template_vars=_template_vars(model, no_think,
                                                                      template_var))
    reader = Prompt(sys.stdin.isatty())
    limit = overrides.get("max_new_tokens", 256)
    attached: list[str] = []  # /image paths waiting for the next message
    try:
        while (line := reader.read()) is not None:
            if not line.strip():
                continue
            command = parse_line(line.strip())
            if command.name == "exit":
                return
            if command.name == "help":
                click.echo(HELP, err=True)
            elif command.name == "error":
                click.echo(command.args[0], err=True)
            elif command.name == "reset":
                session.reset()
                click.echo("(conversation cleared)", err=True)
            elif command.name == "image":
                note = _image_note(model, command.args)
                if note is None:
                    attached += command.args
                    note = (f"(attached {', '.join(command.args)}: "
                            "it goes with your next message)")
                click.echo(note, err=True)
            else:
                _answer(session, command.text, overrides, limit, attached)
                attached = []
    finally:
        reader.save()


def _answer(session, text: str, overrides: dict, limit: int, images: list[str] = ()) -> None:
    """One turn, streamed; Ctrl-C stops it and the conversation keeps what was shown."""
    from llm_onnx.errors import GenerationError

    pieces = session.stream(text, images=list(images), **overrides)
    try:
        echo_pieces(pieces)
    except KeyboardInterrupt:
        pieces.close()
        click.echo(click.style("\n[stopped]", dim=True), err=True)
        return
    except GenerationError as e:  # e.g. the conversation outgrew the context: say so, go on
        click.echo(f"Error: {e}", err=True)
        return
    # an answer that ran to the limit in a loop says so (and what to try), else that it was cut
    mark = loop_mark(session.last, session.model) or cut_mark(session.last, limit)
    if mark:
        click.echo(mark, err=True)


def _image_note(model, args: tuple[str, ...]) -> str | None:
    """Why /image ARGS cannot be attached (None: they can)."""
    if not args:
        return "/image needs a path: /image photo.jpg"
    missing = [a for a in args if not Path(a).is_file()]
    if missing:
        return f"/image {missing[0]}: no such file."
    if getattr(model, "image_inputs", None) is None:
        return "this model folder takes text only; export it from the multimodal checkpoint."
    return None

"""The `llm-onnx` group and how library errors reach the terminal (one line, exit code 1)."""

from __future__ import annotations

import functools
import sys

import click

from llm_onnx import __version__
from llm_onnx.errors import LlmOnnxError


def _handle_errors(func):
    """Library errors become one line on stderr and exit code 1; --debug shows the traceback."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        ctx = click.get_current_context()
        debug = (ctx.find_root().params or {}).get("debug", False)
        try:
            return func(*args, **kwargs)
        except LlmOnnxError as e:
            if debug:
                raise
            raise click.ClickException(str(e)) from None
        except KeyboardInterrupt:
            if debug:
                raise
            click.echo("Interrupted.", err=True)
            sys.exit(130)
        except MemoryError:
            if debug:
                raise
            raise click.ClickException("out of memory; try a smaller --max-seq-len or batch, or "
                                       "another precision.") from None

    return wrapper


class _Main(click.Group):
    """The group, knowing whether it parses this process's own command line (``main()`` with no
    arguments: the console script, ``python -m llm_onnx.cli``), which `export` may then execute
    again from the start (huge pages); not when called with arguments (CliRunner, a host
    program)."""

    own_command_line = False

    def main(self, args=None, *rest, **kwargs):
        self.own_command_line = args is None
        return super().main(args, *rest, **kwargs)


@click.group(cls=_Main,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
@click.version_option(__version__, prog_name="llm-onnx")
def main(debug: bool) -> None:
    """Compile decoder-only LLMs to ONNX and run them with ONNX Runtime.

    \b
    Examples:
      llm-onnx generate "What is the capital of France?"
      llm-onnx export --checkpoint ./Qwen3-8B --precision int4 --out models/qwen3-8b-int4
      llm-onnx export --config qwen3_8b --random-weights --precision fp16
      llm-onnx chat --model models/qwen3-8b-int4
      llm-onnx bench --model models/qwen3-8b-int4 --prompt-len 128 --new-tokens 128
      llm-onnx serve --model models/qwen3-8b-int4 --port 8000
      llm-onnx export --checkpoint ./Qwen3-Embedding-0.6B --task embed --out models/q3e
      llm-onnx embed --model models/q3e "What is the capital of France?"
    """

"""`llm-onnx models`: the exported model folders (llm-onnx's cache and ./models), and
`llm-onnx models rm NAME` to remove one."""

from __future__ import annotations

import os
from pathlib import Path

import click

from llm_onnx.cli.app import _handle_errors, main


def _where(folder: Path) -> str:
    """The folder that holds a model, short: ~ for the home folder."""
    text = str(folder.parent)
    home = os.path.expanduser("~")
    return "~" + text[len(home):] if text.startswith(home + os.sep) else text


@main.group(invoke_without_command=True)
@click.pass_context
@_handle_errors
def models(ctx: click.Context) -> None:
    """List the exported model folders: llm-onnx's cache (where the default model goes,
    $XDG_CACHE_HOME/llm-onnx/models) and ./models (where `llm-onnx export` writes by default),
    with family, precision, size and date. Downloaded checkpoints stay in the Hugging Face cache
    (`hf cache ls` lists them).

    \b
    Examples:
      llm-onnx models
      llm-onnx models rm Qwen3-0.6B-int4
      llm-onnx models rm models/Qwen3-0.6B-int4 --yes
    """
    if ctx.invoked_subcommand is not None:
        return
    from llm_onnx.checkpoints.hub import human_size
    from llm_onnx.model_store import list_models, model_roots

    found = list_models()
    if not found:
        click.echo("No exported models in " + " or ".join(str(r) for r in model_roots())
                   + "; `llm-onnx export` makes one.")
        return
    rows = [("NAME", "FAMILY", "PRECISION", "SIZE", "CREATED", "IN")]
    rows += [(m.name, m.family + (" (embed)" if m.task == "embed" else ""), m.precision,
              human_size(m.bytes), m.created[:16].replace("T", " "), _where(m.folder))
             for m in found]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])


@models.command("rm")
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@_handle_errors
def rm(name: str, yes: bool) -> None:
    """Remove the model folder NAME (a name from `llm-onnx models`, or a folder's path). Only a
    folder made by `llm-onnx export` is removed: one holding an llm-onnx manifest and nothing the
    manifest does not list."""
    from llm_onnx.checkpoints.hub import human_size
    from llm_onnx.model_store import find_model, remove_model

    model = find_model(name)
    if not yes and not click.confirm(f"Remove {model.folder} ({human_size(model.bytes)})?",
                                     default=False):
        click.echo("Nothing removed.")
        return
    remove_model(model)
    click.echo(f"Removed {model.folder}.")

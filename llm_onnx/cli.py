"""llm-onnx command line: a thin layer over the library (each command wraps one function).

Heavy imports (torch, onnxruntime) happen inside the commands, so `--help` stays instant.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from llm_onnx import __version__
from llm_onnx.errors import LlmOnnxError
from llm_onnx.models import REGISTRY

PRECISIONS = ("fp32", "fp16", "int8", "int4")


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


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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
    """


def _default_precision() -> str:
    from llm_onnx.runtime.providers import cuda_status

    return "fp16" if cuda_status()[0] else "int8"


@main.command()
@click.option("--config", "config_name", metavar="NAME",
              help=f"A named preset: {', '.join(sorted(REGISTRY))}.")
@click.option("--checkpoint", type=click.Path(path_type=Path),
              help="A Hugging Face checkpoint folder (config.json + safetensors) or a .gguf file.")
@click.option("--random-weights", is_flag=True,
              help="With --config: seeded random weights of the preset's full shape.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for --random-weights.")
@click.option("--precision", type=click.Choice(PRECISIONS),
              help="Weights precision. Default: fp16 with a usable CUDA GPU, else int8.")
@click.option("--out", type=click.Path(path_type=Path),
              help="Model folder to write. Default: models/<name>-<precision>.")
@click.option("--max-seq-len", type=click.IntRange(min=2),
              help="Context length the model supports. Default: the model's own.")
@click.option("--block-size", type=click.Choice(["16", "32", "64", "128", "256"]), default="32",
              show_default=True, help="Quantization block size (int8/int4).")
@click.option("--float-embeddings", is_flag=True,
              help="int8/int4: keep the embedding and LM head in float (default: int8).")
@click.option("--accuracy-level", type=click.IntRange(0, 4), default=4, show_default=True,
              help="int8/int4: MatMulNBits accuracy level (4 = int8 activations, fastest on CPU; "
                   "0 = fp32 activations).")
@click.option("--all-logits", is_flag=True,
              help="The prefill graph returns logits for every position (default: last only).")
@click.option("--no-validate", is_flag=True, help="Skip the ONNX Runtime vs torch parity gate.")
@click.option("--force", is_flag=True, help="Replace --out if it exists (only once the new "
              "folder is complete).")
@_handle_errors
def export(config_name, checkpoint, random_weights, seed, precision, out, max_seq_len, block_size,
           float_embeddings, accuracy_level, all_logits, no_validate, force) -> None:
    """Export a model to an ONNX model folder (prefill.onnx, decode.onnx, weights.data, tokenizer,
    manifest.json), then check it against torch in ONNX Runtime.

    \b
    Examples:
      llm-onnx export --checkpoint ./SmolLM2-135M-Instruct.Q4_1.gguf --precision fp32
      llm-onnx export --checkpoint ~/ckpt/Qwen3-30B-A3B --precision int4 --out models/q3moe
      llm-onnx export --config qwen3_8b --random-weights --precision fp16
    """
    from llm_onnx.export.cli_support import resolve_checkpoint
    from llm_onnx.export import ExportOptions, export_model

    ckpt = resolve_checkpoint(config_name, checkpoint, random_weights, seed)
    precision = precision or _default_precision()
    options = ExportOptions(precision=precision, block_size=int(block_size),
                            embedding_bits=None if float_embeddings else 8,
                            accuracy_level=accuracy_level, max_seq_len=max_seq_len,
                            all_logits=all_logits, validate=not no_validate)
    out = out or Path("models") / f"{ckpt.name}-{precision}"
    folder = export_model(ckpt, out, options, force=force, progress=True)
    click.echo(f"Exported {ckpt.name} ({precision}) to {folder}")


if __name__ == "__main__":
    main()

"""`llm-onnx embed`: embeddings of texts from an embedding model's folder, as JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from llm_onnx.cli.app import _handle_errors, main


@main.command()
@click.argument("texts", nargs=-1)
@click.option("--model", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Model folder from `llm-onnx export --task embed`.")
@click.option("--input-file", type=click.File("r", encoding="utf-8"),
              help="Also embed this file's lines, one text a line ('-': standard input; blank "
                   "lines are skipped).")
@click.option("--dimensions", type=click.IntRange(min=1),
              help="Keep each embedding's first N values (re-normalised where the model "
                   "normalises: Matryoshka models). Default: all of them.")
@click.option("--provider", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True, help="Execution provider.")
@click.option("--threads", type=click.IntRange(min=1), help="CPU threads (default: all cores).")
@_handle_errors
def embed(texts, model, input_file, dimensions, provider, threads) -> None:
    """Print the embeddings of TEXTS as JSON, in OpenAI's embeddings shape: {"object": "list",
    "data": [{"object": "embedding", "index": i, "embedding": [...]}], "model", "usage"}.

    Each text is tokenized with the model's special tokens and pooled as the folder's manifest
    says; a text past the model's context is an error (nothing is truncated).

    \b
    Examples:
      llm-onnx export --checkpoint ./Qwen3-Embedding-0.6B --task embed --out models/q3e
      llm-onnx embed --model models/q3e "What is the capital of France?" "Paris"
      llm-onnx embed --model models/q3e --dimensions 256 "a shorter vector"
      llm-onnx embed --model models/q3e --input-file docs.txt > vectors.json
    """
    from llm_onnx.runtime import Model

    items = list(texts)
    if input_file is not None:
        items += [line.rstrip("\n") for line in input_file if line.strip()]
    if not items:
        raise click.UsageError("give texts to embed (arguments, or --input-file FILE).")
    loaded = Model.load(model, provider=provider, threads=threads)
    rows, _ = loaded.embedding_ids(items)
    vectors = loaded.engine.embed(rows, dimensions)
    tokens = sum(len(r) for r in rows)
    body = {"object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": v.tolist()}
                     for i, v in enumerate(vectors)],
            "model": Path(model).name, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    json.dump(body, sys.stdout)
    sys.stdout.write("\n")

"""`llm-onnx export --task embed` and `llm-onnx embed`: JSON in OpenAI's embeddings shape equal
to Model.embed, --dimensions, --input-file, help with examples, one-line errors."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from llm_onnx.cli import main
from llm_onnx.model_folder import load_manifest
from llm_onnx.runtime import Model


def run(*args, **kwargs):
    return CliRunner().invoke(main, list(args), **kwargs)


def test_help_has_examples():
    result = run("embed", "--help")
    assert result.exit_code == 0 and "Examples" in result.output
    assert "llm-onnx embed --model" in result.output
    assert "--task [generate|embed]" in run("export", "--help").output
    assert "embed" in run("--help").output


def test_export_task_embed_then_embed(embedding_checkpoint, tmp_path):
    out = tmp_path / "q3e"
    result = run("export", "--checkpoint", str(embedding_checkpoint("llama")), "--task", "embed",
                 "--precision", "fp32", "--pooling", "last", "--normalize", "--out", str(out))
    assert result.exit_code == 0, result.output
    spec = load_manifest(out).embedding
    assert (spec.pooling, spec.normalize) == ("last", True)
    result = run("embed", "--model", str(out), "--provider", "cpu", "t1 t2 t3", "t4")
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert body["object"] == "list" and body["model"] == "q3e"
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    np.testing.assert_array_equal(got, Model.load(out, provider="cpu").embed(["t1 t2 t3", "t4"]))
    assert body["usage"] == {"prompt_tokens": 6, "total_tokens": 6}


def test_dimensions_and_input_file(embedding_export, tmp_path):
    folder = embedding_export("qwen3")
    lines = tmp_path / "texts.txt"
    lines.write_text("t1 t2\n\nt3 t4 t5\n")
    result = run("embed", "--model", str(folder), "--dimensions", "8", "--input-file",
                 str(lines), "t9")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)["data"]
    got = np.array([d["embedding"] for d in data], dtype=np.float32)
    expected = Model.load(folder, provider="cpu").embed(["t9", "t1 t2", "t3 t4 t5"],
                                                        dimensions=8)
    np.testing.assert_array_equal(got, expected)


def test_errors_are_one_line(embedding_export, tiny_export):
    for args, message in [
        (["embed", "--model", str(tiny_export("llama_tiny")), "t1"],
         "is a generation model: its graphs return next-token logits"),
        (["embed", "--model", str(embedding_export("qwen3")), "--dimensions", "65", "t1"],
         "dimensions must be an integer from 1 to 64"),
        (["embed", "--model", str(embedding_export("qwen3")), " ".join(["t1"] * 300)],
         "input 0 has 301 tokens but the model's context is 128 tokens"),
        (["generate", "--model", str(embedding_export("qwen3")), "t1"],
         "is an embedding model (exported with --task embed)"),
        (["chat", "--model", str(embedding_export("qwen3"))], "is an embedding model"),
        (["bench", "--model", str(embedding_export("qwen3")), "--prompt-len", "8",
          "--new-tokens", "8"], "is an embedding model"),
        (["export", "--config", "qwen3_tiny", "--random-weights", "--pooling", "mean"],
         "use them with task embed"),
    ]:
        result = run(*args)
        assert result.exit_code == 1, (args, result.output)
        assert message in result.output
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert "give texts to embed" in run("embed", "--model", str(embedding_export("qwen3"))).output

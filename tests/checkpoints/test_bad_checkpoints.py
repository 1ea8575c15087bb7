"""Bad checkpoints get one-line errors naming the file, the tensor or field, and what was
expected; nothing is ever unpickled."""

from __future__ import annotations

import json
import shutil
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from llm_onnx.checkpoints import open_checkpoint
from llm_onnx.errors import CheckpointError, ConfigError
from llm_onnx.families import get_config
from tests.hf_models import save_hf_checkpoint


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    folder = tmp_path_factory.mktemp("good")
    save_hf_checkpoint(get_config("qwen3_tiny"), folder)
    return folder


@pytest.fixture
def ckpt(good, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(good, folder)
    return folder


def rewrite(folder, change):
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_missing_tensor(ckpt):
    rewrite(ckpt, lambda t: t.pop("model.layers.1.self_attn.q_norm.weight"))
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(ckpt)
    msg = one_line(e)
    assert "lacks 1 tensor" in msg and "model.layers.1.self_attn.q_norm.weight" in msg and str(ckpt) in msg


def test_extra_tensor(ckpt):
    rewrite(ckpt, lambda t: t.update({"model.layers.9.mlp.up_proj.weight": torch.zeros(2, 2)}))
    with pytest.raises(CheckpointError, match="the config does not describe"):
        open_checkpoint(ckpt)


def test_wrong_shape(ckpt):
    rewrite(ckpt, lambda t: t.update({"model.layers.0.mlp.up_proj.weight": torch.zeros(7, 64)}))
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(ckpt)
    msg = one_line(e)
    assert "model.layers.0.mlp.up_proj.weight has shape [7, 64], expected [128, 64]" in msg
    assert "model.safetensors" in msg


def test_truncated_safetensors(ckpt):
    path = ckpt / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(ckpt)
    assert "model.safetensors" in one_line(e) and "truncated" in str(e.value)


def test_corrupt_safetensors_header(ckpt):
    path = ckpt / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 10**12) + b"{not json")
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        open_checkpoint(ckpt)


def test_unsupported_architecture(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["architectures"] = ["GPTBigCodeForCausalLM"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as e:
        open_checkpoint(ckpt)
    assert "'GPTBigCodeForCausalLM' is not supported" in one_line(e) and "config.json" in str(e.value)


def test_missing_config_field(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    del cfg["num_hidden_layers"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="missing field 'num_hidden_layers'"):
        open_checkpoint(ckpt)


def test_unsupported_rope_scaling_is_one_line_naming_the_file(ckpt):
    """Dynamic NTK scaling changes the frequencies with the running length, which a fixed table
    cannot follow: refused when the config is read, before any work."""
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "dynamic", "factor": 2.0}
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as e:
        open_checkpoint(ckpt)
    assert "\n" not in str(e.value)
    assert "config.json: rope_scaling type 'dynamic' is not supported" in str(e.value)
    assert "supported: linear, llama3, yarn" in str(e.value)


def test_pickle_checkpoint_is_refused(tmp_path, good):
    folder = tmp_path / "pickled"
    folder.mkdir()
    shutil.copy(good / "config.json", folder)
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04 not loaded")
    with pytest.raises(CheckpointError, match="pickle checkpoints are never loaded"):
        open_checkpoint(folder)


def test_empty_and_missing_paths(tmp_path):
    with pytest.raises(CheckpointError, match="folder is empty"):
        open_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="no such file or folder"):
        open_checkpoint(tmp_path / "nope")
    (tmp_path / "x.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="expected a Hugging Face checkpoint folder or a .gguf"):
        open_checkpoint(tmp_path / "x.bin")


def test_not_a_gguf(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"NOPE" + b"\0" * 64)
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        open_checkpoint(path)


@pytest.mark.slow
def test_truncated_gguf(tmp_path, smollm2_gguf):
    path = tmp_path / "cut.gguf"
    with open(smollm2_gguf, "rb") as f:
        path.write_bytes(f.read(20_000_000))
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(path)
    assert str(path) in one_line(e)


def test_sharded_checkpoint_loads_tensor_by_tensor(tmp_path):
    """model.safetensors.index.json with several shards: same logits as transformers."""
    from llm_onnx.checkpoints import build_model
    from tests.hf_models import make_hf_model

    cfg = get_config("qwen3_moe_tiny")
    hf = make_hf_model(cfg, seed=3)
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="50KB")
    shards = sorted(p.name for p in (tmp_path / "sharded").glob("*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    ckpt = open_checkpoint(tmp_path / "sharded")
    ours = build_model(ckpt.config, ckpt.source)
    ids = torch.tensor([[3, 14, 15, 92, 65, 35]])
    with torch.no_grad():
        want = hf(ids).logits
        got = ours(ids, torch.tensor([5], dtype=torch.int32), torch.tensor(6, dtype=torch.int32),
                   *ours.new_cache(1, 6))[0]
    assert (got - want).abs().max().item() <= 1e-4


def test_missing_shard(tmp_path):
    from tests.hf_models import make_hf_model

    make_hf_model(get_config("qwen3_tiny"), seed=3).save_pretrained(tmp_path / "s", max_shard_size="50KB")
    victim = sorted((tmp_path / "s").glob("*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(CheckpointError, match="shard listed in model.safetensors.index.json is missing"):
        open_checkpoint(tmp_path / "s")


# ------------------------------------------------------------------ Qwen3.5 (hybrid layers)


@pytest.fixture(scope="module")
def good_hybrid(tmp_path_factory):
    folder = tmp_path_factory.mktemp("good-hybrid")
    save_hf_checkpoint(get_config("qwen3_5_tiny"), folder)
    return folder


@pytest.fixture
def hybrid(good_hybrid, tmp_path):
    folder = tmp_path / "hybrid"
    shutil.copytree(good_hybrid, folder)
    return folder


def test_a_layer_kind_it_does_not_know(hybrid):
    cfg = json.loads((hybrid / "config.json").read_text())
    cfg["layer_types"][0] = "mamba2"
    (hybrid / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as e:
        open_checkpoint(hybrid)
    msg = one_line(e)
    assert "config.json" in msg and "layer_types" in msg and "'mamba2'" in msg
    assert "linear_attention, full_attention" in msg


def test_a_missing_state_weight(hybrid):
    rewrite(hybrid, lambda t: t.pop("model.layers.0.linear_attn.A_log"))
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(hybrid)
    msg = one_line(e)
    assert "model.layers.0.linear_attn.A_log" in msg and str(hybrid) in msg


def test_a_multimodal_checkpoint_reads_its_text_model_and_skips_the_rest(good_hybrid, tmp_path):
    """Qwen3_5ForConditionalGeneration: the text config under text_config, the text weights
    under model.language_model., an MTP head never read and, with text_only, a vision tower
    never read either (without it, its incomplete vision_config is refused by name)."""
    folder = tmp_path / "vlm"
    shutil.copytree(good_hybrid, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "text_config": cfg, "vision_config": {"depth": 1}}))
    rewrite(folder, lambda t: t.update(
        {**{k.replace("model.", "model.language_model.", 1): t.pop(k)
            for k in [k for k in t if k.startswith("model.")]},
         "model.visual.blocks.0.attn.qkv.weight": torch.zeros(3, 3),
         "mtp.fc.weight": torch.zeros(2, 4)}))
    with pytest.raises(ConfigError) as e:
        open_checkpoint(folder)
    assert one_line(e).count("(vision_config)") == 1 and "'hidden_size'" in one_line(e)
    ckpt = open_checkpoint(folder, text_only=True)
    assert ckpt.vision is None
    assert ckpt.config == get_config("qwen3_5_tiny").replace(
        max_position_embeddings=ckpt.config.max_position_embeddings)
    plain = open_checkpoint(good_hybrid)
    for name in ("model.layers.0.linear_attn.A_log", "model.norm.weight", "lm_head.weight"):
        assert torch.equal(ckpt.source.get(name), plain.source.get(name))
    assert not any(n.startswith(("model.visual.", "mtp.")) for n in ckpt.source.names())

"""The worker's steps in the project's venv that build what every system starts from: the
Hugging Face folder from the GGUF, its off-grid variant, a random folder of a full-size shape,
and the F32 GGUFs llama.cpp quantizes. Each imports what it needs when it runs."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.peers.harness import write_result


def add_field(writer, name: str, field, value) -> None:
    """A GGUF metadata field written as ``value``, with the type (and array item type) it was
    read with."""
    import gguf

    vtype = field.types[0]
    sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
    writer.add_key_value(name, value, vtype, sub_type=sub)


def hf_convert(args) -> None:
    """The GGUF file -> a Hugging Face folder (fp32 safetensors + tokenizer files)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(args.gguf)
    out = Path(args.out)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32)
    # transformers 5 refuses to save a model loaded from GGUF while its quantizer bookkeeping
    # is attached; the weights are already dequantized to fp32.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    write_result(args.result, {"hf_folder": str(out)})


# Full-size shapes with random weights (--shape): a Qwen3 config each, the released model's
# numbers. Qwen3-1.7B: hidden 2048, 28 layers, 16 query / 8 KV heads of 128, FFN 6144, vocab
# 151,936, tied embeddings, bf16 as released.
SHAPES = {
    "qwen3-1.7b": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=6144,
                       vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0,
                       rms_norm_eps=1e-6, max_position_embeddings=40960),
}


def random_hf(args) -> None:
    """A Hugging Face folder of a Qwen3 of ``--shape`` with transformers' own random
    initialization (normal, std 0.02; norms 1), seeded, saved in bf16, with the tokenizer files
    of ``--src`` (SmolLM2's: its ids are all below the shape's vocabulary, so the same prompt ids
    serve every system)."""
    import shutil

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    src, out = Path(args.src), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gen = json.loads((src / "generation_config.json").read_text()) \
        if (src / "generation_config.json").is_file() else {}
    cfg = Qwen3Config(**SHAPES[args.shape], bos_token_id=gen.get("bos_token_id"),
                      eos_token_id=gen.get("eos_token_id"))
    torch.manual_seed(int(args.seed))
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
    model.save_pretrained(out)
    for f in src.iterdir():  # the tokenizer's files and its chat template, not the model's
        if f.is_file() and not f.name.startswith(".") and f.suffix != ".safetensors" \
                and f.name not in ("config.json", "generation_config.json",
                                   "model.safetensors.index.json"):
            shutil.copy2(f, out / f.name)
    params = sum(t.numel() for t in model.parameters())
    write_result(args.result, {"hf_folder": str(out), "parameters": params})


def hf_gguf(args) -> None:
    """A Qwen3 Hugging Face folder -> an F32 GGUF for llama.cpp (its ``qwen3`` architecture), the
    tensors renamed by gguf-py's own name map, no permutation (llama.cpp's Qwen3 is NeoX RoPE, as
    its converter writes it), tied embeddings as token_embd only; the vocabulary is
    ``--vocab-gguf``'s (SmolLM2's tokenizer) padded with unused tokens to the config's size, as
    llama.cpp's converter pads a tokenizer smaller than the embedding. Written streaming."""
    import gguf
    import numpy as np
    from safetensors import safe_open

    src, out = Path(args.src), Path(args.out)
    cfg = json.loads((src / "config.json").read_text())
    n = cfg["num_hidden_layers"]
    arch = gguf.MODEL_ARCH.QWEN3
    names = gguf.get_tensor_name_map(arch, n)
    tmp = out.with_name(out.name + ".partial")
    writer = gguf.GGUFWriter(str(tmp), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name(f"random {args.shape or 'qwen3'}")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(n)
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_key_length(cfg["head_dim"])
    writer.add_value_length(cfg["head_dim"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    # (transformers 5 writes the base under rope_parameters)
    writer.add_rope_freq_base(cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"])
    vocab = cfg["vocab_size"]
    reader = gguf.GGUFReader(args.vocab_gguf)
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        if key == "tokenizer.ggml.tokens":
            if len(value) > vocab:
                raise SystemExit(f"{args.vocab_gguf}: {len(value)} tokens, more than the "
                                 f"{vocab} rows of {src / 'config.json'}'s vocab_size")
            value = value + [f"[PAD{i}]" for i in range(len(value), vocab)]
        elif key == "tokenizer.ggml.token_type":
            value = value + [int(gguf.TokenType.UNUSED)] * (vocab - len(value))
        elif key == "tokenizer.ggml.scores":
            value = value + [0.0] * (vocab - len(value))
        add_field(writer, key, field, value)
    index = src / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) \
        if index.is_file() else ["model.safetensors"]
    handles = [safe_open(str(src / name), framework="pt") for name in files]
    tensors = []
    for h in handles:
        for key in h.keys():
            if key == "lm_head.weight" and cfg.get("tie_word_embeddings"):
                continue
            name = names.get_name(key, try_suffixes=(".weight", ".bias"))
            if name is None:
                raise SystemExit(f"{src}: no GGUF name for tensor {key}")
            shape = tuple(h.get_slice(key).get_shape())
            tensors.append((h, key))
            writer.add_tensor_info(name, shape, np.dtype(np.float32),
                                   int(np.prod(shape, dtype=np.int64)) * 4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for h, key in tensors:
        writer.write_tensor_data(h.get_tensor(key).float().numpy())
    writer.close()
    tmp.rename(out)
    write_result(args.result, {"gguf": str(out), "tensors": len(tensors)})


# The projections of a Llama-style checkpoint that a Q4_1 GGUF stores in 4 bits.
OFF_GRID_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj")


def off_grid(args) -> None:
    """A Hugging Face folder whose 4-bit projections are moved off their Q4_1 grid, like a float
    checkpoint: each weight gets Gaussian noise of ``--noise`` times its block's Q4_1 step
    (block max - min over 15, blocks of 32 along the input dimension), seeded. Other tensors
    (norms, the Q8_0 embedding) are copied unchanged."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    src, out = Path(args.src), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and not f.name.startswith("."):
            shutil.copy2(f, out / f.name)
    g = torch.Generator().manual_seed(int(args.seed))
    moved = 0
    for f in sorted(src.glob("*.safetensors")):
        tensors = load_file(f)
        for name in sorted(tensors):
            w = tensors[name]
            if name.split(".")[-2] not in OFF_GRID_PROJECTIONS or w.shape[-1] % 32:
                continue
            blocks = w.float().reshape(w.shape[0], -1, 32)
            step = (blocks.amax(-1) - blocks.amin(-1)) / 15
            noise = torch.randn(blocks.shape, generator=g) * float(args.noise) * step[..., None]
            tensors[name] = (blocks + noise).reshape(w.shape).to(w.dtype).contiguous()
            moved += 1
        save_file(tensors, out / f.name, metadata={"format": "pt"})
    write_result(args.result, {"hf_folder": str(out), "moved_tensors": moved,
                               "noise": float(args.noise), "seed": int(args.seed)})



def f32_gguf(args) -> None:
    """A GGUF with the source's metadata and every tensor dequantized to F32."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(args.src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(args.out, arch)
    skip = {"general.architecture", "general.file_type", "general.quantization_version"}
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in skip:
            continue
        add_field(writer, name, field, field.contents())
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(d) for d in reversed(t.shape.tolist())]  # GGML order -> numpy order
        writer.add_tensor(t.name, data.reshape(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    write_result(args.result, {"gguf": args.out, "tensors": len(reader.tensors)})

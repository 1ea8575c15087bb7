"""Lazy tensor sources: checkpoints read one tensor at a time, under Hugging Face names and layouts.

A source never materialises the whole model: ``get(name)`` reads (and dequantizes) one tensor.
Sources: a Hugging Face folder of safetensors (single or sharded), a GGUF file, or seeded random
weights of any config. Pickle-based checkpoints (.bin, .pt) are refused, never loaded.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from llm_onnx.model.config import ModelConfig
from llm_onnx.model.shapes import Shape, checkpoint_shapes
from llm_onnx.errors import CheckpointError


class TensorSource(Protocol):
    """Tensors under Hugging Face names and layouts; ``describe`` names the file for errors."""

    def names(self) -> list[str]: ...

    def shape(self, name: str) -> Shape: ...

    def get(self, name: str) -> torch.Tensor: ...

    def describe(self, name: str) -> str: ...


# ----------------------------------------------------------------------------- safetensors


class SafetensorsSource:
    """A Hugging Face checkpoint folder: model.safetensors or model.safetensors.index.json shards."""

    def __init__(self, folder: Path) -> None:
        from safetensors import safe_open

        self.folder = Path(folder)
        index = self.folder / "model.safetensors.index.json"
        single = self.folder / "model.safetensors"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (KeyError, ValueError, UnicodeDecodeError) as e:
                raise CheckpointError(f"{index}: not a valid safetensors index ({e}).") from e
            files = {name: self.folder / fname for name, fname in weight_map.items()}
        elif single.is_file():
            files = None
        else:
            pickles = sorted(p.name for p in self.folder.glob("*.bin")) + sorted(
                p.name for p in self.folder.glob("*.pt"))
            hint = (f" It has {', '.join(pickles[:3])}: pickle checkpoints are never loaded; "
                    "convert them to safetensors first." if pickles else "")
            raise CheckpointError(f"{self.folder}: no model.safetensors or "
                                  f"model.safetensors.index.json.{hint}")
        self._handles: dict[Path, object] = {}
        self._file_of: dict[str, Path] = {}
        shard_files = sorted(set(files.values())) if files is not None else [single]
        for path in shard_files:
            if not path.is_file():
                raise CheckpointError(f"{path}: shard listed in model.safetensors.index.json is missing.")
            try:
                handle = safe_open(str(path), framework="pt")
            except Exception as e:  # safetensors raises its own error types for bad headers
                raise CheckpointError(f"{path}: not a readable safetensors file "
                                      f"(truncated or corrupt: {e}).") from e
            self._handles[path] = handle
            for name in handle.keys():
                self._file_of[name] = path
        if files is not None:
            missing = sorted(n for n, p in files.items() if self._file_of.get(n) != p)
            if missing:
                raise CheckpointError(f"{files[missing[0]]}: lacks tensor {missing[0]} that the "
                                      "index lists.")
        self._shapes: dict[str, Shape] = {}
        for name, path in self._file_of.items():
            self._shapes[name] = tuple(self._handles[path].get_slice(name).get_shape())
        self._check_sizes()

    def _check_sizes(self) -> None:
        """A truncated file can have an intact header: compare data extents with the file size."""
        for path in self._handles:
            with open(path, "rb") as f:
                header_len = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(header_len))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
                      default=0)
            size = path.stat().st_size
            if 8 + header_len + end > size:
                raise CheckpointError(f"{path}: truncated: the header describes "
                                      f"{8 + header_len + end} bytes but the file has {size}.")

    def names(self) -> list[str]:
        return list(self._file_of)

    def shape(self, name: str) -> Shape:
        return self._shapes[name]

    def get(self, name: str) -> torch.Tensor:
        path = self._file_of[name]
        try:
            return self._handles[path].get_tensor(name)  # type: ignore[attr-defined]
        except Exception as e:
            raise CheckpointError(f"{path}: cannot read tensor {name} ({e}).") from e

    def describe(self, name: str) -> str:
        return str(self._file_of.get(name, self.folder))


# ----------------------------------------------------------------------------- random


class RandomSource:
    """Seeded random weights for any config: the same (config, seed, name) always gives the same
    tensor, independent of the order tensors are read in. Matrices ~ N(0, 0.02); norms 1.

    Tensors come in ``dtype`` (bfloat16 by default, like released checkpoints), generated in row
    chunks so a 2.5 GB embedding never exists in fp32.
    """

    def __init__(self, cfg: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> None:
        self.cfg, self.seed, self.dtype = cfg, seed, dtype
        self._shapes = checkpoint_shapes(cfg)

    def names(self) -> list[str]:
        return list(self._shapes)

    def shape(self, name: str) -> Shape:
        return self._shapes[name]

    def get(self, name: str) -> torch.Tensor:
        shape = self._shapes[name]
        if "norm" in name.rsplit(".", 2)[-2] and name.endswith(".weight"):
            return torch.ones(shape, dtype=self.dtype)
        if name.endswith(".bias"):
            return torch.zeros(shape, dtype=self.dtype)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(name.encode()))
        out = torch.empty(shape, dtype=self.dtype)
        rows = max(1, (1 << 24) // max(1, out[0].numel()))
        for r in range(0, shape[0], rows):
            chunk = out[r:r + rows]
            chunk.copy_(torch.randn(chunk.shape, generator=gen) * 0.02)
        return out

    def describe(self, name: str) -> str:
        return f"random weights (seed {self.seed})"


# ----------------------------------------------------------------------------- GGUF


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's convert_hf_to_gguf permutation of Llama q/k rows (interleaved -> halves)."""
    out_dim = w.shape[0]
    return (w.reshape(n_head, out_dim // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


# GGUF tensor name (per layer suffix) -> Hugging Face name
_GGUF_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
}
_GGUF_EXPERTS = {"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj",
                 "ffn_down_exps.weight": "down_proj"}
_GGUF_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight",
                "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
                      "qwen3moe": "Qwen3MoeForCausalLM"}
# A header may claim any size; cap what we believe before allocating anything from it.
MAX_GGUF_ELEMENTS = 1 << 40


def open_gguf(path: Path):  # -> gguf.GGUFReader
    """Parse a GGUF file's header, with CheckpointError for anything unreadable."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such GGUF file.")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise CheckpointError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF').")
    try:
        reader = gguf.GGUFReader(str(path), "r")
    except Exception as e:  # the reader raises ValueError/IndexError/OverflowError on bad data
        raise CheckpointError(f"{path}: corrupt or truncated GGUF file ({type(e).__name__}: {e}).") from e
    size = path.stat().st_size
    for t in reader.tensors:
        if t.n_elements > MAX_GGUF_ELEMENTS or t.data_offset + t.n_bytes > size:
            raise CheckpointError(f"{path}: tensor {t.name} claims {t.n_elements} elements at offset "
                                  f"{t.data_offset}, beyond the file's {size} bytes (truncated or corrupt).")
    return reader


def gguf_field(reader, key: str, default=None):
    """A scalar, string or array metadata value of a GGUF file. float32 scalars come back as the
    shortest decimal that round-trips (1e-05, not 9.999999747378752e-06), as config.json has them."""
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    if isinstance(value, float) and len(field.types) == 1 and field.types[0].name == "FLOAT32":
        value = float(str(np.float32(value)))
    return value


def gguf_config(reader, path: Path) -> ModelConfig:
    """ModelConfig from GGUF metadata (llama, qwen3, qwen3moe architectures)."""
    from llm_onnx.model.config import MoEConfig

    arch = gguf_field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise CheckpointError(f"{path}: GGUF architecture {arch!r} (general.architecture) is not "
                              f"supported; supported: {', '.join(GGUF_ARCHITECTURES)}.")

    def need(key: str):
        value = gguf_field(reader, f"{arch}.{key}")
        if value is None:
            raise CheckpointError(f"{path}: GGUF metadata lacks {arch}.{key}.")
        return value

    names = {t.name for t in reader.tensors}
    tokens = gguf_field(reader, "tokenizer.ggml.tokens")
    vocab = gguf_field(reader, f"{arch}.vocab_size") or (len(tokens) if tokens else None)
    if vocab is None:
        raise CheckpointError(f"{path}: GGUF metadata lacks {arch}.vocab_size and tokenizer.ggml.tokens.")
    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = gguf_field(reader, f"{arch}.attention.key_length") or hidden // heads
    moe = None
    if arch == "qwen3moe":
        moe = MoEConfig(num_experts=int(need("expert_count")),
                        num_experts_per_tok=int(need("expert_used_count")),
                        moe_intermediate_size=int(need("expert_feed_forward_length")),
                        norm_topk_prob=True)
    return ModelConfig(
        architecture=GGUF_ARCHITECTURES[arch],
        vocab_size=int(vocab), hidden_size=hidden, num_hidden_layers=int(need("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(gguf_field(reader, f"{arch}.attention.head_count_kv") or heads),
        head_dim=int(head_dim),
        intermediate_size=int(gguf_field(reader, f"{arch}.feed_forward_length") or 1),
        max_position_embeddings=int(need("context_length")),
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        rope_theta=float(gguf_field(reader, f"{arch}.rope.freq_base") or 10_000.0),
        tie_word_embeddings="output.weight" not in names,
        qk_norm=arch in ("qwen3", "qwen3moe"),
        moe=moe,
    )


class GGUFSource:
    """Tensors of a GGUF file, dequantized to fp32 and renamed/un-permuted to Hugging Face's form."""

    def __init__(self, path: Path, reader=None) -> None:
        self.path = Path(path)
        self.reader = reader if reader is not None else open_gguf(self.path)
        self.arch = gguf_field(self.reader, "general.architecture")
        self.cfg = gguf_config(self.reader, self.path)
        self._tensors = {t.name: t for t in self.reader.tensors}
        self._map: dict[str, tuple[str, int | None]] = {}  # hf name -> (gguf name, expert index)
        self._last: tuple[str, np.ndarray] | None = None  # stacked experts are read E times
        for gname, t in self._tensors.items():
            if gname in _GGUF_GLOBAL:
                self._map[_GGUF_GLOBAL[gname]] = (gname, None)
                continue
            parts = gname.split(".", 2)
            if parts[0] != "blk" or len(parts) < 3:
                continue  # e.g. rope_freqs.weight: derived from metadata instead
            prefix = f"model.layers.{parts[1]}"
            if parts[2] in _GGUF_LAYER:
                self._map[f"{prefix}.{_GGUF_LAYER[parts[2]]}"] = (gname, None)
            elif parts[2] in _GGUF_EXPERTS:
                for e in range(int(t.shape[-1])):
                    self._map[f"{prefix}.mlp.experts.{e}.{_GGUF_EXPERTS[parts[2]]}.weight"] = (gname, e)

    def names(self) -> list[str]:
        return list(self._map)

    def shape(self, name: str) -> Shape:
        gname, expert = self._map[name]
        shape = tuple(int(d) for d in reversed(self._tensors[gname].shape))
        return shape[1:] if expert is not None else shape

    def _dequantize(self, gname: str) -> np.ndarray:
        import gguf

        if self._last is not None and self._last[0] == gname:
            return self._last[1]
        t = self._tensors[gname]
        shape = tuple(int(d) for d in reversed(t.shape))
        try:
            data = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise CheckpointError(f"{self.path}: tensor {gname} has GGUF type {t.tensor_type.name}, "
                                  "which cannot be dequantized here.") from e
        arr = np.asarray(data, dtype=np.float32).reshape(shape)
        self._last = (gname, arr) if len(shape) == 3 else None
        return arr

    def get(self, name: str) -> torch.Tensor:
        gname, expert = self._map[name]
        arr = self._dequantize(gname)
        w = torch.from_numpy(np.array(arr[expert] if expert is not None else arr))
        if self.arch == "llama" and gname.endswith(("attn_q.weight", "attn_k.weight")):
            heads = (self.cfg.num_attention_heads if gname.endswith("attn_q.weight")
                     else self.cfg.num_key_value_heads)
            w = _unpermute(w, heads)
        return w.contiguous()

    def describe(self, name: str) -> str:
        gname = self._map.get(name, (name, None))[0]
        return f"{self.path} (tensor {gname})"

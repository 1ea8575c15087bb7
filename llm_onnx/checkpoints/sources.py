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

from llm_onnx.errors import CheckpointError
from llm_onnx.families import GGUF_ARCHITECTURES, REGISTRY, Family
from llm_onnx.modeling.config import ModelConfig
from llm_onnx.modeling.shapes import Shape, checkpoint_shapes


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


# Tensors that scale as a norm weight does (Gemma 4: a layer's output, the router's input and
# each expert's weight): random weights give them 1, not N(0, 0.02) (30 layer scalars of 0.02
# would shrink the residual stream below float32's range).
SCALES_OF_ONE = (".layer_scalar", ".router.scale", ".router.per_expert_scale")


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
        if name.endswith(SCALES_OF_ONE):  # Gemma 4's multiplying scales, as norms: 1
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


class GGUFMeta:
    """A GGUF file's metadata for its family's ``config_fields``: keys without the ``<arch>.``
    prefix; errors name the file and the key."""

    def __init__(self, reader, path: Path, arch: str) -> None:
        self.reader, self.path, self.arch = reader, path, arch
        self.tensor_names = {t.name for t in reader.tensors}

    def get(self, key: str, default=None):
        return gguf_field(self.reader, f"{self.arch}.{key}", default)

    def need(self, key: str):
        value = self.get(key)
        if value is None:
            raise CheckpointError(f"{self.path}: GGUF metadata lacks {self.arch}.{key}.")
        return value

    def floats(self, tensor: str) -> list[float] | None:
        """A small float tensor's values (llama.cpp stores e.g. LongRoPE factors as tensors), as
        the shortest decimals their float32 values round-trip to; None if the file lacks it."""
        t = next((t for t in self.reader.tensors if t.name == tensor), None)
        if t is None:
            return None
        return [float(str(np.float32(v))) for v in np.asarray(t.data, dtype=np.float32).ravel()]

    def vocab_size(self) -> int:
        tokens = gguf_field(self.reader, "tokenizer.ggml.tokens")
        vocab = self.get("vocab_size") or (len(tokens) if tokens else None)
        if vocab is None:
            raise CheckpointError(f"{self.path}: GGUF metadata lacks {self.arch}.vocab_size and "
                                  "tokenizer.ggml.tokens.")
        return int(vocab)


def gguf_family(reader, path: Path) -> Family:
    """The family of a GGUF file (general.architecture), which must declare GGUF names."""
    arch = gguf_field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise CheckpointError(f"{path}: GGUF architecture {arch!r} (general.architecture) is not "
                              f"supported; supported: {', '.join(GGUF_ARCHITECTURES)}.")
    return REGISTRY[GGUF_ARCHITECTURES[arch]]


def gguf_config(reader, path: Path) -> ModelConfig:
    """ModelConfig from GGUF metadata, by the file's family."""
    fam = gguf_family(reader, path)
    assert fam.gguf is not None
    fields = fam.gguf.config_fields(GGUFMeta(reader, path, fam.gguf.arch))
    return ModelConfig.from_fields(dict(fields, architecture=fam.architecture))


class GGUFSource:
    """Tensors of a GGUF file, dequantized to fp32 and renamed/un-permuted to Hugging Face's form."""

    def __init__(self, path: Path, reader=None) -> None:
        self.path = Path(path)
        self.reader = reader if reader is not None else open_gguf(self.path)
        fam = gguf_family(self.reader, self.path)
        assert fam.gguf is not None
        self.names_table = names = fam.gguf
        self.cfg = gguf_config(self.reader, self.path)
        self._tensors = {t.name: t for t in self.reader.tensors}
        self._map: dict[str, tuple[str, int | None]] = {}  # hf name -> (gguf name, expert index)
        self._joined: dict[str, tuple[list[str], int]] = {}  # hf name -> (gguf parts, axis)
        self._last: tuple[str, np.ndarray] | None = None  # stacked experts are read E times
        # llama.cpp appends a model's multi-token-prediction layers as blocks after its own
        mtp = int(gguf_field(self.reader, f"{names.arch}.nextn_predict_layers") or 0) > 0
        for gname, t in self._tensors.items():
            if gname in names.globals:
                self._map[names.globals[gname]] = (gname, None)
                continue
            parts = gname.split(".", 2)
            if parts[0] != "blk" or len(parts) < 3:
                continue  # e.g. rope_freqs.weight: derived from metadata instead
            if mtp and int(parts[1]) >= self.cfg.num_hidden_layers:
                continue  # multi-token-prediction layers after the model's own (not run)
            prefix = f"model.layers.{parts[1]}"
            if parts[2] in names.layer:
                self._map[f"{prefix}.{names.layer[parts[2]]}"] = (gname, None)
            elif parts[2] in names.experts:
                target = names.experts[parts[2]]  # "gate_proj" (a weight) or "gate_proj.bias"
                if not target.endswith((".weight", ".bias")):
                    target += ".weight"
                for e in range(int(t.shape[-1])):
                    self._map[f"{prefix}.mlp.experts.{e}.{target}"] = (gname, e)
        for block in range(self.cfg.num_hidden_layers):
            for canonical, (suffixes, axis) in names.joined.items():
                parts = [f"blk.{block}.{suffix}" for suffix in suffixes]
                name = f"model.layers.{block}.{canonical}"
                if name not in self._map and all(p in self._tensors for p in parts):
                    self._joined[name] = (parts, axis)
        self._refuse_unread_scales(mtp)

    def _refuse_unread_scales(self, mtp: bool) -> None:
        """A layer's ``.scale`` tensor this reader does not take: llama.cpp multiplies such a
        tensor into a projection's output (Gemma 4's per-expert scales), so a model read without
        it would run, and be wrong."""
        read = {gname for gname, _ in self._map.values()}
        for parts, _ in self._joined.values():
            read.update(parts)
            read.update(p.removesuffix(".weight") + ".scale" for p in parts)  # folded (_scaled)
        unread = [g for g in self._tensors if g.startswith("blk.") and g.endswith(".scale")
                  and g not in read
                  and not (mtp and int(g.split(".")[1]) >= self.cfg.num_hidden_layers)]
        if unread:
            raise CheckpointError(
                f"{self.path}: {len(unread)} scale tensor(s) this reader does not know for "
                f"{self.names_table.arch}, e.g. {', '.join(unread[:3])}. llama.cpp multiplies "
                "such a tensor into a projection's output, so the model cannot be read without "
                "it. Convert the model from its Hugging Face checkpoint instead, or report the "
                "file's tensor names.")

    def names(self) -> list[str]:
        return list(self._map) + list(self._joined)

    def storage_type(self) -> str | None:
        """The GGUF type most of the layers' projections are stored in (e.g. "Q4_1")."""
        counts: dict[str, int] = {}
        for t in self.reader.tensors:
            if t.name.startswith("blk.") and len(t.shape) >= 2:
                counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        return max(counts, key=counts.get) if counts else None

    def shape(self, name: str) -> Shape:
        if name in self._joined:
            parts, axis = self._joined[name]
            shapes = [self._shape(p) for p in parts]
            return shapes[0][:axis] + (sum(s[axis] for s in shapes),) + shapes[0][axis + 1:]
        gname, expert = self._map[name]
        shape = self._shape(gname)
        return shape[1:] if expert is not None else shape

    def _shape(self, gname: str) -> Shape:
        shape = tuple(int(d) for d in reversed(self._tensors[gname].shape))
        if self.names_table.relayout is not None:  # a re-layout may change the shape
            meta = torch.empty(shape, device="meta")
            shape = tuple(self.names_table.relayout(gname, meta, self.cfg).shape)
        return shape

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
        if name in self._joined:
            parts, axis = self._joined[name]
            return torch.cat([self._scaled(p) for p in parts], dim=axis).contiguous()
        gname, expert = self._map[name]
        return self._tensor(gname, expert)

    def _scaled(self, gname: str) -> torch.Tensor:
        """A stacked part (E, ...) with its per-expert ``.scale`` (E,), if any, folded in."""
        w = self._tensor(gname, None)
        scale = gname.removesuffix(".weight") + ".scale"
        if scale in self._tensors:
            s = torch.from_numpy(np.array(self._dequantize(scale))).reshape(-1)
            if s.shape[0] != w.shape[0]:
                raise CheckpointError(f"{self.path}: tensor {scale} has {s.shape[0]} values, "
                                      f"not one for each of {gname}'s {w.shape[0]} experts.")
            w = w * s.view(-1, *[1] * (w.dim() - 1))
        return w

    def _tensor(self, gname: str, expert: int | None) -> torch.Tensor:
        arr = self._dequantize(gname)
        w = torch.from_numpy(np.array(arr[expert] if expert is not None else arr))
        if self.names_table.unpermute_qk and gname.endswith(("attn_q.weight", "attn_k.weight")):
            heads = (self.cfg.num_attention_heads if gname.endswith("attn_q.weight")
                     else self.cfg.num_key_value_heads)
            w = _unpermute(w, heads)
        table = self.names_table
        if table.relayout is not None:
            w = table.relayout(gname, w, self.cfg)
        if table.norm_shift and gname.endswith("norm.weight") \
                and not gname.endswith(table.norm_shift_skip):
            w = w - table.norm_shift
        return w.contiguous()

    def describe(self, name: str) -> str:
        if name in self._joined:
            return f"{self.path} (tensors {' and '.join(self._joined[name][0])})"
        gname = self._map.get(name, (name, None))[0]
        return f"{self.path} (tensor {gname})"


def check_shapes(source: TensorSource, expected: dict[str, tuple[int, ...]]) -> None:
    """CheckpointError naming the first tensor of ``expected`` (name -> shape) whose shape in
    ``source`` differs."""
    for name, shape in expected.items():
        got = tuple(source.shape(name))
        if got != tuple(shape):
            raise CheckpointError(f"{source.describe(name)}: tensor {name} has shape {list(got)}, "
                                  f"expected {list(shape)} for this config.")

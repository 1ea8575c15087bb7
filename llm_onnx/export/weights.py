"""Stream weights from a checkpoint into one external-data file shared by both graphs.

Each tensor is read from the checkpoint, cast or quantized, and appended to ``weights.data``; large
tensors are processed in row chunks, so peak memory is about one checkpoint tensor. Identical
tensors (a tied embedding quantized for both GatherBlockQuantized and MatMulNBits) are stored once
and referenced twice.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from llm_onnx.checkpoints.sources import TensorSource
from llm_onnx.errors import ExportError
from llm_onnx.export import quant
from llm_onnx.export.folder import HeapTrim
from llm_onnx.modeling.decoder import Decoder
from llm_onnx.modeling.mlp import Experts

ALIGN = 64  # bytes; every tensor starts on a 64-byte boundary
CHUNK_ELEMENTS = 1 << 24  # rows per chunk are chosen so a chunk holds about this many elements


@dataclass(frozen=True)
class StoredTensor:
    offset: int
    length: int
    shape: tuple[int, ...]
    dtype: np.dtype


class WeightFile:
    """Append-only external-data file with content de-duplication."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._f = open(self.path, "wb")
        self.offset = 0
        self._seen: dict[tuple[bytes, int], StoredTensor] = {}
        self.tensors: dict[str, StoredTensor] = {}
        self._sha = hashlib.sha256()  # of the file as written: the manifest needs no re-read
        self.sha256: str | None = None

    def write(self, name: str, chunks: Iterator[np.ndarray], shape: tuple[int, ...],
              dtype: np.dtype) -> StoredTensor:
        sha_before = self._sha.copy()  # restored if this tensor turns out to be a duplicate
        pad = (-self.offset) % ALIGN
        if pad:
            self._f.write(b"\0" * pad)
            self._sha.update(b"\0" * pad)
            self.offset += pad
        start = self.offset
        digest = hashlib.blake2b(digest_size=20)
        for chunk in chunks:
            data = np.ascontiguousarray(chunk, dtype=dtype)
            view = memoryview(data).cast("B")
            digest.update(view)
            self._sha.update(view)
            try:
                self._f.write(view)
            except OSError as e:
                raise ExportError(f"{self.path}: cannot write weights ({e.strerror or e}); "
                                  "is the disk full?") from e
            self.offset += len(view)
        length = self.offset - start
        expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if length != expected:
            raise AssertionError(f"{name}: wrote {length} bytes, expected {expected}")
        key = (digest.digest(), length)
        stored = self._seen.get(key)
        if stored is not None:  # same bytes already stored (maybe another shape): drop this copy
            self._f.seek(start - pad)
            self._f.truncate()
            self.offset = start - pad
            self._sha = sha_before
            stored = StoredTensor(stored.offset, length, tuple(shape), np.dtype(dtype))
        else:
            stored = StoredTensor(start, length, tuple(shape), np.dtype(dtype))
            self._seen[key] = stored
        self.tensors[name] = stored
        return stored

    def close(self) -> None:
        self.sha256 = self._sha.hexdigest()
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()


def np_dtype(dtype: torch.dtype) -> np.dtype:
    return {torch.float32: np.dtype(np.float32), torch.float16: np.dtype(np.float16),
            torch.uint8: np.dtype(np.uint8)}[dtype]


def _rows(t: Tensor) -> int:
    per_row = max(1, t[0].numel()) if t.dim() > 0 and t.shape[0] else 1
    return max(1, CHUNK_ELEMENTS // per_row)


def _cast_chunks(t: Tensor, dtype: torch.dtype) -> Iterator[np.ndarray]:
    if t.dim() == 0:
        yield t.to(dtype).numpy()
        return
    step = _rows(t)
    for r in range(0, t.shape[0], step):
        yield t[r:r + step].to(dtype).numpy()


def write_cast(wf: WeightFile, name: str, t: Tensor, dtype: torch.dtype) -> None:
    wf.write(name, _cast_chunks(t, dtype), tuple(t.shape), np_dtype(dtype))


def write_quantized(wf: WeightFile, prefix: str, w: Tensor, bits: int, block_size: int,
                     scale_dtype: torch.dtype, search: bool, scheme: str, flat: bool,
                     importance: Tensor | None = None) -> None:
    """qweight streamed in row chunks (quantization is row-local); scales, zero points and block
    minimums collected, then written."""
    n, k = w.shape
    k_blocks = -(-k // block_size)
    blob = block_size * bits // 8
    scales: list[Tensor] = []
    zero_points: list[Tensor] = []
    minimums: list[Tensor] = []

    def chunks() -> Iterator[np.ndarray]:
        step = _rows(w)
        for r in range(0, n, step):
            if scheme == "offset":
                q, s, z, lo = quant.quantize_offset(w[r:r + step], bits, block_size)
                minimums.append(lo)
            else:
                q, s, z = quant.quantize(w[r:r + step], bits, block_size,
                                         asymmetric=scheme == "zero_point", search=search,
                                         importance=importance)
            scales.append(s)
            if z is not None:
                zero_points.append(z)
            yield q.numpy()

    shape = (n, k_blocks * blob) if flat else (n, k_blocks, blob)
    wf.write(f"{prefix}.qweight", chunks(), shape, np.dtype(np.uint8))
    write_cast(wf, f"{prefix}.scales", torch.cat(scales), scale_dtype)
    if zero_points:
        write_cast(wf, f"{prefix}.zero_points", torch.cat(zero_points), torch.uint8)
    if minimums:
        write_cast(wf, f"{prefix}.minimums_t", torch.cat(minimums).t(), scale_dtype)
        write_cast(wf, f"{prefix}.block_ones", quant.block_ones(k, block_size), scale_dtype)


# Scales the experts' block search tries, as factors of the round-to-nearest scale: 3 where the
# dense search tries 22 (quant.SEARCH_FACTORS). On tiny Qwen3-MoE models (4 and 16 experts,
# with and without loud hidden channels, torch, experts alone quantized) these 3 came within 5%
# of the 22's KL in all 8 draws (+0.6% on average); the refit alone (1.0) got 55-80% of the
# gain. The experts are 95% of Qwen3-30B-A3B's weights: each candidate costs minutes there.
EXPERT_FACTORS = torch.tensor([0.80, 0.90, 1.00])
# Experts decoded from MXFP4 (gpt-oss): also 2/3 and 4/3, which land on MXFP4's own grids (a
# block whose largest value is 6 units has a round-to-nearest scale of 0.75 units; 0.5 and 1
# unit represent every e2m1 value up to 3, or every whole one, exactly). Measured on a small
# gpt-oss with MXFP4 experts (benchmarks/gpt_oss_experts.py experts, 3 seeds): experts-only KL
# 31-44% below the 3 factors' and below block 16's; adding 1/2 and 2 gained nothing.
MXFP4_EXPERT_FACTORS = torch.tensor([2 / 3, 0.80, 0.90, 1.00, 4 / 3])
# Zero-point experts: 9 candidate scales instead of the dense search's 21, half the time an
# expert (Qwen3-30B-A3B's shape, one thread: 179 against 359 ms; symmetric 91), the same KL on
# benchmarks/moe_fidelity.py (every zero-point search at 9: 0.2023 against 0.2046 at 21; at 5:
# 0.2138)
EXPERT_ZP_STEPS = 8


def write_experts_quantized(wf: WeightFile, prefix: str, module: nn.Module,
                            produce: Produce) -> None:
    """QMoE's tensors of one layer, an expert at a time from the checkpoint (``produce.experts``):
    the stacked experts never exist in memory. ``module.search``: block scales (and zero points,
    with ``module.zero_points``) searched, weighted by each expert's row of
    ``module.importance[part]`` when the calibration gave one, over MXFP4_EXPERT_FACTORS when
    the checkpoint's experts are MXFP4 (symmetric)."""
    from llm_onnx.checkpoints.mxfp4 import reads_mxfp4

    factors = MXFP4_EXPERT_FACTORS if reads_mxfp4(produce.source) else EXPERT_FACTORS
    for part in ("gate_up", "down"):
        qweight = getattr(module, f"{part}_qweight")  # (E, rows, K * bits / 8)
        scales: list[Tensor] = []
        zero_points: list[Tensor] = []
        importance = (module.importance or {}).get(part) if module.search else None

        def chunks(part: str = part, scales: list[Tensor] = scales,
                   zero_points: list[Tensor] = zero_points,
                   importance: Tensor | None = importance) -> Iterator[np.ndarray]:
            for e, w in enumerate(produce.experts(f"{prefix}.{part}_proj")):  # (rows, K)
                q, s, zp = quant.quantize(w, module.bits, module.block_size,
                                          asymmetric=module.zero_points, search=module.search,
                                          importance=None if importance is None else importance[e],
                                          factors=factors, zp_steps=EXPERT_ZP_STEPS)
                scales.append(s)
                if zp is not None:
                    zero_points.append(zp)
                yield q.reshape(q.shape[0], -1).numpy()

        wf.write(f"{prefix}.{part}_qweight", chunks(), tuple(qweight.shape), np.dtype(np.uint8))
        dtype = getattr(module, f"{part}_scales").dtype
        write_cast(wf, f"{prefix}.{part}_scales", torch.stack(scales), dtype)
        if module.zero_points:
            wf.write(f"{prefix}.{part}_zero_points", [torch.stack(zero_points).numpy()],
                     tuple(getattr(module, f"{part}_zero_points").shape), np.dtype(np.uint8))


class Produce:
    """Each parameter of the export-form model built from the checkpoint by name, through the
    plan's producers (ExportPlan.write_producers): ``produce(name)`` the whole tensor,
    ``produce.experts(name)`` a layer's stacked experts one expert at a time."""

    def __init__(self, producers: dict[str, Callable[[TensorSource], Tensor]],
                 source: TensorSource) -> None:
        self.producers, self.source = producers, source

    def _producer(self, name: str) -> Callable[[TensorSource], Tensor]:
        if name not in self.producers and name == "lm_head.weight":  # tied head
            name = "model.embed_tokens.weight"
        return self.producers[name]

    def __call__(self, name: str) -> Tensor:
        return self._producer(name)(self.source)

    def experts(self, name: str) -> Iterator[Tensor]:
        """Expert e's (rows, K) tensor for e = 0, 1, ...: built alone where the producer can
        (checkpoint.load.ExpertsProducer), else sliced from the whole."""
        producer = self._producer(name)
        one = getattr(producer, "expert", None)
        if one is None:
            yield from producer(self.source)
            return
        for e in range(producer.num_experts):  # type: ignore[attr-defined]
            yield one(self.source, e)


def write_params(module: nn.Module, prefix: str, produce: Produce, wf: WeightFile,
                 written: dict[int, str]) -> None:
    """A module kept as it is (norms, a float embedding or head, float experts): each of its own
    parameters cast to its dtype. A parameter already written under another name (a tied head)
    is referenced, not stored twice; float experts are written an expert at a time."""
    for attr, p in module.named_parameters(recurse=False):
        name = f"{prefix}{attr}"
        if id(p) in written:
            wf.tensors[name] = wf.tensors[written[id(p)]]
            continue
        written[id(p)] = name
        if isinstance(module, Experts):
            chunks = (w.to(p.dtype).numpy() for w in produce.experts(name))
            wf.write(name, chunks, tuple(p.shape), np_dtype(p.dtype))
        else:
            write_cast(wf, name, produce(name), p.dtype)


def write_weights(model: Decoder, producers: dict[str, Callable[[TensorSource], Tensor]],
                  source: TensorSource, wf: WeightFile,
                  progress: Callable[[int], None] = lambda n: None) -> None:
    """Write every tensor of the export-form ``model`` into ``wf``: a module with
    ``write_tensors`` (the export forms: quantized or transposed projections, the RoPE tables)
    writes its own; any other module with parameters writes them cast (``write_params``).
    ``producers`` build each parameter from checkpoint tensors (ExportPlan.producers)."""

    produce = Produce(producers, source)
    written: dict[int, str] = {}  # id(parameter) -> name it was written under
    trim = HeapTrim(8 << 20)  # 8 MiB written: up to 64 MiB of float weights at int4
    for path, module in model.named_modules():
        prefix = f"{path}." if path else ""
        before = wf.offset
        if hasattr(module, "write_tensors"):
            module.write_tensors(prefix, produce, wf, written)
        elif any(True for _ in module.parameters(recurse=False)):
            write_params(module, prefix, produce, wf, written)
        else:
            continue
        trim(wf.offset - before)  # the float and quantized copies of what was written
        progress(1)

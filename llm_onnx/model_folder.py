"""The model folder contract: what `llm-onnx export` writes and the runtime reads.

A model folder holds prefill.onnx, decode.onnx, weights.data (shared by both graphs), tokenizer
files and manifest.json; an embedding model's folder (``task`` "embed", ``llm-onnx export --task
embed``) holds embed.onnx and weights.data instead. This module types the manifest: frozen
dataclasses with ``to_json`` / ``from_json``, the graphs' input and output names (graph_io,
re-exported here), and the checks the runtime makes before it trusts a folder (format version,
files present, sizes and sha256). The exporter builds a ``Manifest``; everyone else reads its
attributes. Imports neither torch nor onnxruntime.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path

from llm_onnx.errors import ModelFolderError
from llm_onnx.graph_io import (  # noqa: F401 (re-exported: mf.INPUT_IDS, mf.state_names, ...)
    EMBEDDINGS,
    INPUT_IDS,
    LOGITS,
    LOGITS_WINDOW,
    PAST_CONV,
    PAST_KEY,
    PAST_RECURRENT,
    PAST_VALUE,
    PRESENT_CONV,
    PRESENT_KEY,
    PRESENT_RECURRENT,
    PRESENT_VALUE,
    SEQLENS_K,
    SEQUENCE_LENGTHS,
    TOTAL_SEQUENCE_LENGTH,
    VALID_TOKENS,
    input_names,
    output_names,
    state_names,
)
from llm_onnx.modeling.config import ModelConfig
from llm_onnx.typed_json import plain, typed

FORMAT = "llm-onnx-model"
FORMAT_VERSION = 2  # 2: typed sections, the real quantization scheme, special tokens
# 3: only a folder with an int8 KV cache, which an older llm-onnx must refuse (others stay 2)
INT8_CACHE_VERSION = 3
MANIFEST = "manifest.json"
PREFILL, DECODE, WEIGHTS = "prefill.onnx", "decode.onnx", "weights.data"
EMBED = "embed.onnx"
# What a folder's graphs compute: "generate" (next-token logits over a KV cache: prefill.onnx,
# decode.onnx) or "embed" (one pooled vector per text in one run: embed.onnx)
TASKS = ("generate", "embed")
POOLINGS = ("last", "mean", "cls")  # EmbeddingSpec.pooling

# ----------------------------------------------------------------------------- sections

@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output: dims are numbers or symbolic names."""

    name: str
    dtype: str | None
    shape: tuple[int | str, ...]


@dataclass(frozen=True)
class GraphSpec:
    file: str
    logits: str  # "last": each row's last position; "all": every position; "window": the last W,
    # W the length of the input logits_window (default 1: its initializer); "none": embed.onnx
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass(frozen=True)
class ExpertsQuantization:
    """How a mixture of experts' quantized experts are stored and computed (ONNX Runtime's QMoE,
    or Gemma 4's MatMulNBits experts), which can differ from the other projections."""

    block_size: int
    scheme: str  # "zero_point" (a zero point per block) | "symmetric"
    accuracy_level: int  # QMoE: 0 = float activations, 4 = int8 activations


@dataclass(frozen=True)
class Quantization:
    """What a quantized export did to the weights (MatMulNBits, GatherBlockQuantized, QMoE)."""

    bits: int
    block_size: int
    scheme: str  # "zero_point" (uint zero points), "offset" (float block minimums), "symmetric"
    accuracy_level: int  # MatMulNBits: 0 = float activations, 4 = int8 activations
    embedding_bits: int | None  # the embedding and LM head; None: kept float
    scale_search: bool
    quantized_tensors: int
    quantized: tuple[str, ...]  # module paths, per-layer ones as layers.*
    kept_float: tuple[str, ...]
    # how blocks were fitted: "minmax" (the block's range), "search" (weighted least squares),
    # "awq" (activation-aware scales folded into the weights + activation-weighted search)
    method: str = "minmax"
    calibration: str | None = None  # what awq calibrated on
    source: str | None = None  # what the weights were quantized from, and why this scheme
    # a mixture of experts' experts; left out of the JSON for models without (older readers
    # refuse fields they do not know)
    experts: ExpertsQuantization | None = field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class Precision:
    precision: str  # fp32 | fp16 | int8 | int4
    weights: str  # what the projections store, in words
    activations: str  # what the projections compute in
    residual_stream: str = "float32"
    quantization: Quantization | None = None
    # The execution provider the graphs were built for: "cuda" folders have a CUDA kernel for
    # every compute node (float16 attention, float16 activations for quantized weights).
    target: str = "cpu"


@dataclass(frozen=True)
class KVCacheSpec:
    num_layers: int
    num_key_value_heads: int
    head_dim: int
    dtype: str  # "float32" | "float16" | "int8" (then format_version INT8_CACHE_VERSION)
    layout: str = "BNSH"
    shared_buffer: bool = True  # past and present are bound to one buffer, updated in place
    # The attention reading and writing it (attention.attention_form): "fused" (GroupQueryAttention
    # with RoPE inside), "rotary outside" (RoPE as its own op) or "plain" (plain ONNX ops, for
    # head sizes GroupQueryAttention refuses), and what ruled out the faster forms.
    attention: str = "fused"
    attention_why: str | None = None
    # The layers that own a buffer (None: every layer; Qwen3.5: its full-attention layers only;
    # Gemma 4: not its KV-shared layers, which read the buffer of ``sources``' layer)
    layers: tuple[int, ...] | None = None
    # Per layer of ``layer_indices``, (KV heads, head size) of its buffers, where they differ
    # between layers (Gemma 4's full layers); None: every buffer (num_key_value_heads, head_dim)
    shapes: tuple[tuple[int, int], ...] | None = None
    # Gemma 4: {KV-shared layer (its number as a string, as JSON keys are): the layer whose
    # buffer it reads}. Those layers have no past inputs; their present outputs are bound to
    # the source layer's buffer too, where their kernel rewrites the same keys and values in
    # place and attends over it (no copy)
    sources: dict[str, int] | None = None
    # An int8 cache: how its scales (initializers model.layers.N.self_attn.k|v_scale) were made
    scales: str | None = None

    @property
    def layer_indices(self) -> tuple[int, ...]:
        return self.layers if self.layers is not None else tuple(range(self.num_layers))

    def buffer_shape(self, j: int) -> tuple[int, int]:
        """(KV heads, head size) of the j-th buffer-owning layer's keys and values."""
        if self.shapes is None:
            return self.num_key_value_heads, self.head_dim
        heads, head_dim = self.shapes[j]
        return int(heads), int(head_dim)


# The kinds of per-row recurrent state this llm-onnx reads (RecurrentStateSpec.kind).
STATE_KINDS = ("gated_delta",)


@dataclass(frozen=True)
class RecurrentStateSpec:
    """The per-row state of a model's linear-attention layers (Qwen3.5's Gated DeltaNet): each
    of ``layers`` has a conv state (``conv_shape`` per row: the convolution's last K-1 inputs)
    and a recurrent state (``recurrent_shape`` per row: (Hv, dk, dv)), both graph inputs and
    outputs bound in place. Unlike a KV cache it has no positions: it cannot be cut back, so the
    runtime keeps copies of it (checkpoints) where a row may be rewound to."""

    kind: str  # "gated_delta"
    layers: tuple[int, ...]
    conv_shape: tuple[int, ...]
    recurrent_shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def row_bytes(self) -> int:
        """Bytes of one row's state (every linear-attention layer, both tensors)."""
        per = 1
        for d in self.conv_shape:
            per *= d
        rec = 1
        for d in self.recurrent_shape:
            rec *= d
        return len(self.layers) * (per + rec) * (2 if self.dtype == "float16" else 4)


@dataclass(frozen=True)
class EmbeddingSpec:
    """What embed.onnx returns: each row's final hidden states (after the final norm) pooled
    over its real tokens: ``pooling`` "last" (the last token's), "mean" (their average) or
    "cls" (the first token's), then divided by their L2 norm when ``normalize``. ``dimensions``:
    the vector's length (a caller may keep its first d and re-normalise: Matryoshka models).
    ``rule``: where pooling and normalization were read from, in words."""

    pooling: str
    normalize: bool
    dimensions: int
    rule: str


@dataclass(frozen=True)
class TokenizerSpec:
    files: tuple[str, ...]
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    add_bos_token: bool
    chat_template: str | None
    special_tokens: dict[str, str]  # bos_token, eos_token, ... as the chat template sees them


@dataclass(frozen=True)
class GenerationDefaults:
    """The checkpoint's generation_config.json (sampling defaults), where it had one."""

    do_sample: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None


@dataclass(frozen=True)
class ParityReport:
    """The export's check of ONNX Runtime against torch on the written tensors (or why not)."""

    scope: str  # "whole model", the cut-down model it ran on, or "skipped"
    prompts: int = 0
    prompt_lengths: tuple[int, ...] = ()
    decode_steps: int = 0
    logits_max_abs_diff: float | None = None
    logits_max_abs: float | None = None
    relative_logits_diff: float | None = None  # a diagnostic: the gate judges the KL and top tokens
    kl_divergence: float | None = None  # mean over the compared positions
    kl_max_position: float | None = None  # at the worst one
    greedy_agreement: float | None = None
    clear_agreement: float | None = None  # where torch's top token led clearly
    present_kv_max_abs_diff: float | None = None
    present_state_max_abs_diff: float | None = None  # linear-attention layers' states
    thresholds: dict[str, float] = field(default_factory=dict)
    # Why the gate found the export broken, kept with --allow-parity-failure (empty: it passed)
    failures: tuple[str, ...] = ()
    # The same prompts through the runtime on CUDA (exports for a GPU, made where one is usable).
    cuda_relative_logits_diff: float | None = None
    cuda_kl_divergence: float | None = None
    cuda_greedy_agreement: float | None = None
    # An embedding model's embed.onnx (then the logits fields stay empty)
    embeddings_max_abs_diff: float | None = None
    embeddings_min_cosine: float | None = None


@dataclass(frozen=True)
class SourceSpec:
    kind: str  # "hf" | "gguf" | "random"
    path: str | None


@dataclass(frozen=True)
class FileEntry:
    bytes: int
    sha256: str


@dataclass(frozen=True)
class WeightsSpec:
    file: str
    bytes: int


@dataclass(frozen=True)
class Manifest:
    """manifest.json. ``folder`` is where it was read from (not written)."""

    name: str
    source: SourceSpec
    config: ModelConfig
    num_parameters: int
    context_length: int
    precision: Precision
    graphs: dict[str, GraphSpec]
    weights: WeightsSpec
    kv_cache: KVCacheSpec
    tokenizer: TokenizerSpec
    generation: GenerationDefaults
    parity: ParityReport
    tools: dict[str, str]
    created: str
    files: dict[str, FileEntry]
    recurrent_state: RecurrentStateSpec | None = None  # models with linear-attention layers
    # "embed": embed.onnx (an embedding model, ``embedding`` says how it pools); kv_cache then
    # describes the attention inside the graph, which keeps its keys and values for one run
    task: str = "generate"
    embedding: EmbeddingSpec | None = None
    folder: Path | None = field(default=None, compare=False)

    # -------------------------------------------------------------- reading

    @property
    def num_layers(self) -> int:
        return self.kv_cache.num_layers

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def cuda_blockers(self) -> list[str]:
        """Why this folder cannot run wholly on CUDA (empty when it can); see cuda_blockers."""
        if self.kv_cache.dtype == "int8":
            return ["its KV cache is int8, which is exported for the CPU only so far"]
        return cuda_blockers(self.config, self.kv_cache.dtype == "float16")

    def path(self, graph: str) -> Path:
        assert self.folder is not None
        return self.folder / self.graphs[graph].file

    # -------------------------------------------------------------- JSON

    def to_json(self) -> str:
        data = {"format": FORMAT, "format_version": INT8_CACHE_VERSION
                if self.kv_cache.dtype == "int8" else FORMAT_VERSION}
        for f in dataclasses.fields(self):
            if f.name != "folder":
                data[f.name] = plain(getattr(self, f.name))
        return json.dumps(data, indent=2, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str, folder: Path | None = None) -> Manifest:
        """Parse and type-check; ModelFolderError names the section that is wrong."""
        where = Path(folder) if folder is not None else Path(".")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ModelFolderError(f"{where}: {MANIFEST} is not valid JSON ({e}).") from e
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ModelFolderError(f"{where}: {MANIFEST} is not an llm-onnx manifest.")
        version = data.get("format_version")
        if version not in (FORMAT_VERSION, INT8_CACHE_VERSION):
            raise ModelFolderError(f"{where}: {MANIFEST} has format_version {version!r}; this "
                                   f"llm-onnx reads version {FORMAT_VERSION}. Re-export the "
                                   "model with this version.")
        values = {}
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name == "folder":
                continue
            if f.name not in data:
                if f.default is not dataclasses.MISSING:  # an optional section, newer than the file
                    continue
                raise ModelFolderError(f"{where}: {MANIFEST} lacks the '{f.name}' section.")
            try:
                values[f.name] = typed(hints[f.name], data[f.name], f.name)
            except (TypeError, ValueError, KeyError) as e:
                raise ModelFolderError(f"{where}: {MANIFEST} section '{f.name}' is not what "
                                       f"this llm-onnx reads ({e}).") from None
        task, spec = values.get("task", "generate"), values.get("embedding")
        if task not in TASKS or (task == "embed") != (spec is not None) or \
                (spec is not None and spec.pooling not in POOLINGS):
            raise ModelFolderError(f"{where}: {MANIFEST} describes a task {task!r} (pooling "
                                   f"{spec.pooling if spec else None!r}) that this llm-onnx does "
                                   f"not run (it knows tasks {', '.join(TASKS)}, poolings "
                                   f"{', '.join(POOLINGS)}); upgrade llm-onnx or re-export it.")
        state = values.get("recurrent_state")
        if state is not None and state.kind not in STATE_KINDS:
            raise ModelFolderError(f"{where}: {MANIFEST} describes a recurrent state of kind "
                                   f"{state.kind!r}, which this llm-onnx does not know (it "
                                   f"knows {', '.join(STATE_KINDS)}); upgrade llm-onnx or "
                                   "re-export the model with this version.")
        return cls(**values, folder=folder)


def fitting_block(dims: tuple[int, ...], block_size: int) -> int | None:
    """The largest power-of-two block (16 <= b <= block_size) dividing every dim, or None: the
    block of a quantized export's embedding (GatherBlockQuantized) and experts (QMoE), which
    need whole blocks (MatMulNBits pads instead). Decided by the exporter, read by the bench."""
    b = block_size
    while b >= 16:
        if all(d % b == 0 for d in dims):
            return b
        b //= 2
    return None


def cuda_blockers(config: ModelConfig, float16: bool) -> list[str]:
    """What keeps a model's graphs from running wholly on ONNX Runtime's CUDA provider, read
    from its kernels (onnxruntime-gpu 1.31): GroupQueryAttention and QMoE/MoE have float16 and
    bfloat16 CUDA kernels only, and the CUDA GroupQueryAttention refuses an attention_bias."""
    reasons = []
    if not float16:
        reasons.append("its attention runs in float32 and ONNX Runtime's GroupQueryAttention has "
                       "float16/bfloat16 CUDA kernels only (every step would copy the KV cache "
                       "to the CPU and back)")
    if config.positions.position_embedding_type == "alibi":
        reasons.append("ALiBi's attention bias is refused by the CUDA GroupQueryAttention kernel")
    return reasons


# ----------------------------------------------------------------------------- reading a folder

def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _fail(folder: Path, what: str) -> ModelFolderError:
    return ModelFolderError(f"{folder}: {what}")


def read_manifest(folder: Path) -> Manifest:
    """A folder's manifest, parsed and typed, without checking its files (benchmarks, tools)."""
    folder = Path(folder)
    file = folder / MANIFEST
    if not folder.is_dir():
        raise _fail(folder, "no such model folder (export one with `llm-onnx export`).")
    if not file.is_file():
        raise _fail(folder, f"no {MANIFEST}; this is not a model folder made by `llm-onnx export`.")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise _fail(folder, f"{MANIFEST} is not valid JSON ({e}).") from e
    return Manifest.from_json(text, folder)


def load_manifest(folder: Path, verify: bool = True) -> Manifest:
    """Read and check a model folder's manifest: every listed file present inside the folder,
    sizes as listed, and (``verify``) sha256 as listed."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    for name, info in manifest.files.items():
        path = folder / name
        if Path(name).is_absolute() or ".." in Path(name).parts or "/" in name or "\\" in name:
            raise _fail(folder, f"{MANIFEST} lists file {name!r} outside the model folder.")
        if not path.is_file():
            raise _fail(folder, f"file {name} listed in {MANIFEST} is missing.")
        if not path.resolve().is_relative_to(folder.resolve()):
            raise _fail(folder, f"{name} is a link to {path.resolve()}, outside the model folder; "
                                "refusing to load it.")
        size = path.stat().st_size
        if size != info.bytes:
            raise _fail(folder, f"{name} has {size} bytes, {MANIFEST} says {info.bytes} "
                                "(truncated or modified; re-export the model).")
        if verify and _cached_sha256(path) != info.sha256:
            raise _fail(folder, f"{name} does not match its sha256 in {MANIFEST} "
                                "(corrupt or modified; re-export the model).")
    for graph in (EMBED, WEIGHTS) if manifest.task == "embed" else (PREFILL, DECODE, WEIGHTS):
        if graph not in manifest.files:
            raise _fail(folder, f"{MANIFEST} does not list {graph}.")
    return manifest


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llm-onnx"


def _cached_sha256(path: Path) -> str:
    """sha256 of a file, remembered by (path, size, mtime, inode) so that loading a multi-GB model
    a second time does not re-read it. The cache is advisory: when it cannot be written, hashing
    simply happens every time."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    store = _cache_dir() / "verified.json"
    try:
        known = json.loads(store.read_text()) if store.is_file() else {}
    except (OSError, ValueError):
        known = {}
    if key in known:
        return known[key]
    digest = sha256_file(path)
    if st.st_size >= 64 << 20:  # only worth remembering for big files
        known[key] = digest
        try:
            store.parent.mkdir(parents=True, exist_ok=True)
            tmp = store.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known))
            os.replace(tmp, store)
        except OSError:
            pass
    return digest

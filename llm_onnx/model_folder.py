"""The model folder contract: what `llm-onnx export` writes and the runtime reads.

A model folder holds prefill.onnx, decode.onnx, weights.data (shared by both graphs), tokenizer
files and manifest.json; a folder that takes images also vision.onnx (its tensors in the same
weights.data; ``images`` says how prompts take them); an embedding model's folder (``task``
"embed", ``llm-onnx export --task embed``) holds embed.onnx and weights.data instead. This
module types the manifest: frozen dataclasses with ``to_json`` / ``from_json`` (its sections in
manifest_sections.py), the graphs' input and output names (graph_io), both re-exported here,
and the checks the runtime makes before it trusts a folder (format version,
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
    ATTEND_UNTIL,
    DEEPSTACK_EMBEDS,
    EMBEDDINGS,
    IMAGE_EMBEDS,
    IMAGE_TOKEN_INDEX,
    INPUT_IDS,
    LOGITS,
    LOGITS_WINDOW,
    PAST_CONV,
    PAST_KEY,
    PAST_RECURRENT,
    PAST_VALUE,
    PIXEL_POSITION_IDS,
    PIXEL_VALUES,
    POSITION_IDS,
    POSITION_INDEX,
    POSITION_WEIGHT,
    PRESENT_CONV,
    PRESENT_KEY,
    PRESENT_RECURRENT,
    PRESENT_VALUE,
    ROTARY_COS,
    ROTARY_SIN,
    SEQLENS_K,
    SEQUENCE_LENGTHS,
    TOTAL_SEQUENCE_LENGTH,
    VALID_TOKENS,
    VISION_INPUTS,
    VISION_INPUTS_BY_KIND,
    image_input_names,
    input_names,
    output_names,
    state_names,
    vision_output_names,
)
from llm_onnx.manifest_sections import (  # noqa: F401 (re-exported: mf.KVCacheSpec, ...)
    STATE_KINDS,
    EmbeddingSpec,
    ExpertsQuantization,
    FileEntry,
    GenerationDefaults,
    GraphSpec,
    ImagesSpec,
    KernelsSpec,
    KVCacheSpec,
    ParityReport,
    Precision,
    Quantization,
    RecurrentStateSpec,
    SourceSpec,
    TensorSpec,
    TokenizerSpec,
    WeightsSpec,
)
from llm_onnx.modeling.config import ModelConfig
from llm_onnx.typed_json import plain, typed

FORMAT = "llm-onnx-model"
FORMAT_VERSION = 2  # 2: typed sections, the real quantization scheme, special tokens
# 3: only a folder with an int8 KV cache, which an older llm-onnx must refuse (others stay 2)
INT8_CACHE_VERSION = 3
# 4: only a folder that takes images (graphs with image inputs, which an older llm-onnx would
# run as text and fail to bind)
IMAGES_VERSION = 4
MANIFEST = "manifest.json"
PREFILL, DECODE, WEIGHTS = "prefill.onnx", "decode.onnx", "weights.data"
VISION = "vision.onnx"
MODALITIES = ("text", "image")
EMBED = "embed.onnx"
# What a folder's graphs compute: "generate" (next-token logits over a KV cache: prefill.onnx,
# decode.onnx) or "embed" (one pooled vector per text in one run: embed.onnx)
TASKS = ("generate", "embed")
POOLINGS = ("last", "mean", "cls")  # EmbeddingSpec.pooling

# ----------------------------------------------------------------------------- the manifest

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
    # What prompts may hold: ("text",), or ("text", "image") with ``images`` saying how
    modalities: tuple[str, ...] = ("text",)
    images: ImagesSpec | None = field(default=None, metadata={"omit_none": True})
    # llm-onnx's own operators (--kernels llm_onnx); left out of the JSON without them
    kernels: KernelsSpec | None = field(default=None, metadata={"omit_none": True})
    folder: Path | None = field(default=None, compare=False)

    # -------------------------------------------------------------- reading

    @property
    def num_layers(self) -> int:
        return self.kv_cache.num_layers

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def takes_images(self) -> bool:
        return self.images is not None

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
        version = IMAGES_VERSION if self.images is not None else INT8_CACHE_VERSION \
            if self.kv_cache.dtype == "int8" else FORMAT_VERSION
        data = {"format": FORMAT, "format_version": version}
        for f in dataclasses.fields(self):
            if f.name != "folder" and not (f.metadata.get("omit_none")
                                           and getattr(self, f.name) is None):
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
        if version not in (FORMAT_VERSION, INT8_CACHE_VERSION, IMAGES_VERSION):
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
        modalities, images = values.get("modalities", ("text",)), values.get("images")
        if set(modalities) - set(MODALITIES) or ("image" in modalities) != (images is not None):
            raise ModelFolderError(f"{where}: {MANIFEST} says the folder takes "
                                   f"{', '.join(modalities)} (images described: "
                                   f"{images is not None}); this llm-onnx reads "
                                   f"{', '.join(MODALITIES)}; upgrade llm-onnx or re-export it.")
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
    graphs = (EMBED, WEIGHTS) if manifest.task == "embed" else (PREFILL, DECODE, WEIGHTS)
    for graph in graphs + ((VISION,) if manifest.images is not None else ()):
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

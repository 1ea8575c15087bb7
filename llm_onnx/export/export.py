"""export_model: checkpoint -> model folder (prefill.onnx, decode.onnx, weights.data, tokenizer,
manifest.json), written atomically and checked by the parity gate.

Data flow, with bounded memory (the model never exists in memory as a whole):

  meta-device Decoder --to_export_form--> trace prefill & decode (initializers without data)
  checkpoint --one tensor at a time--> cast / quantize --> weights.data
  graphs + offsets into weights.data --> prefill.onnx, decode.onnx
  parity gate (ORT vs torch) --> manifest.json --> rename the scratch folder to --out
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx_ir as ir
import torch

from llm_onnx import __version__
from llm_onnx.model.config import ModelConfig
from llm_onnx.model.decoder import Decoder, Fusion
from llm_onnx.checkpoints.load import Checkpoint
from llm_onnx.model.shapes import Shape, num_parameters
from llm_onnx.errors import ExportError
from llm_onnx.export.graphs import GRAPHS, trace_graph
from llm_onnx.export.modules import to_export_form
from llm_onnx.export.options import ExportOptions
from llm_onnx.export.progress import Progress
from llm_onnx.export.validate import (compare, compute_in_float32, load_stored, run_onnx,
                                      run_reference, thresholds)
from llm_onnx.export.weights import WeightFile, count_weight_modules, write_weights
from llm_onnx.runtime import manifest as mf
from llm_onnx.runtime import names

# Validate the whole model when the torch reference and ORT both fit comfortably in memory.
FULL_VALIDATION_PARAMS = 600_000_000
# The scratch model of the parity gate for large models: one layer of the real ones (Qwen3-8B's
# is 218M parameters, whose fp32 copies ORT's CPU kernels make from fp16 weights), 4096
# vocabulary rows, 8 experts; small enough to keep `export` of an 8B model under 3 GiB.
SCRATCH_LAYERS, SCRATCH_VOCAB, SCRATCH_EXPERTS = 1, 4096, 8


def _dtype(options: ExportOptions) -> torch.dtype:
    return torch.float16 if options.precision == "fp16" else torch.float32


def _fusion(options: ExportOptions) -> Fusion:
    return Fusion(rotary=options.fuse_rotary, qkv=options.fuse_qkv, gate_up=options.fuse_gate_up)


def check_supported(cfg: ModelConfig, options: ExportOptions) -> None:
    if cfg.head_dim % 8:
        raise ExportError(f"head_dim {cfg.head_dim} is not a multiple of 8, which ONNX Runtime's "
                          "GroupQueryAttention requires.")


def meta_decoder(cfg: ModelConfig, options: ExportOptions, max_len: int,
                 export_form: bool = True) -> Decoder:
    """A weightless Decoder for these options: eager modules, or swapped to their export forms."""
    with torch.device("meta"):
        model = Decoder(cfg, dtype=_dtype(options), fusion=_fusion(options), max_positions=max_len)
    return to_export_form(model, options) if export_form else model


def build_graphs(cfg: ModelConfig, options: ExportOptions, max_len: int,
                 progress: Progress) -> tuple[Decoder, Decoder, dict[str, ir.Model]]:
    """(eager meta model, export-form meta model, traced graphs)."""
    eager = meta_decoder(cfg, options, max_len, export_form=False)
    export = meta_decoder(cfg, options, max_len)
    graphs = {}
    for kind in GRAPHS:
        progress.stage(f"tracing {kind}")
        graphs[kind] = trace_graph(export, kind, all_logits=options.all_logits,
                                   rotary_fused=export.model.layers[0].self_attn.fused_rotary)
        progress.advance(1)
    return eager, export, graphs


def write_folder(checkpoint: Checkpoint, folder: Path, options: ExportOptions, max_len: int,
                 progress: Progress) -> WeightFile:
    """Graphs and weights of ``checkpoint`` into ``folder``; returns the closed weight file (its
    tensor table and sha256)."""
    cfg = checkpoint.config
    eager, export, graphs = build_graphs(cfg, options, max_len, progress)
    progress.stage("writing weights")
    wf = WeightFile(folder / mf.WEIGHTS)
    try:
        write_weights(export, eager, checkpoint.source, wf, progress.advance)
    finally:
        wf.close()
    for kind, graph in graphs.items():
        missing = [n for n in graph.graph.initializers if n not in wf.tensors]
        if missing:
            raise ExportError(f"internal: no weights written for {missing[:3]} of the {kind} graph")
        for name, value in graph.graph.initializers.items():
            st = wf.tensors[name]
            value.const_value = ir.ExternalTensor(mf.WEIGHTS, st.offset, st.length, value.dtype,
                                                  shape=value.shape, name=name, base_dir=folder)
        try:
            ir.save(graph, folder / f"{kind}.onnx")
        except OSError as e:
            raise ExportError(f"{folder / kind}.onnx: cannot write ({e}).") from e
    return wf


def _tools() -> dict[str, str]:
    import onnx
    import onnxruntime
    import onnxscript

    return {"llm_onnx": __version__, "torch": torch.__version__, "onnx": onnx.__version__,
            "onnxscript": onnxscript.__version__, "onnx_ir": ir.__version__,
            "onnxruntime": onnxruntime.__version__}


def _io(graph_file: Path) -> dict:
    model = ir.load(graph_file)

    def describe(values) -> list[dict]:
        return [{"name": v.name, "dtype": v.dtype.name.lower() if v.dtype else None,
                 "shape": [d if isinstance(d, int) else str(d) for d in v.shape]} for v in values]

    return {"inputs": describe(model.graph.inputs), "outputs": describe(model.graph.outputs)}


def _precision_section(cfg: ModelConfig, options: ExportOptions) -> dict:
    from llm_onnx.export.modules import NBitsLinear, QuantEmbedding, QuantExperts

    export = meta_decoder(cfg, options, 2)
    kinds: dict[str, list[str]] = {"quantized": [], "float": []}
    for path, module in export.named_modules():
        if isinstance(module, (NBitsLinear, QuantEmbedding, QuantExperts)):
            kinds["quantized"].append(f"{path} (int{module.bits}, block {module.block_size})")
    section = {
        "precision": options.precision,
        "weights": {"fp32": "float32", "fp16": "float16"}.get(options.precision,
                                                               f"int{options.bits} block-wise symmetric"),
        "activations": "float16" if options.precision == "fp16" else "float32",
        "residual_stream": "float32",
    }
    if options.quantized:
        section.update(block_size=options.block_size, accuracy_level=options.activation_level,
                       scheme=options.scheme,
                       embedding_bits=options.embedding_bits, scale_search=options.quant_search,
                       quantized_tensors=len(kinds["quantized"]),
                       quantized=_summarise(kinds["quantized"]),
                       kept_float=["norms", "router (mlp.gate)" if cfg.moe else None,
                                   None if options.embedding_bits else "embedding and lm_head",
                                   "position table (model.embed_positions)"
                                   if cfg.position_embedding_type == "learned" else None])
        section["kept_float"] = [k for k in section["kept_float"] if k]
    return section


def _summarise(entries: list[str]) -> list[str]:
    """Collapse per-layer names: model.layers.N.self_attn.qkv_proj (int8, block 32) once."""
    import re

    seen: list[str] = []
    for e in entries:
        generic = re.sub(r"layers\.\d+\.", "layers.*.", e)
        if generic not in seen:
            seen.append(generic)
    return seen


def _manifest(checkpoint: Checkpoint, folder: Path, options: ExportOptions, max_len: int,
              parity: dict, tokenizer_files: list[str], known_sha256: dict[str, str] | None = None,
              ) -> dict:
    cfg = checkpoint.config
    tok_cfg = {}
    if (folder / "tokenizer_config.json").is_file():
        tok_cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    chat_template = tok_cfg.get("chat_template")
    if chat_template is None and (folder / "chat_template.jinja").is_file():
        chat_template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    generation = {}
    if (folder / "generation_config.json").is_file():
        gen = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
        generation = {k: gen[k] for k in ("temperature", "top_p", "top_k", "repetition_penalty",
                                          "do_sample") if k in gen}
    kv_dtype = "float16" if options.precision == "fp16" else "float32"
    data = {
        "format": mf.FORMAT,
        "format_version": mf.FORMAT_VERSION,
        "name": checkpoint.name,
        "source": {"kind": checkpoint.kind,
                   "path": str(checkpoint.path) if checkpoint.path else None},
        "config": cfg.to_dict(),
        "num_parameters": num_parameters(cfg),
        "context_length": max_len,
        "precision": _precision_section(cfg, options),
        "graphs": {
            "prefill": {"file": mf.PREFILL, "logits": "all" if options.all_logits else "last",
                        **_io(folder / mf.PREFILL)},
            "decode": {"file": mf.DECODE, "logits": "all", **_io(folder / mf.DECODE)},
        },
        "weights": {"file": mf.WEIGHTS, "bytes": (folder / mf.WEIGHTS).stat().st_size},
        "kv_cache": {
            "layout": "BNSH", "shape": ["batch", "num_key_value_heads", "max_len", "head_dim"],
            "num_layers": cfg.num_hidden_layers, "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim, "dtype": kv_dtype, "shared_buffer": True,
            "inputs": [names.PAST_KEY, names.PAST_VALUE],
            "outputs": [names.PRESENT_KEY, names.PRESENT_VALUE],
        },
        "inputs": {"seqlens_k": "valid tokens (past + new) of each row minus one, int32",
                   "total_sequence_length": "largest valid length in the batch, int32 scalar"},
        "tokenizer": {
            "files": tokenizer_files,
            "bos_token_id": checkpoint.bos_token_id,
            "eos_token_ids": checkpoint.eos_token_ids,
            "add_bos_token": bool(tok_cfg.get("add_bos_token", False)),
            "chat_template": chat_template,
        },
        "generation": generation,
        "parity": parity,
        "tools": _tools(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != mf.MANIFEST)
    known = known_sha256 or {}  # weights.data: hashed while it was written, not read back
    data["files"] = {n: {"bytes": (folder / n).stat().st_size,
                         "sha256": known.get(n) or mf.sha256_file(folder / n)} for n in files}
    return data


class _ScratchSource:
    """A large checkpoint cut down for the parity gate: the first rows of the vocabulary and, for
    MoE, the first experts (router rows included); every other tensor unchanged."""

    def __init__(self, source, vocab: int, experts: int | None) -> None:
        self.source, self.vocab, self.experts = source, vocab, experts

    def _rows(self, name: str) -> int | None:
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            return self.vocab
        if self.experts is not None and name.endswith(".mlp.gate.weight"):
            return self.experts
        return None

    def names(self):
        return self.source.names()

    def shape(self, name: str) -> Shape:
        shape, rows = self.source.shape(name), self._rows(name)
        return shape if rows is None else (rows, *shape[1:])

    def get(self, name: str):
        t, rows = self.source.get(name), self._rows(name)
        return t if rows is None else t[:rows].clone()

    def describe(self, name: str) -> str:
        return self.source.describe(name)


def _scratch_config(cfg: ModelConfig) -> ModelConfig:
    small = cfg.replace(num_hidden_layers=min(SCRATCH_LAYERS, cfg.num_hidden_layers),
                        vocab_size=min(SCRATCH_VOCAB, cfg.vocab_size))
    if cfg.moe is not None and cfg.moe.num_experts > SCRATCH_EXPERTS:
        small = small.replace(moe=replace(cfg.moe, num_experts=SCRATCH_EXPERTS,
                                          num_experts_per_tok=min(cfg.moe.num_experts_per_tok,
                                                                  SCRATCH_EXPERTS // 2)))
    return small


def _release_memory() -> None:
    """Hand freed heap back to the OS between stages (glibc keeps it otherwise)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def validate(checkpoint: Checkpoint, folder: Path, options: ExportOptions, max_len: int,
             tensors: dict, progress: Progress) -> dict:
    """Parity report of the folder's graphs, or of a scratch export of the first layer (first
    vocabulary rows, first experts) when the model is too large to run twice in memory."""
    cfg = checkpoint.config
    progress.stage("validating")
    limits = thresholds(options.precision, options.int8_activations)
    kv_dtype = np.float16 if options.precision == "fp16" else np.float32
    if num_parameters(cfg) <= FULL_VALIDATION_PARAMS:
        report = _compare_folder(folder, cfg, options, max_len, tensors, kv_dtype, limits)
        report["scope"] = "whole model"
    else:
        small = _scratch_config(cfg)
        experts = small.moe.num_experts if small.moe is not None and cfg.moe is not None else None
        scratch_ckpt = replace(checkpoint, config=small,
                               source=_ScratchSource(checkpoint.source, small.vocab_size, experts))
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".llm-onnx-parity-") as tmp:
            scratch = Path(tmp)
            small_len = min(max_len, 64)
            small_tensors = write_folder(scratch_ckpt, scratch, options, small_len,
                                         Progress(enabled=False)).tensors
            _release_memory()
            report = _compare_folder(scratch, small, options, small_len, small_tensors, kv_dtype,
                                     limits)
        report["scope"] = (f"first {small.num_hidden_layers} layer(s), first {small.vocab_size} "
                           "vocabulary rows" + (f", first {experts} experts" if experts else "")
                           + "; same weights, same export code")
    progress.advance(1)
    return report


def _compare_folder(folder: Path, cfg: ModelConfig, options: ExportOptions, max_len: int,
                    tensors: dict, kv_dtype, limits) -> dict:
    """Torch reference first (then freed), then ORT one session at a time."""
    reference = meta_decoder(cfg, options, max_len)
    reference = compute_in_float32(load_stored(reference, folder / mf.WEIGHTS, tensors))
    torch_steps, fed = run_reference(reference, cfg.vocab_size)
    del reference
    _release_memory()
    onnx_steps = run_onnx(folder, cfg, kv_dtype, cfg.vocab_size, fed)
    return compare(torch_steps, onnx_steps, limits)


@contextmanager
def _interrupts_as_exceptions() -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C, so the scratch folder is removed either way."""
    def handler(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def check_output(out: Path, force: bool, checkpoint: Checkpoint) -> None:
    out = Path(out)
    if out.exists() and not force:
        raise ExportError(f"{out} already exists; pass --force to replace it (the old folder is "
                          "kept until the new one is complete).")
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a folder.")
    if checkpoint.path is not None:
        src = checkpoint.path if checkpoint.path.is_dir() else checkpoint.path.parent
        try:
            out.resolve().relative_to(src.resolve())
            inside = checkpoint.path.is_dir()
        except ValueError:
            inside = False
        if inside:
            raise ExportError(f"--out {out} is inside the checkpoint folder {src}; choose a folder "
                              "outside it.")


def export_model(checkpoint: Checkpoint, out: Path, options: ExportOptions | None = None, *,
                 force: bool = False, progress: bool = True) -> Path:
    """Export ``checkpoint`` into the model folder ``out``.

    Args:
        checkpoint: from ``open_checkpoint(path)`` or ``random_checkpoint(config, name)``.
        out: the model folder to create. It is written as a scratch folder beside ``out`` and
            renamed at the end, so an interrupted or failed export leaves no partial folder and
            an existing ``out`` (replaced only with ``force``) stays intact until then.
        options: precision, quantization and graph options.
        force: replace an existing ``out``.
        progress: show a progress bar on stderr.

    Returns the model folder. Raises ExportError (bad output path, disk full) or ParityError.
    """
    options = options or ExportOptions()
    out = Path(out)
    cfg = checkpoint.config
    check_supported(cfg, options)
    check_output(out, force, checkpoint)
    max_len = min(options.max_seq_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    bar = Progress(enabled=progress, total=2 + 1 + 1)
    try:
        with _interrupts_as_exceptions():
            weights = write_folder(checkpoint, scratch, options, max_len,
                                   bar.grow(count_weight_modules_for(cfg, options)))
            _release_memory()
            tokenizer_files = checkpoint.write_tokenizer(scratch)
            parity = (validate(checkpoint, scratch, options, max_len, weights.tensors, bar)
                      if options.validate else {"skipped": True})
            bar.stage("manifest")
            data = _manifest(checkpoint, scratch, options, max_len, parity, tokenizer_files,
                             {mf.WEIGHTS: weights.sha256})
            (scratch / mf.MANIFEST).write_text(json.dumps(data, indent=2, ensure_ascii=False),
                                               encoding="utf-8")
            _replace_folder(scratch, out)
            bar.advance(1)
    except OSError as e:  # disk full, read-only file system, permissions: one line, no leftovers
        shutil.rmtree(scratch, ignore_errors=True)
        if e.filename and not str(e.filename).startswith(str(scratch)):
            raise ExportError(f"{e.filename}: cannot read ({e.strerror or e}).") from e
        raise ExportError(f"{out}: cannot write the model folder ({e.strerror or e}); "
                          "free disk space or choose another --out.") from e
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    finally:
        bar.close()
    return out


def count_weight_modules_for(cfg: ModelConfig, options: ExportOptions) -> int:
    return count_weight_modules(meta_decoder(cfg, options, 2))


def _replace_folder(scratch: Path, out: Path) -> None:
    """Rename scratch -> out; an existing out is moved aside first and removed only afterwards."""
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
        try:
            os.replace(scratch, out)
        except BaseException:
            os.replace(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(scratch, out)

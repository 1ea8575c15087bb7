"""export_model: checkpoint -> model folder (prefill.onnx, decode.onnx, weights.data, tokenizer,
manifest.json; embed.onnx instead of the first two for an embedding model; vision.onnx beside
them for a checkpoint with a vision tower), written atomically and checked by the parity gate.

Data flow, with bounded memory (the model never exists in memory as a whole):

  ExportPlan: one meta-device Decoder in export forms --trace--> prefill & decode graphs
  checkpoint --one tensor at a time--> each module casts / quantizes its own --> weights.data
  graphs + offsets into weights.data --> prefill.onnx, decode.onnx
  parity gate (ORT vs torch on the written tensors) --> manifest.json --> the folder renamed

The pieces: plan.py (what is exported), weights.py (the data file), folder.py (atomic output,
signals), parity.py (what the gate runs on), validate.py (the comparison).
"""

from __future__ import annotations

import datetime
from dataclasses import replace
from pathlib import Path

import onnx_ir as ir
import torch

from llm_onnx import __version__
from llm_onnx import model_folder as mf
from llm_onnx.checkpoints.load import Checkpoint
from llm_onnx.checkpoints.pooling import pooling_rule
from llm_onnx.errors import ExportError
from llm_onnx.export.calibrate import (
    KV_MAX_TOKENS,
    MAX_TOKENS,
    Calibration,
    calibrate,
    calibration_ids,
    read_text,
)
from llm_onnx.export.folder import atomic_folder, check_output, release_memory
from llm_onnx.export.images import images_spec
from llm_onnx.export.kv_rotation import rotated_values
from llm_onnx.export.options import ExportOptions
from llm_onnx.export.parity import validate
from llm_onnx.export.plan import ExportPlan, kernels_spec
from llm_onnx.export.progress import Progress
from llm_onnx.export.weights import StoredTensor, WeightFile, write_weights
from llm_onnx.modeling.shapes import num_parameters


def write_folder(checkpoint: Checkpoint, plan: ExportPlan, folder: Path,
                 progress: Progress) -> WeightFile:
    """The graphs and weights of ``checkpoint`` into ``folder``; returns the closed weight file
    (its tensor table and sha256)."""
    graphs = plan.trace(progress)
    if plan.calibration is None and (_awq(plan.options) or plan.options.kv_int8):
        plan.calibration = calibrate_plan(checkpoint, plan, progress)
    progress.stage("writing weights")
    wf = WeightFile(folder / mf.WEIGHTS)
    try:
        write_weights(plan.model, plan.write_producers(), checkpoint.source, wf, progress.advance)
        if plan.vision is not None:  # the tower's tensors, by their checkpoint names
            assert checkpoint.vision_source is not None
            write_weights(plan.vision, plan.vision_producers, checkpoint.vision_source, wf,
                          progress.advance)
    finally:
        wf.close()
    for kind, graph in graphs.items():
        stored = {n: v for n, v in graph.graph.initializers.items()
                  if n != mf.LOGITS_WINDOW}  # the one with its data in the graph
        missing = [n for n in stored if n not in wf.tensors]
        if missing:
            raise ExportError(f"internal: no weights written for {missing[:3]} of the {kind} graph")
        for name, value in stored.items():
            st = wf.tensors[name]
            value.const_value = ir.ExternalTensor(mf.WEIGHTS, st.offset, st.length, value.dtype,
                                                  shape=value.shape, name=name, base_dir=folder)
        try:
            ir.save(graph, folder / f"{kind}.onnx")
        except OSError as e:
            raise ExportError(f"{folder / kind}.onnx: cannot write ({e}).") from e
    return wf


def _awq(options: ExportOptions) -> bool:
    return options.quantized and options.method == "awq"


def calibrate_plan(checkpoint: Checkpoint, plan: ExportPlan, progress: Progress) -> Calibration:
    """The calibration pass (calibrate.py) of awq and of an int8 KV cache, one progress step per
    layer."""
    text = read_text(Path(plan.options.calibration_text)) if plan.options.calibration_text else None
    kv = plan.options.kv_int8
    ids, description = calibration_ids(checkpoint, text, KV_MAX_TOKENS if kv else MAX_TOKENS, kv)
    progress.grow(plan.cfg.num_hidden_layers)
    progress.stage("calibrating")
    cal = calibrate(checkpoint, plan.model.fusion, plan.options.block_size, ids, description,
                    progress.advance, awq=_awq(plan.options), kv_scales=plan.options.kv_int8,
                    max_positions=plan.max_len if plan.options.kv_int8 else None)
    release_memory()
    return cal


# GGUF types whose blocks of 32 are exactly code * scale + minimum: the offset scheme keeps them
OFFSET_EXACT = ("Q4_0", "Q4_1", "Q4_K")


def resolve_source(options: ExportOptions, checkpoint: Checkpoint) -> ExportOptions:
    """``options`` with the quantization defaults the source calls for: int4 for CPU from an
    already 4-bit GGUF keeps its blocks exactly (offset scheme, float activations); from a float
    source, zero points with the activation-aware search on the fast kernel (int8 activations
    on CPU, float16 on CUDA)."""
    if (options.precision == "int4" and not options.cuda and options.quant_scheme is None
            and options.quant_method is None and checkpoint.storage_type in OFFSET_EXACT
            and options.block_size == 32):
        options = replace(options, quant_scheme="offset", quant_method="minmax")
    return resolve_experts(options, checkpoint)


def resolve_experts(options: ExportOptions, checkpoint: Checkpoint) -> ExportOptions:
    """``options`` with the experts' quantization decided for a model whose experts run as
    ONNX Runtime's QMoE (Qwen3-MoE, Qwen3.5-MoE, Qwen3-Next, gpt-oss); others keep None.

    On CPU: int8 activations (accuracy_level 4); 4-bit experts with zero points in blocks of
    64 (of 32 where ``block_size`` is not the default 32, or the checkpoint's experts are
    MXFP4: symmetric blocks of 32 already, kept so; 8-bit experts symmetric). For CUDA: float16
    activations, symmetric blocks of ``block_size``. Chosen by speed, memory and KL
    (benchmarks/moe_fidelity.py, benchmarks/moe_full.py; docs/moe.md)."""
    from llm_onnx.checkpoints.mxfp4 import reads_mxfp4

    cfg = checkpoint.config
    if cfg.moe is None or cfg.mlp.enable_moe_block or not options.quantized:
        return options
    cpu = not options.cuda
    scheme = options.experts_scheme or (
        "zero_point" if cpu and options.bits == 4 and not reads_mxfp4(checkpoint.source)
        else "symmetric")
    block = options.experts_block_size or (
        64 if scheme == "zero_point" and options.block_size == 32 else options.block_size)
    level = options.experts_accuracy_level
    return replace(options, experts_scheme=scheme, experts_block_size=block,
                   experts_accuracy_level=(4 if cpu else 0) if level is None else level)


def require_kernels() -> None:
    """--kernels llm_onnx: the parity gate runs the graphs, so the library must be built."""
    from llm_onnx import kernels

    if not kernels.available():
        raise ExportError(f"--kernels llm_onnx needs llm-onnx's kernel library, which is not "
                          f"built here: {kernels.BUILD_HINT}; or export with --kernels ort.")


def describe_source(checkpoint: Checkpoint, options: ExportOptions) -> str | None:
    if not options.quantized:
        return None
    fmt = checkpoint.storage_type
    if fmt in OFFSET_EXACT and options.scheme == "offset" and options.block_size == 32:
        return f"GGUF {fmt}: its 4-bit blocks kept exactly (offset scheme)"
    return f"GGUF {fmt}, requantized" if fmt else f"{checkpoint.kind} float weights"


def _write_tensors(checkpoint: Checkpoint, plan: ExportPlan, folder: Path,
                   progress: Progress) -> dict[str, StoredTensor]:
    return write_folder(checkpoint, plan, folder, progress).tensors


def _tools() -> dict[str, str]:
    import onnx
    import onnxruntime
    import onnxscript

    return {"llm_onnx": __version__, "torch": torch.__version__, "onnx": onnx.__version__,
            "onnxscript": onnxscript.__version__, "onnx_ir": ir.__version__,
            "onnxruntime": onnxruntime.__version__}


def build_manifest(checkpoint: Checkpoint, plan: ExportPlan, folder: Path,
                   parity: mf.ParityReport, tokenizer_files: list[str],
                   known_sha256: dict[str, str]) -> mf.Manifest:
    """The manifest of a written folder (every file but itself listed with size and sha256)."""
    import json

    cfg = checkpoint.config
    tok_cfg: dict = {}
    if (folder / "tokenizer_config.json").is_file():
        tok_cfg = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    chat_template = tok_cfg.get("chat_template")
    if chat_template is None and (folder / "chat_template.jinja").is_file():
        chat_template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    special = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = tok_cfg.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            special[key] = value
    generation = mf.GenerationDefaults()
    if (folder / "generation_config.json").is_file():
        gen = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
        generation = mf.GenerationDefaults(**{k: gen[k] for k in (
            "do_sample", "temperature", "top_p", "top_k", "repetition_penalty") if k in gen})
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != mf.MANIFEST)
    precision = plan.precision
    if precision.quantization is not None:
        precision = replace(precision, quantization=replace(
            precision.quantization, source=describe_source(checkpoint, plan.options),
            calibration=plan.calibration.description
            if plan.calibration and _awq(plan.options) else None))
    images = images_spec(checkpoint, plan) if plan.vision is not None else None
    return mf.Manifest(
        name=checkpoint.name,
        source=mf.SourceSpec(checkpoint.kind, str(checkpoint.path) if checkpoint.path else None),
        config=cfg, num_parameters=num_parameters(cfg), context_length=plan.max_len,
        precision=precision, graphs=plan.graph_specs,
        weights=mf.WeightsSpec(mf.WEIGHTS, (folder / mf.WEIGHTS).stat().st_size),
        kv_cache=plan.kv_cache, recurrent_state=plan.recurrent_state,
        task=plan.options.task, embedding=plan.embedding, kernels=kernels_spec(plan.model),
        tokenizer=mf.TokenizerSpec(
            files=tuple(tokenizer_files), bos_token_id=checkpoint.bos_token_id,
            eos_token_ids=tuple(checkpoint.eos_token_ids),
            add_bos_token=bool(tok_cfg.get("add_bos_token", False)),
            chat_template=chat_template, special_tokens=special),
        generation=generation, parity=parity, tools=_tools(),
        modalities=("text", "image") if images is not None else ("text",), images=images,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        # weights.data was hashed while it was written, not read back
        files={n: mf.FileEntry((folder / n).stat().st_size,
                               known_sha256.get(n) or mf.sha256_file(folder / n))
               for n in files})


def embedding_spec(checkpoint: Checkpoint, options: ExportOptions,
                   ) -> tuple[mf.EmbeddingSpec | None, int | None]:
    """An embedding export's pooling (checkpoints/pooling.py, or the options' choice) and the
    context its files bound the input to (sentence-transformers' max_seq_length); (None, None)
    for a generation export."""
    if options.task != "embed":
        return None, None
    cfg = checkpoint.config
    found = pooling_rule(checkpoint.path if checkpoint.kind == "hf" else None, checkpoint.bare,
                         cfg.embed_width, checkpoint.gguf_pooling)
    pooling = options.pooling or found.pooling
    normalize = found.normalize if options.normalize is None else options.normalize
    rule = found.rule
    if (pooling, normalize) != (found.pooling, found.normalize):
        rule = (f"asked for ({pooling} pooling, {'' if normalize else 'not '}normalised); the "
                f"checkpoint says: {found.rule}")
    return mf.EmbeddingSpec(pooling, normalize, cfg.embed_width, rule), found.max_seq_length


def cuda_export_limits(cfg, options: ExportOptions) -> list[str]:
    """Shapes ONNX Runtime's CUDA kernels refuse at run time (measured on onnxruntime-gpu 1.31.1,
    H100): 4-bit MatMulNBits with one row and blocks of 256; QMoE with expert widths that are
    not multiples of 64."""
    limits = []
    if options.bits == 4 and options.block_size > 128:
        limits.append(f"block size {options.block_size}: the CUDA 4-bit MatMulNBits kernel takes "
                      "blocks of 16 to 128 (use --block-size 128 or less)")
    if cfg.moe is not None and options.quantized and cfg.moe.moe_intermediate_size % 64:
        limits.append(f"moe_intermediate_size {cfg.moe.moe_intermediate_size}: the CUDA QMoE "
                      "kernel needs expert widths in multiples of 64")
    return limits


def resolve_target(options: ExportOptions, cfg) -> ExportOptions:
    """``options`` with its target decided: the one asked for (checked against the model), else
    "cuda" when a usable CUDA GPU is present and the model can run wholly on it, else "cpu"."""
    if options.target == "cpu":
        return options
    if options.kv_int8 and options.target is None:  # an int8 cache is checked on the CPU only
        return replace(options, target="cpu")
    # fp32 stays fp32 whatever the target, and cuda_blockers names its float32 attention.
    blockers = mf.cuda_blockers(cfg, options.precision != "fp32") + cuda_export_limits(cfg, options)
    if options.target == "cuda":
        if blockers:
            raise ExportError(f"--target cuda: this model cannot run wholly on CUDA: "
                              f"{'; '.join(blockers)}. Export it with --target cpu.")
        return options
    if blockers:
        return replace(options, target="cpu")
    # lazy: the export does not need ORT-GPU
    from llm_onnx.runtime.core.providers import cuda_status

    return replace(options, target="cuda" if cuda_status()[0] else "cpu")


def export_model(checkpoint: Checkpoint, out: Path, options: ExportOptions | None = None, *,
                 force: bool = False, progress: bool = True) -> Path:
    """Export ``checkpoint`` into the model folder ``out``.

    Args:
        checkpoint: from ``open_checkpoint(path)`` or ``random_checkpoint(config, name)``.
        out: the model folder to create. It is written as a scratch folder beside ``out`` and
            renamed at the end, so an interrupted or failed export leaves no partial folder and
            an existing ``out`` (replaced only with ``force``) stays intact until then.
        options: precision, quantization and graph options.
        force: replace an existing ``out`` if it is an empty folder or a model folder made by
            ``llm-onnx export`` holding nothing its manifest does not list; anything else (a
            folder of the user's, the working directory, a symbolic link) is refused.
        progress: show a progress bar on stderr.

    Returns the model folder. Raises ExportError (bad output path, disk full) or ParityError.

    Memory is allocated as the process started: ``llm-onnx export`` starts itself again with
    glibc's huge pages on (``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``: far fewer page faults, a
    big model's export twice as fast), which a library cannot do to the program that calls it;
    start that program with the variable set (``llm_onnx.export.hugepages.huge_pages_env`` says
    what to add).
    """
    out = Path(out)
    check_output(out, force, checkpoint.path)  # before any weight is read
    cfg = checkpoint.config
    options = resolve_source(resolve_target(options or ExportOptions(), cfg), checkpoint)
    if options.kernels == "llm_onnx":
        require_kernels()
    if options.kv_int8:  # the values' change of basis (kv_rotation.py), before anything reads them
        checkpoint = replace(checkpoint, source=rotated_values(checkpoint.source, cfg))
    embedding, bound = embedding_spec(checkpoint, options)
    max_len = min(options.max_seq_len or bound or cfg.max_position_embeddings,
                  cfg.max_position_embeddings)
    plan = ExportPlan.build(cfg, options, max_len, embedding, checkpoint.vision)
    if plan.vision is not None:  # its processor and tokens checked before anything is written
        images_spec(checkpoint, plan)
    bar = Progress(enabled=progress, total=2 + 1 + 1)
    try:
        with atomic_folder(out) as scratch:
            weights = write_folder(checkpoint, plan, scratch, bar.grow(plan.weight_modules))
            release_memory()
            tokenizer_files = checkpoint.write_tokenizer(scratch)
            parity = (validate(checkpoint, plan, scratch, weights.tensors, _write_tensors, bar)
                      if options.validate else mf.ParityReport(scope="skipped"))
            bar.stage("manifest")
            manifest = build_manifest(checkpoint, plan, scratch, parity, tokenizer_files,
                                      {mf.WEIGHTS: weights.sha256})
            (scratch / mf.MANIFEST).write_text(manifest.to_json(), encoding="utf-8")
            bar.advance(1)
    finally:
        bar.close()
    return out


__all__ = ["build_manifest", "embedding_spec", "export_model", "resolve_source", "resolve_target",
           "write_folder"]

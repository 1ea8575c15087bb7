"""The parity gate's scope: the whole model when torch and ONNX Runtime both fit in memory,
else a cut-down export of the same checkpoint (first layer, first vocabulary rows, first
experts), written by the same code. The comparison itself is validate.py's."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np

from llm_onnx import model_folder as mf
from llm_onnx.checkpoints.load import Checkpoint
from llm_onnx.checkpoints.vision import TOWERS
from llm_onnx.export.folder import release_memory
from llm_onnx.export.plan import ExportPlan
from llm_onnx.export.progress import Progress
from llm_onnx.export.validate import (
    compare,
    compare_logits,
    compute_in_float32,
    load_stored,
    run_engine,
    run_onnx,
    run_reference,
    thresholds,
)
from llm_onnx.export.validate_embeddings import (
    compare_embeddings,
    run_onnx_embeddings,
    run_reference_embeddings,
)
from llm_onnx.export.validate_images import compare_images
from llm_onnx.export.weights import StoredTensor
from llm_onnx.modeling.config import ModelConfig
from llm_onnx.modeling.gemma_vision_config import AnyVisionConfig
from llm_onnx.modeling.shapes import Shape, num_parameters

# Validate the whole model when the torch reference and ORT both fit comfortably in memory.
FULL_VALIDATION_PARAMS = 600_000_000
# The scratch model of the parity gate for large models: one layer of the real ones (Qwen3-8B's
# is 218M parameters, whose fp32 copies ORT's CPU kernels make from fp16 weights), 4096
# vocabulary rows, 8 experts; small enough to keep `export` of an 8B model under 3 GiB.
SCRATCH_LAYERS, SCRATCH_VOCAB, SCRATCH_EXPERTS = 1, 4096, 8

# (checkpoint, plan, folder, progress) -> the written tensors: how the pipeline writes a folder
WriteFolder = Callable[[Checkpoint, ExportPlan, Path, Progress], dict[str, StoredTensor]]


def validate(checkpoint: Checkpoint, plan: ExportPlan, folder: Path,
             tensors: dict[str, StoredTensor], write_folder: WriteFolder,
             progress: Progress) -> mf.ParityReport:
    """The parity report of the folder's graphs, or of a scratch export of the first layer
    (first vocabulary rows, first experts) when the model is too large to run twice in memory.
    ``plan.model`` receives the written tensors as the torch reference."""
    cfg = checkpoint.config
    progress.stage("validating")
    if num_parameters(cfg) <= FULL_VALIDATION_PARAMS:
        report = _compare_folder(plan, folder, tensors)
        scope = "whole model"
    else:
        small = _scratch_config(cfg)
        experts = small.moe.num_experts if small.moe is not None and cfg.moe is not None else None
        scratch_ckpt = replace(checkpoint, config=small,
                               source=_ScratchSource(checkpoint.source, small.vocab_size, experts,
                                                     cfg.embedding.hidden_size_per_layer_input))
        tower = _scratch_vision(plan.vision_config)
        small_plan = ExportPlan.build(small, plan.options, min(plan.max_len, 64), plan.embedding,
                                      tower)
        small_plan.calibration = plan.calibration  # layer 0's scales, the same tensors
        with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".llm-onnx-parity-") as tmp:
            scratch = Path(tmp)
            small_tensors = write_folder(scratch_ckpt, small_plan, scratch,
                                         Progress(enabled=False))
            release_memory()
            report = _compare_folder(small_plan, scratch, small_tensors)
        scope = (f"first {small.num_hidden_layers} layer(s), first {small.vocab_size} "
                 "vocabulary rows" + (f", first {experts} experts" if experts else "")
                 + (", first vision block" if tower is not None else "")
                 + "; same weights, same export code")
    progress.advance(1)
    if plan.embedding is not None:
        return mf.ParityReport(
            scope=scope, prompts=int(report["prompts"]),
            prompt_lengths=tuple(int(n) for n in report["prompt_lengths"]), decode_steps=0,
            thresholds={k: float(v) for k, v in report["thresholds"].items()},
            embeddings_max_abs_diff=report["embeddings_max_abs_diff"],
            embeddings_min_cosine=report["embeddings_min_cosine"])
    cuda = report.get("cuda") or {}
    return mf.ParityReport(
        cuda_relative_logits_diff=cuda.get("relative_logits_diff"),
        cuda_kl_divergence=cuda.get("kl_divergence"),
        cuda_greedy_agreement=cuda.get("greedy_agreement"),
        scope=scope, prompts=int(report["prompts"]),
        prompt_lengths=tuple(int(n) for n in report["prompt_lengths"]),
        decode_steps=int(report["decode_steps"]),
        thresholds={k: float(v) for k, v in report["thresholds"].items()},
        present_state_max_abs_diff=report.get("present_state_max_abs_diff"),
        vision_relative_diff=report.get("vision_relative_diff"),
        image_prompt_kl_divergence=report.get("image_prompt_kl_divergence"),
        image_prompt_greedy_agreement=report.get("image_prompt_greedy_agreement"),
        failures=tuple(report["failures"]), clear_agreement=report["clear_agreement"],
        **{k: float(report[k]) for k in ("logits_max_abs_diff", "logits_max_abs",
                                         "relative_logits_diff", "kl_divergence",
                                         "kl_max_position", "greedy_agreement",
                                         "present_kv_max_abs_diff")})


def _compare_folder(plan: ExportPlan, folder: Path, tensors: dict[str, StoredTensor]) -> dict:
    """Torch reference first (then freed), then ORT one session at a time."""
    cfg, options = plan.cfg, plan.options
    limits = thresholds(options)
    kv_dtype = np.int8 if options.kv_int8 else np.float16 if options.float16 else np.float32
    prefixes = tuple(TOWERS[plan.vision_config.kind][1]) if plan.vision_config else ()
    tower_tensors = {n: t for n, t in tensors.items() if prefixes and n.startswith(prefixes)}
    tensors = {n: t for n, t in tensors.items() if n not in tower_tensors}
    reference = compute_in_float32(load_stored(plan.model, folder / mf.WEIGHTS, tensors))
    if plan.embedding is not None:  # embed.onnx: one run, no cache, no CUDA engine path
        expected = run_reference_embeddings(reference, cfg.vocab_size)
        del reference
        release_memory()
        return compare_embeddings(expected, run_onnx_embeddings(folder, cfg.vocab_size), limits)
    strict = not options.allow_parity_failure
    torch_steps, fed = run_reference(reference, cfg.vocab_size)
    images = None
    if plan.vision is not None:  # vision.onnx, and a prompt with an image
        tower = compute_in_float32(load_stored(plan.vision, folder / mf.WEIGHTS, tower_tensors))
        images = compare_images(reference, tower, folder, kv_dtype, limits, strict)
        del tower
    del reference
    release_memory()
    onnx_steps = run_onnx(folder, cfg, kv_dtype, cfg.vocab_size, fed,
                          kernels=options.kernels == "llm_onnx", vision=plan.vision_config)
    report = compare(torch_steps, onnx_steps, limits, strict)
    if images is not None:
        report["failures"] += images.pop("failures")
        report.update(images)
    if options.cuda and _cuda_usable():
        from llm_onnx.runtime.core.engine import Engine, RuntimeOptions  # lazy: the GPU case only

        manifest = provisional_manifest(plan, folder)
        engine = Engine.from_manifest(manifest, RuntimeOptions(provider="cuda", verify=False))
        try:
            steps = run_engine(engine, cfg.vocab_size, fed)
        finally:
            del engine
            release_memory()
        report["cuda"] = compare_logits(torch_steps, steps, limits, "CUDA (the runtime's path)",
                                        strict)
        report["failures"] += [f"CUDA: {f}" for f in report["cuda"]["failures"]]
    return report


def _cuda_usable() -> bool:
    from llm_onnx.runtime.core.providers import cuda_status

    return cuda_status()[0]


def provisional_manifest(plan: ExportPlan, folder: Path) -> mf.Manifest:
    """What the runtime needs to load the graphs being checked (no tokenizer, no files list):
    the parity gate runs before the real manifest is written."""
    return mf.Manifest(
        name="parity", source=mf.SourceSpec("random", None), config=plan.cfg, num_parameters=0,
        context_length=plan.max_len, precision=plan.precision, graphs=plan.graph_specs,
        weights=mf.WeightsSpec(mf.WEIGHTS, 0), kv_cache=plan.kv_cache,
        tokenizer=mf.TokenizerSpec((), None, (), False, None, {}),
        generation=mf.GenerationDefaults(), parity=mf.ParityReport(scope="pending"), tools={},
        created="", files={}, recurrent_state=plan.recurrent_state, task=plan.options.task,
        embedding=plan.embedding, folder=folder)


class _ScratchSource:
    """A large checkpoint cut down for the parity gate: the first rows of the vocabulary and, for
    MoE, the first experts (router rows included; Gemma 4's stacked experts and per-expert
    scales too); Gemma 4's per-layer tables cut to the first layer's (the packed table's first
    P columns, the projection's first P rows); every other tensor unchanged."""

    def __init__(self, source, vocab: int, experts: int | None, per_layer: int = 0) -> None:
        self.source, self.vocab, self.experts = source, vocab, experts
        self.per_layer = per_layer  # Gemma 4's per-layer input width (0: none)

    def _cut(self, name: str) -> tuple[int | None, int | None]:
        """(rows, columns) kept of ``name`` (None: all)."""
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            return self.vocab, None
        if name == "model.embed_tokens_per_layer.weight":
            return self.vocab, self.per_layer or None
        if name == "model.per_layer_model_projection.weight":
            return self.per_layer or None, None
        if self.experts is not None and name.endswith((
                ".mlp.gate.weight", ".mlp.gate.bias", ".router.proj.weight",
                ".router.per_expert_scale", ".experts.gate_up_proj", ".experts.down_proj")):
            return self.experts, None
        return None, None

    def names(self):
        return self.source.names()

    def shape(self, name: str) -> Shape:
        shape, (rows, cols) = self.source.shape(name), self._cut(name)
        if rows is not None:
            shape = (rows, *shape[1:])
        return shape if cols is None else (shape[0], cols, *shape[2:])

    def get(self, name: str):
        t, (rows, cols) = self.source.get(name), self._cut(name)
        if rows is None and cols is None:
            return t
        return t[:rows, :cols].clone() if cols is not None else t[:rows].clone()

    def describe(self, name: str) -> str:
        return self.source.describe(name)


def _scratch_vision(vision: AnyVisionConfig | None) -> AnyVisionConfig | None:
    """The scratch model's tower: the first block (and the first DeepStack merger after it);
    its image token a row of the cut vocabulary (the image's embeddings replace it)."""
    if vision is None:
        return None
    if vision.kind != "qwen_vl":  # Gemma: the pad id, looked up there, stays in the vocabulary
        return vision.replace(num_hidden_layers=1, image_token_id=1)
    return vision.replace(depth=1, image_token_id=0, deepstack_visual_indexes=(
        (0,) if vision.deepstack_visual_indexes else ()))


def _scratch_config(cfg: ModelConfig) -> ModelConfig:
    layers = min(SCRATCH_LAYERS, cfg.num_hidden_layers)
    # what is given per layer is cut with the layers (kinds; SmolLM3's RoPE flags)
    kinds = cfg.layer_types[:layers] if cfg.layer_types is not None else None
    nope = cfg.positions.no_rope_layers
    rope = nope[:layers] if nope is not None else None
    small = cfg.replace(num_hidden_layers=layers, layer_types=kinds, no_rope_layers=rope,
                        vocab_size=min(SCRATCH_VOCAB, cfg.vocab_size),
                        num_kv_shared_layers=0)  # (Gemma 4's shared layers come last)
    if cfg.moe is not None and cfg.moe.num_experts > SCRATCH_EXPERTS:
        small = small.replace(moe=replace(cfg.moe, num_experts=SCRATCH_EXPERTS,
                                          num_experts_per_tok=min(cfg.moe.num_experts_per_tok,
                                                                  SCRATCH_EXPERTS // 2)))
    return small

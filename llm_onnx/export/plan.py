"""The export plan: everything decided before a weight is read, made once per export.

    plan = ExportPlan.build(cfg, options, max_len)
    plan.model        the weightless (meta-device) decoder, its modules swapped to export forms
                      (an EmbeddingDecoder, without LM head, for task embed)
    plan.producers    for each parameter, how to build it from checkpoint tensors (fused
                      projections, stacked experts), taken before the swap
    plan.vision       the vision tower's root (checkpoints/vision.py's, by the tower's kind) in
                      export forms, when the folder takes images; its graph is vision.onnx, its
                      tensors in the same weights
    plan.trace()      the prefill and decode graphs (or the embed graph), traced from plan.model
    plan.graph_specs  their inputs and outputs, from the traced programs in memory
    plan.precision    what the export does to the weights, read from the export-form modules
    plan.calibration  awq's scales and search weights (calibrate.py), set before writing

The same ``plan.model`` later receives the written tensors for the parity gate, so one decoder
serves the whole export (a second, small one for the parity gate's cut-down model of a large
checkpoint).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

import onnx_ir as ir
import torch
from torch import nn

from llm_onnx import model_folder as mf
from llm_onnx.checkpoints.load import Producer, param_producers
from llm_onnx.checkpoints.vision import build_vision, vision_producers
from llm_onnx.errors import ConfigError
from llm_onnx.export import kv_scales
from llm_onnx.export.calibrate import Calibration
from llm_onnx.export.graphs import GRAPHS, trace_embed, trace_graph, trace_vision
from llm_onnx.export.modules import (
    NBitsLinear,
    QuantEmbedding,
    QuantExperts,
    QuantGeGLUExperts,
    RoutedGeGLUExperts,
    to_export_form,
    vision_export_form,
)
from llm_onnx.export.options import ExportOptions
from llm_onnx.export.progress import Progress
from llm_onnx.modeling.attention import AttentionForm, attention_form, rotates_keys
from llm_onnx.modeling.config import ModelConfig
from llm_onnx.modeling.decoder import Decoder, Fusion
from llm_onnx.modeling.embedding import EmbeddingDecoder
from llm_onnx.modeling.gemma_vision_config import AnyVisionConfig, bidirectional_layers
from llm_onnx.modeling.linear_attention import state_shapes


def planned_attention(cfg: ModelConfig, options: ExportOptions,
                      vision: AnyVisionConfig | None = None) -> AttentionForm:
    """The attention form of an export: the fastest ONNX Runtime takes for the shape
    (attention.attention_form), or a slower one the options ask for, or the images need
    (Qwen's multimodal RoPE; Gemma's image layers run plain attention whatever the form)."""
    form = attention_form(cfg)
    if options.plain_attention and not form.plain:
        return AttentionForm("plain", "asked for (plain_attention)")
    if vision is not None and vision.mrope_section and form.rotary_inside:
        return AttentionForm("rotary outside", "multimodal RoPE turns each token by three "
                                               "positions, per-token tables RoPE takes alone")
    if form.rotary_inside and not options.fuse_rotary:
        return AttentionForm("rotary outside", "asked for (fuse_rotary off)")
    if form.rotary_inside and options.kv_int8 and any(
            rotates_keys(cfg.layer_head_dim(i)) for i in cfg.cache_layers):
        return AttentionForm("rotary outside", "an int8 KV cache keeps keys in the Hadamard "
                                               "basis, rotated after RoPE")
    return form


def check_kv_cache(cfg: ModelConfig, options: ExportOptions, form: AttentionForm,
                   vision: AnyVisionConfig | None = None) -> None:
    """ConfigError where an int8 KV cache (options.kv_cache) cannot be built for ``cfg``: it is
    GroupQueryAttention's (k_scale/v_scale inputs), so the plain form has none, and Gemma 4's
    KV-shared layers would need their source layer's scales (not built yet)."""
    if not options.kv_int8:
        return
    if form.plain:
        raise ConfigError(f"--kv-cache int8: this model's attention is exported in plain ONNX "
                          f"ops ({form.why}), and the int8 cache is GroupQueryAttention's. "
                          "Export it with --kv-cache float.")
    if vision is not None and bidirectional_layers(vision, cfg):
        raise ConfigError("--kv-cache int8: the layers where an image's tokens see each other "
                          "both ways run plain ONNX ops, and the int8 cache is "
                          "GroupQueryAttention's. Export it with --kv-cache float, or "
                          "--text-only.")
    if cfg.shares_kv:
        raise ConfigError("--kv-cache int8: KV-shared layers (Gemma 4) would quantize with "
                          "their source layer's scales, which is not built yet. Export it with "
                          "--kv-cache float.")
    if not cfg.attention_layers:
        raise ConfigError("--kv-cache int8: this model has no attention layer, so no KV cache "
                          "to quantize. Export it with --kv-cache float.")


@dataclass
class ExportPlan:
    cfg: ModelConfig
    options: ExportOptions
    max_len: int
    model: Decoder
    producers: dict[str, Producer]
    graphs: dict[str, ir.Model] = field(default_factory=dict)
    # awq's folds and search weights (calibrate.py), decided before the weights are written
    calibration: Calibration | None = None
    embedding: mf.EmbeddingSpec | None = None  # task embed: how embed.onnx pools
    # a folder that takes images: the tower's root in export forms and its producers
    vision: nn.Module | None = None
    vision_producers: dict[str, Producer] = field(default_factory=dict)

    @classmethod
    def build(cls, cfg: ModelConfig, options: ExportOptions, max_len: int,
              embedding: mf.EmbeddingSpec | None = None,
              vision: AnyVisionConfig | None = None) -> ExportPlan:
        """``embedding``: the pooling of an embedding export (options.task "embed");
        ``vision``: the tower beside the decoder of a folder that takes images."""
        if (options.task == "embed") != (embedding is not None):
            raise ValueError("an embedding export needs its EmbeddingSpec, and only it")
        dtype = torch.float16 if options.float16 else torch.float32
        form = planned_attention(cfg, options, vision)
        check_kv_cache(cfg, options, form, vision)
        fusion = Fusion(rotary=options.fuse_rotary and form.rotary_inside, qkv=options.fuse_qkv,
                        gate_up=options.fuse_gate_up, plain_attention=form.plain)
        with torch.device("meta"):
            model = Decoder(cfg, dtype=dtype, fusion=fusion, max_positions=max_len,
                            kv_int8=options.kv_int8, vision=vision) \
                if embedding is None else EmbeddingDecoder(
                    cfg, pooling=embedding.pooling, normalize=embedding.normalize, dtype=dtype,
                    fusion=fusion, max_positions=max_len)
        producers = dict(param_producers(model))  # by the eager modules' names, which stay
        plan = cls(cfg, options, max_len, to_export_form(model, options), producers,
                   embedding=embedding)
        if vision is not None:
            tower = build_vision(vision, dtype=dtype)
            plan.vision_producers = dict(vision_producers(tower))
            plan.vision = vision_export_form(tower, options)
        plan.precision  # read now: the parity gate later casts plan.model's tensors to float32
        return plan

    @property
    def vision_config(self) -> AnyVisionConfig | None:
        return self.vision.config if self.vision is not None else None

    def write_producers(self) -> dict[str, Producer]:
        """The producers the weights are written from: awq's folds applied, and its search
        weights handed to the quantized modules."""
        if self.calibration is None:
            return self.producers
        for path, module in self.model.named_modules():
            if isinstance(module, NBitsLinear):
                module.importance = self.calibration.importance.get(path)
            elif isinstance(module, QuantExperts):  # per expert: (E, K) for gate/up and down
                parts = {p: self.calibration.importance.get(f"{path}.{p}_proj")
                         for p in ("gate_up", "down")}
                module.importance = {p: h for p, h in parts.items() if h is not None}
            elif isinstance(module, QuantEmbedding) and module.search:  # tied to the head
                module.importance = self.calibration.importance.get("lm_head")
        return self.calibration.producers(self.producers)

    @property
    def weight_modules(self) -> int:
        """How many modules write tensors (the progress bar's steps)."""
        roots = [self.model] + ([self.vision] if self.vision is not None else [])
        return sum(1 for root in roots for m in root.modules() if _writes(m))

    def trace(self, progress: Progress) -> dict[str, ir.Model]:
        if isinstance(self.model, EmbeddingDecoder):
            progress.stage("tracing embed")
            self.graphs["embed"] = trace_embed(self.model)
            progress.advance(2)  # the steps of the two generation graphs
            return self.graphs
        for kind in GRAPHS:
            progress.stage(f"tracing {kind}")
            self.graphs[kind] = trace_graph(self.model, kind, all_logits=self.options.all_logits)
            progress.advance(1)
        if self.vision is not None:
            progress.stage("tracing vision")
            self.graphs["vision"] = trace_vision(self.vision)
        return self.graphs

    @property
    def graph_specs(self) -> dict[str, mf.GraphSpec]:
        """The traced graphs' inputs and outputs as the manifest states them."""

        def specs(values) -> tuple[mf.TensorSpec, ...]:
            return tuple(mf.TensorSpec(v.name, v.dtype.name.lower() if v.dtype else None,
                                       tuple(d if isinstance(d, int) else str(d) for d in v.shape))
                         for v in values)

        def logits(kind: str) -> str:
            if kind in ("embed", "vision"):
                return "none"
            return "all" if kind == "decode" or self.options.all_logits else "window"

        return {kind: mf.GraphSpec(f"{kind}.onnx", logits(kind), specs(graph.graph.inputs),
                                   specs(graph.graph.outputs))
                for kind, graph in self.graphs.items()}

    @property
    def kv_cache(self) -> mf.KVCacheSpec:
        """The cache the graphs read and write: one (B, Hkv, max_len, D) buffer per layer, in
        the graphs' compute dtype or int8 (embed.onnx: its attention's, kept for one run
        only)."""
        cfg = self.cfg
        form = planned_attention(cfg, self.options, self.vision_config)
        owners = cfg.cache_layers  # (Qwen3.5: not its linear layers; Gemma 4: not KV-shared ones)
        shapes = tuple(cfg.layer_kv_shape(i) for i in owners)
        uniform = all(s == (cfg.num_key_value_heads, cfg.head_dim) for s in shapes)
        sources = {str(i): cfg.kv_source(i) for i in range(cfg.num_hidden_layers)
                   if cfg.is_kv_shared(i)}
        scales = None
        if self.options.kv_int8:
            scales = kv_scales.DESCRIPTION + (f"; {self.calibration.description}"
                                              if self.calibration else "")
        return mf.KVCacheSpec(num_layers=cfg.num_hidden_layers,
                              num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                              dtype="int8" if self.options.kv_int8 else
                              "float16" if self.options.float16 else "float32", scales=scales,
                              attention=form.name, attention_why=form.why,
                              shared_buffer=self.embedding is None,
                              layers=None if len(owners) == cfg.num_hidden_layers else owners,
                              shapes=None if uniform else shapes, sources=sources or None)

    @property
    def recurrent_state(self) -> mf.RecurrentStateSpec | None:
        """The linear-attention layers' per-row state (None: a model without such layers)."""
        cfg = self.cfg
        if cfg.linear_attention is None:
            return None
        conv, recurrent = state_shapes(cfg.linear_attention)
        return mf.RecurrentStateSpec(kind="gated_delta", layers=cfg.linear_layers,
                                     conv_shape=conv, recurrent_shape=recurrent)

    @functools.cached_property
    def precision(self) -> mf.Precision:
        """What the export does, read from the export-form modules themselves."""
        options, cfg = self.options, self.cfg
        if not options.quantized:
            kind = "float16" if options.float16 else "float32"
            return mf.Precision(options.precision, weights=kind, activations=kind,
                                target=options.target or "cpu")
        quantized: list[str] = []
        activations: dict[str, list[str]] = {}
        for path, module in self.model.named_modules():
            if isinstance(module, NBitsLinear):
                act = "int8 per block" if module.accuracy_level == 4 else \
                    ("float16" if module.scales.dtype == torch.float16 else "float32")
                quantized.append(f"{path} (int{module.bits} {module.scheme}, block "
                                 f"{module.block_size}, activations {act})")
                activations.setdefault(act, []).append(path)
            elif isinstance(module, QuantGeGLUExperts):  # Gemma 4's experts, GPU
                quantized.append(f"{path} (int{module.bits} symmetric, every expert densely, "
                                 f"blocks {module.gate_up.block_size} and "
                                 f"{module.down.block_size})")
            elif isinstance(module, RoutedGeGLUExperts):  # Gemma 4's experts, CPU
                quantized.append(f"{path} (int{module.bits} symmetric, the chosen experts only, "
                                 f"blocks {module.gate_up[0].block_size} and "
                                 f"{module.down[0].block_size})")
            elif isinstance(module, (QuantEmbedding, QuantExperts)):
                experts = isinstance(module, QuantExperts)
                zp = experts and module.zero_points
                notes = (f", {'scales and zero points' if zp else 'scales'} searched with "
                         f"router-weighted activations" if experts and module.search else "")
                if experts and module.accuracy_level == 4:
                    notes += ", activations int8 per block"
                quantized.append(f"{path} (int{module.bits} "
                                 f"{'uint4 zero points' if zp else 'symmetric'}, block "
                                 f"{module.block_size}{notes})")
        if len(activations) == 1:
            acts = next(iter(activations))
        else:
            acts = "; ".join(f"{act} in {', '.join(summarise(paths))}"
                             for act, paths in activations.items())
        words = {"zero_point": f"uint{options.bits} zero points",
                 "offset": "float block minimums (Q4_1's form)", "symmetric": "symmetric"}
        kept = ["norms", ("router (router.proj)" if cfg.mlp.enable_moe_block else
                          "router (mlp.gate)") if cfg.moe else None,
                "shared expert gate (mlp.shared_expert_gate)"
                if cfg.moe and cfg.moe.shared_expert_intermediate_size else None,
                "linear attention's convolution, decay and beta (conv1d, A_log, dt_bias, "
                "in_proj_a, in_proj_b) and gated norm" if cfg.linear_attention else None,
                None if options.head_bits else
                "embedding" if self.embedding is not None else "embedding and lm_head",
                "position table (model.embed_positions)"
                if cfg.positions.position_embedding_type == "learned" else None,
                f"experts whose sizes no power-of-two block >= 16 divides "
                f"({', '.join(summarise(self.model.float_experts))})"
                if self.model.float_experts else None]
        return mf.Precision(
            options.precision, target=options.target or "cpu",
            weights=f"int{options.bits} per block of {options.block_size}, "
                    f"{words[options.scheme]}",
            activations=acts,
            quantization=mf.Quantization(
                bits=options.bits or 0, block_size=options.block_size, scheme=options.scheme,
                accuracy_level=options.activation_level, embedding_bits=options.head_bits,
                scale_search=options.method != "minmax", method=options.method,
                quantized_tensors=len(quantized),
                quantized=tuple(summarise(quantized)), kept_float=tuple(k for k in kept if k),
                experts=self.experts_quantization))

    @property
    def experts_quantization(self) -> mf.ExpertsQuantization | None:
        """The quantized experts' block (as asked for: each projection fits the largest power of
        two up to it, model_folder.fitting_block), scheme and activations; None without."""
        block = self.options.experts_block_size or self.options.block_size
        for module in self.model.modules():
            if isinstance(module, QuantExperts):
                return mf.ExpertsQuantization(
                    block_size=block, accuracy_level=module.accuracy_level,
                    scheme="zero_point" if module.zero_points else "symmetric")
            if isinstance(module, (QuantGeGLUExperts, RoutedGeGLUExperts)):
                first = module.gate_up if isinstance(module, QuantGeGLUExperts) \
                    else module.gate_up[0]
                return mf.ExpertsQuantization(block_size=block, scheme="symmetric",
                                              accuracy_level=first.accuracy_level)
        return None


def kernels_spec(model: torch.nn.Module) -> mf.KernelsSpec | None:
    """The operators of llm-onnx's kernel library the export forms in ``model`` emit."""
    from llm_onnx.kernels import DOMAIN, OPS_VERSION

    ops = sorted({m.kernel_op for m in model.modules() if getattr(m, "kernel_op", None)})
    return mf.KernelsSpec(DOMAIN, OPS_VERSION, tuple(ops)) if ops else None


def _writes(module: torch.nn.Module) -> bool:
    """Whether write_weights writes tensors for this module (see weights.py)."""
    return hasattr(module, "write_tensors") or any(True for _ in module.parameters(recurse=False))


def summarise(entries: list[str]) -> list[str]:
    """Collapse per-layer names: model.layers.N.self_attn.qkv_proj (...) once, as layers.*."""
    seen: list[str] = []
    for e in entries:
        generic = re.sub(r"layers\.\d+\.", "layers.*.", e)
        if generic not in seen:
            seen.append(generic)
    return seen

"""Export forms of the decoder's modules, swapped into a (meta-device) Decoder before tracing.
``weights.py`` builds their tensors from the eager modules' Hugging Face-layout tensors.

  Linear     -> MatMulLinear  (float: MatMul with W^T stored, the layout MatMul wants)
             -> NBitsLinear   (int8/int4: com.microsoft.MatMulNBits)
  lm_head    -> HeadLinear    (float: FusedMatMul with transB, so a tied head reads the embedding)
  Embedding  -> QuantEmbedding (com.microsoft.GatherBlockQuantized)
  Experts    -> QuantExperts   (com.microsoft.QMoE)
             -> KernelExperts  (--kernels llm_onnx: llm-onnx's own RoutedExperts, llm_onnx/kernels)
  RotaryCache -> RotaryTables  (the same tables, written rather than read)

Each export form writes its own tensors (``write_tensors``): weights.py only walks the modules.

The router (mlp.gate) stays float: routing decisions are sensitive and the matrix is small. So do
Qwen3.5's shared-expert gate (one row) and its linear attention's decay and beta projections
(in_proj_a, in_proj_b: one row per value head, read through exp and sigmoid).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from llm_onnx.export import kernel_experts, quant
from llm_onnx.export.options import ExportOptions
from llm_onnx.export.weights import (
    Produce,
    WeightFile,
    np_dtype,
    write_cast,
    write_experts_quantized,
    write_quantized,
)
from llm_onnx.model_folder import fitting_block
from llm_onnx.modeling import ops
from llm_onnx.modeling.decoder import Decoder
from llm_onnx.modeling.layers import Linear
from llm_onnx.modeling.mlp import Experts, GeGLUExperts
from llm_onnx.modeling.positions import RotaryCache, SinusoidalPositions, global_rope, local_rope

# Projections that stay float in quantized exports (see the module docstring).
KEPT_FLOAT = ("mlp.gate", "mlp.shared_expert_gate", "linear_attn.in_proj_a",
              "linear_attn.in_proj_b", "router.proj")  # (router.proj: Gemma 4's router)


class MatMulLinear(nn.Module):
    """y = x @ W^T + b with W^T (in, out) stored."""

    def __init__(self, n_in: int, n_out: int, bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(n_out, dtype=dtype), requires_grad=False) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = torch.matmul(x, self.weight)
        return y + self.bias if self.bias is not None else y

    def write_tensors(self, prefix: str, produce: Produce, wf: WeightFile,
                      written: dict[int, str]) -> None:
        w = produce(f"{prefix}weight")  # (out, in) as checkpoints store it
        wf.write(f"{prefix}weight", iter([w.t().to(self.weight.dtype).numpy()]),
                 (w.shape[1], w.shape[0]), np_dtype(self.weight.dtype))
        if self.bias is not None:
            write_cast(wf, f"{prefix}bias", produce(f"{prefix}bias"), self.bias.dtype)


class HeadLinear(nn.Module):
    """Logits = x @ E^T with E (V, D) in Hugging Face layout (FusedMatMul transB=1)."""

    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, x: Tensor) -> Tensor:
        return ops.matmul_transposed(x, self.weight)


class NBitsLinear(nn.Module):
    """Weight-only quantized linear: com.microsoft.MatMulNBits.

    ``scheme``: "symmetric" (no zero points), "zero_point" (uint8 zero points) or "offset"
    (float block minimums through a second, tiny term; see quant.quantize_offset).
    """

    def __init__(self, n_in: int, n_out: int, bias: bool, dtype: torch.dtype, bits: int,
                 block_size: int, accuracy_level: int, search: bool, scheme: str) -> None:
        super().__init__()
        self.k, self.n, self.bits, self.block_size = n_in, n_out, bits, block_size
        self.accuracy_level = accuracy_level  # ExportOptions.level_for(bits)
        self.search, self.scheme = search, scheme
        # per-input-channel weights of the block search (calibrate.py), set before writing
        self.importance: Tensor | None = None
        k_blocks = math.ceil(n_in / block_size)
        self.register_buffer("qweight", torch.empty(n_out, k_blocks, block_size * bits // 8,
                                                    dtype=torch.uint8))
        self.register_buffer("scales", torch.empty(n_out, k_blocks, dtype=dtype))
        self.register_buffer("zero_points", torch.empty(n_out, math.ceil(k_blocks * bits / 8),
                                                        dtype=torch.uint8)
                             if scheme != "symmetric" else None)
        if scheme == "offset":
            self.register_buffer("block_ones", torch.empty(n_in, k_blocks, dtype=dtype))
            self.register_buffer("minimums_t", torch.empty(k_blocks, n_out, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(n_out, dtype=dtype), requires_grad=False) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        if self.scheme == "offset":
            return quant.matmul_nbits_offset(
                x, self.qweight, self.scales, self.zero_points, self.block_ones, self.minimums_t,
                self.bias, self.k, self.n, self.bits, self.block_size, self.accuracy_level)
        return quant.matmul_nbits(x, self.qweight, self.scales, self.zero_points, self.bias, self.k,
                                  self.n, self.bits, self.block_size, self.accuracy_level)

    def write_tensors(self, prefix: str, produce: Produce, wf: WeightFile,
                      written: dict[int, str]) -> None:
        write_quantized(wf, prefix.rstrip("."), produce(f"{prefix}weight"), self.bits,
                        self.block_size, self.scales.dtype, self.search, self.scheme, flat=False,
                        importance=self.importance)
        if self.bias is not None:
            write_cast(wf, f"{prefix}bias", produce(f"{prefix}bias"), self.bias.dtype)


class QuantEmbedding(nn.Module):
    """Token embedding from a block-quantized table (com.microsoft.GatherBlockQuantized)."""

    def __init__(self, vocab: int, dim: int, dtype: torch.dtype, bits: int, block_size: int,
                 search: bool = False) -> None:
        super().__init__()
        self.dim, self.bits, self.block_size = dim, bits, block_size
        # a tied table is searched with the LM head's weights, so both keep one set of bytes
        self.search, self.importance = search, None
        k_blocks = math.ceil(dim / block_size)
        self.register_buffer("qweight", torch.empty(vocab, k_blocks * block_size * bits // 8,
                                                    dtype=torch.uint8))
        self.register_buffer("scales", torch.empty(vocab, k_blocks, dtype=dtype))

    def forward(self, ids: Tensor) -> Tensor:
        return quant.gather_nbits(self.qweight, ids, self.scales, self.dim, self.bits, self.block_size)

    def write_tensors(self, prefix: str, produce: Produce, wf: WeightFile,
                      written: dict[int, str]) -> None:
        write_quantized(wf, prefix.rstrip("."), produce(f"{prefix}weight"), self.bits,
                        self.block_size, self.scales.dtype, self.search, "symmetric", flat=True,
                        importance=self.importance)


class QuantExperts(nn.Module):
    """All experts of a layer, block-quantized for com.microsoft.QMoE (same row layout as Experts).

    Symmetric blocks, or with ``zero_points`` a 4-bit zero point per block (QMoE's
    fc1/fc2_zero_points, packed as the codes). ``search``: each block's scale (and zero point)
    is searched (symmetric: quant._search_scales over weights.EXPERT_FACTORS; zero points:
    quant.search_zero_point), weighted by ``importance`` when the calibration measured it:
    {"gate_up": (E, D), "down": (E, I)} router-weighted input statistics (calibrate.py)."""

    def __init__(self, experts: Experts, bits: int, block_size: int, search: bool = False,
                 accuracy_level: int = 0, zero_points: bool = False) -> None:
        super().__init__()
        e, two_i, d = experts.gate_up_proj.shape
        i = experts.down_proj.shape[-1]
        dtype = experts.gate_up_proj.dtype
        self.bits, self.block_size, self.search = bits, block_size, search
        self.accuracy_level = accuracy_level  # ExportOptions.experts_accuracy_level
        self.zero_points = zero_points  # ExportOptions.experts_scheme == "zero_point"
        self.importance: dict[str, Tensor] | None = None
        for part, rows, k in (("gate_up", two_i, d), ("down", d, i)):
            self.register_buffer(f"{part}_qweight",
                                 torch.empty(e, rows, k * bits // 8, dtype=torch.uint8))
            self.register_buffer(f"{part}_scales", torch.empty(e, rows, k // block_size,
                                                               dtype=dtype))
            if zero_points:  # (E, rows, ceil(blocks * bits / 8))
                self.register_buffer(f"{part}_zero_points", torch.empty(
                    e, rows, -(-(k // block_size) * bits // 8), dtype=torch.uint8))
        self.bias, self.activation = experts.bias, experts.activation
        if self.bias:  # gpt-oss: float biases beside the codes, as the float experts have them
            self.gate_up_proj_bias = nn.Parameter(torch.empty(e, two_i, dtype=dtype),
                                                  requires_grad=False)
            self.down_proj_bias = nn.Parameter(torch.empty(e, d, dtype=dtype), requires_grad=False)

    def forward(self, x: Tensor, router_logits: Tensor, k: int, normalize: bool) -> Tensor:
        biases = (self.gate_up_proj_bias, self.down_proj_bias) if self.bias else (None, None)
        zps = (self.gate_up_zero_points, self.down_zero_points) if self.zero_points \
            else (None, None)
        return quant.qmoe(x, router_logits, self.gate_up_qweight, self.gate_up_scales,
                          self.down_qweight, self.down_scales, k, normalize, self.bits,
                          self.block_size, self.accuracy_level, *biases, *self.activation, *zps)

    def write_tensors(self, prefix: str, produce: Produce, wf: WeightFile,
                      written: dict[int, str]) -> None:
        write_experts_quantized(wf, prefix.rstrip("."), self, produce)
        if self.bias:
            for part in ("gate_up_proj_bias", "down_proj_bias"):
                write_cast(wf, f"{prefix}{part}", produce(f"{prefix}{part}"),
                           getattr(self, part).dtype)


class KernelExperts(QuantExperts):
    """QuantExperts (same buffers, same bytes written) run by RoutedExperts: the top-k is
    taken in the graph, so norm_topk_prob False needs no scaling back (custom_ops.moe), and the
    activations are always int8 (the manifest says accuracy level 4)."""

    kernel_op = kernel_experts.OP

    def __init__(self, *args, **kwargs) -> None:
        kwargs["accuracy_level"] = 4
        super().__init__(*args, **kwargs)

    def forward(self, x: Tensor, router_logits: Tensor, k: int, normalize: bool) -> Tensor:
        probs = torch.softmax(router_logits.float(), dim=-1)  # (N, E)
        weight, index = torch.topk(probs, k, dim=-1)  # (N, K)
        if normalize:
            weight = weight / weight.sum(-1, keepdim=True)
        biases = (self.gate_up_proj_bias, self.down_proj_bias) if self.bias else (None, None)
        zps = (self.gate_up_zero_points, self.down_zero_points) if self.zero_points \
            else (None, None)
        return kernel_experts.routed_experts(
            x, index, weight, self.gate_up_qweight, self.gate_up_scales, self.down_qweight,
            self.down_scales, self.bits, self.block_size, "swiglu", True, *biases,
            *self.activation, *zps)


class _NBitsWeight(nn.Module):
    """A symmetric block-quantized (N, K) weight for com.microsoft.MatMulNBits (qweight, scales);
    written by the module holding it."""

    def __init__(self, k: int, n: int, dtype: torch.dtype, bits: int, block_size: int,
                 accuracy_level: int) -> None:
        super().__init__()
        self.k, self.n, self.bits, self.block_size = k, n, bits, block_size
        self.accuracy_level = accuracy_level
        k_blocks = math.ceil(k / block_size)
        self.register_buffer("qweight", torch.empty(n, k_blocks, block_size * bits // 8,
                                                    dtype=torch.uint8))
        self.register_buffer("scales", torch.empty(n, k_blocks, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        return quant.matmul_nbits(x, self.qweight, self.scales, None, None, self.k, self.n,
                                  self.bits, self.block_size, self.accuracy_level)


class QuantGeGLUExperts(nn.Module):
    """Gemma 4's experts, block-quantized (symmetric), run densely over every expert: one
    MatMulNBits for all experts' gate and up rows (D -> E * 2I), GeGLU, each expert's
    activations times its routing weight (zero for the experts a token did not choose), and one
    MatMulNBits for all experts' down projections side by side (E * I -> D), which sums the
    chosen ones. ONNX Runtime's QMoE has no GeGLU on the CPU; of the exact forms measured
    (docs/architectures.md, 26B-A4B's expert shape, E = 128, top 8, int4, one layer, 2 threads)
    this one took 25 ms a decode step and 132 ms for 16 tokens, gathering the chosen experts'
    rows dequantized (GatherBlockQuantized + MatMul) 51 and 689 ms."""

    def __init__(self, experts: GeGLUExperts, bits: int, block_up: int, block_down: int,
                 accuracy_level: int) -> None:
        super().__init__()
        e, two_i, d = experts.gate_up_proj.shape
        i = experts.width
        dtype = experts.gate_up_proj.dtype
        self.e, self.d, self.width, self.bits = e, d, i, bits
        self.gate_up = _NBitsWeight(d, e * two_i, dtype, bits, block_up, accuracy_level)
        self.down = _NBitsWeight(e * i, d, dtype, bits, block_down, accuracy_level)

    def forward(self, x: Tensor, index: Tensor, weight: Tensor) -> Tensor:
        """x (N, D), index (N, K), weight (N, K) fp32 -> (N, D) (GeGLUExperts.forward)."""
        n = x.shape[0]
        h = self.gate_up(x).reshape(n, self.e, 2 * self.width)  # (N, E, 2I)
        act = ops.fast_gelu(h[..., :self.width]) * h[..., self.width:]  # (N, E, I)
        routed = torch.zeros(n, self.e, dtype=weight.dtype, device=x.device).scatter(
            1, index, weight)  # (N, E), zero where not chosen
        act = (act.float() * routed[..., None]).to(x.dtype).reshape(n, self.e * self.width)
        return self.down(act)  # (N, D): the chosen experts' outputs, weighted, summed

    def write_tensors(self, prefix: str, produce: Produce, wf: WeightFile,
                      written: dict[int, str]) -> None:
        up = produce(f"{prefix}gate_up_proj")  # (E, 2I, D): every expert's rows, stacked
        write_quantized(wf, f"{prefix}gate_up", up.reshape(-1, up.shape[-1]), self.bits,
                        self.gate_up.block_size, self.gate_up.scales.dtype, False, "symmetric",
                        flat=False)
        del up
        down = produce(f"{prefix}down_proj")  # (E, D, I) -> (D, E * I): experts side by side
        write_quantized(wf, f"{prefix}down", down.permute(1, 0, 2).reshape(self.d, -1),
                        self.bits, self.down.block_size, self.down.scales.dtype, False,
                        "symmetric", flat=False)


class RoutedGeGLUExperts(nn.Module):
    """Gemma 4's experts, block-quantized (symmetric), each expert its own pair of MatMulNBits
    weights (gate_up.E: D -> 2I, down.E: I -> D), and only the chosen ones run: an If per expert
    in the graph (custom_ops.geglu_experts_nbits). The CPU's form: at 26B-A4B's expert shape it
    reads 8 of 128 experts a decode step (1.1 ms a layer against 13 ms densely) and prefills
    12x faster than QuantGeGLUExperts; the GPU keeps the dense form (no If round trips)."""

    def __init__(self, experts: GeGLUExperts, bits: int, block_up: int, block_down: int,
                 accuracy_level: int) -> None:
        super().__init__()
        e, two_i, d = experts.gate_up_proj.shape
        dtype, self.bits = experts.gate_up_proj.dtype, bits
        self.gate_up = nn.ModuleList(_NBitsWeight(d, two_i, dtype, bits, block_up,
                                                  accuracy_level) for _ in range(e))
        self.down = nn.ModuleList(_NBitsWeight(experts.width, d, dtype, bits, block_down,
                                               accuracy_level) for _ in range(e))

    def forward(self, x: Tensor, index: Tensor, weight: Tensor) -> Tensor:
        """x (N, D), index (N, K), weight (N, K) fp32 -> (N, D) (GeGLUExperts.forward)."""
        first = self.gate_up[0]
        return quant.geglu_experts_nbits(
            x, index, weight, [m.qweight for m in self.gate_up], [m.scales for m in self.gate_up],
            [m.qweight for m in self.down], [m.scales for m in self.down], self.bits,
            first.block_size, self.down[0].block_size, first.accuracy_level)

    def write_tensors(self, prefix: str, produce: Produce, wf: WeightFile,
                      written: dict[int, str]) -> None:
        for part, modules in (("gate_up", self.gate_up), ("down", self.down)):
            # an expert at a time: gate_up (2I, D), down (D, I), already MatMulNBits' (N, K)
            for e, w in enumerate(produce.experts(f"{prefix}{part}_proj")):
                m = modules[e]
                write_quantized(wf, f"{prefix}{part}.{e}", w, self.bits, m.block_size,
                                m.scales.dtype, False, "symmetric", flat=False)


class SinusoidalTable(SinusoidalPositions):
    """XGLM's position table in the graphs (model.embed_positions.weight): computed, not read
    from the checkpoint."""

    def write_tensors(self, prefix: str, produce: Produce, wf: WeightFile,
                      written: dict[int, str]) -> None:
        write_cast(wf, f"{prefix}weight", self.table(), torch.float32)


class RotaryTables(RotaryCache):
    """The RoPE tables in the graphs (model.rotary.cos_cache, sin_cache): computed, not read
    from the checkpoint."""

    def write_tensors(self, prefix: str, produce: Produce, wf: WeightFile,
                      written: dict[int, str]) -> None:
        cos, sin = self.tables()
        write_cast(wf, f"{prefix}cos_cache", cos, self.table_dtype)
        write_cast(wf, f"{prefix}sin_cache", sin, self.table_dtype)


def _set(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, attr = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, attr, module)


# the towers' first maps, from pixels: Qwen's, SigLIP's (Gemma 3), Gemma 4's
PATCH_EMBEDDINGS = ("patch_embed.proj", "embeddings.patch_embedding",
                    "patch_embedder.input_proj")


def vision_export_form(model: nn.Module, options: ExportOptions) -> nn.Module:
    """The vision tower's projections in export forms, in place: float (MatMulLinear), or
    quantized as the decoder's with ``options.quantize_vision`` in an int8/int4 export (the
    patch embedding, the pixels' first map, stays float either way)."""
    with torch.device("meta"):
        for path, module in list(model.named_modules()):
            if not isinstance(module, Linear):
                continue
            bits = options.bits if options.quantize_vision and not path.endswith(
                PATCH_EMBEDDINGS) else None
            bias, dtype = module.bias is not None, module.weight.dtype
            _set(model, path, MatMulLinear(module.in_features, module.out_features, bias, dtype)
                 if bits is None else NBitsLinear(
                     module.in_features, module.out_features, bias, dtype, bits,
                     options.block_size, options.level_for(bits), False, "symmetric"
                     if options.scheme == "offset" else options.scheme))
    return model


def to_export_form(model: Decoder, options: ExportOptions) -> Decoder:
    """Swap the eager modules of a meta-device Decoder for their export forms, in place."""
    with torch.device("meta"):
        return _swap_modules(model, options)


def _swap_modules(model: Decoder, options: ExportOptions) -> Decoder:
    bits = options.bits
    # experts whose sizes no power-of-two block >= 16 divides stay float (the plan's manifest
    # lists them): a valid checkpoint exports at every precision
    model.float_experts = []
    for path, module in list(model.named_modules()):
        if isinstance(module, Linear) and path != "lm_head":
            bias = module.bias is not None
            dtype = module.weight.dtype
            if bits is None or path.endswith(KEPT_FLOAT):
                new: nn.Module = MatMulLinear(module.in_features, module.out_features, bias, dtype)
            else:
                scheme = options.scheme
                if scheme == "offset" and module.in_features % options.block_size:
                    scheme = "zero_point"  # the offset term needs whole blocks along K
                new = NBitsLinear(module.in_features, module.out_features, bias, dtype, bits,
                                  options.block_size, options.level_for(bits),
                                  options.method != "minmax" and scheme == "zero_point", scheme)
            _set(model, path, new)
        elif isinstance(module, GeGLUExperts) and bits is not None:  # Gemma 4
            e, two_i, d = module.gate_up_proj.shape
            eb = options.experts_block_size or options.block_size
            up, down = fitting_block((d,), eb), fitting_block((two_i // 2,), eb)
            if up is None or down is None:
                model.float_experts.append(path)
                continue
            form = QuantGeGLUExperts if options.target == "cuda" else RoutedGeGLUExperts
            _set(model, path, form(module, bits, up, down, options.level_for(bits)))
        elif isinstance(module, Experts) and bits is not None:
            e, two_i, d = module.gate_up_proj.shape
            block = fitting_block((d, two_i // 2), options.experts_block_size
                                  or options.block_size)
            if block is None:
                model.float_experts.append(path)
                continue
            form = KernelExperts if options.kernels == "llm_onnx" else QuantExperts
            _set(model, path, form(module, bits, block, search=options.method == "awq",
                                   accuracy_level=options.experts_accuracy_level or 0,
                                   zero_points=options.experts_scheme == "zero_point"))
    cfg = model.config
    positions = cfg.positions
    if positions.position_embedding_type == "rope":
        model.model.rotary = RotaryTables(global_rope(cfg), model.max_positions, model.dtype)
        if positions.rope_local_theta is not None:  # Gemma 3's sliding layers
            model.model.rotary_local = RotaryTables(local_rope(cfg), model.max_positions,
                                                    model.dtype)
    if positions.position_embedding_type == "sinusoidal":
        table = model.model.embed_positions
        model.model.embed_positions = SinusoidalTable(table.rows, table.dim, table.zero_row)
    emb_bits = options.head_bits if bits is not None else None
    width = cfg.embed_width  # OPT-350m's embeddings are narrower than its layers
    emb_block = fitting_block((width,), options.block_size)
    if cfg.embedding.hidden_size_per_layer_input and emb_bits is not None:
        # Gemma 4's per-layer table (E2B: 262144 x 8960), quantized as the token table is
        per_layer = cfg.num_hidden_layers * cfg.embedding.hidden_size_per_layer_input
        block = fitting_block((per_layer,), options.block_size)
        if block is not None:
            model.model.embed_tokens_per_layer = QuantEmbedding(
                cfg.vocab_size, per_layer, model.dtype, emb_bits, block)
    head = hasattr(model, "lm_head")  # an embedding model has none
    if (emb_bits is None or emb_block is None) and head:
        model.lm_head = HeadLinear(model.lm_head.weight)  # tied: the embedding's own Parameter
    elif emb_bits is not None and emb_block is not None and not head:
        model.model.embed_tokens = QuantEmbedding(cfg.vocab_size, width, model.dtype, emb_bits,
                                                  emb_block)
    elif emb_bits is not None and emb_block is not None:
        # Symmetric, like the embedding: a tied head then shares the embedding's bytes. awq
        # searches the head's scales weighted by its input's activations (and a tied table's
        # with them, so the bytes stay shared).
        search = options.method == "awq"
        model.lm_head = NBitsLinear(width, cfg.vocab_size, False, model.dtype, emb_bits,
                                    emb_block, options.level_for(emb_bits), search, "symmetric")
        model.model.embed_tokens = QuantEmbedding(cfg.vocab_size, width, model.dtype,
                                                  emb_bits, emb_block,
                                                  search and cfg.tie_word_embeddings)
    return model

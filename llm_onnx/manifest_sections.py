"""The manifest's sections: frozen dataclasses, each one part of manifest.json (model_folder.py
holds the Manifest that gathers them, reads it and checks a folder). Imports neither torch nor
onnxruntime."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llm_onnx.modeling.gemma_vision_config import AnyVisionConfig

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
class KernelsSpec:
    """Operators of llm-onnx's own kernel library the graphs use (llm_onnx/kernels): a folder
    with them loads only where the library is built, at this operator version."""

    library: str  # the operators' domain, "llm_onnx"
    ops_version: str
    ops: tuple[str, ...]  # e.g. ("RoutedExperts",)


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
    # A folder that takes images: vision.onnx's embeddings against torch's (max|diff| relative
    # to their range) over test images, and a prompt with an image through the decoder (its
    # prefill and decode steps: mean KL, top-token agreement). Left out of the JSON without.
    vision_relative_diff: float | None = field(default=None, metadata={"omit_none": True})
    image_prompt_kl_divergence: float | None = field(default=None, metadata={"omit_none": True})
    image_prompt_greedy_agreement: float | None = field(default=None,
                                                        metadata={"omit_none": True})


@dataclass(frozen=True)
class ImagesSpec:
    """How a folder takes images: ``vision.onnx`` turns one image's patches (the image
    processor's output, ``processor``: its settings in transformers' names, read by
    ``llm_onnx.runtime.media.image_processor_from_dict``) into the embeddings of its soft
    tokens, which prefill.onnx places where the prompt holds ``image_token_id``. The chat
    template writes ``placeholder`` per image part; the runtime expands it to the image's
    tokens (with ``vision_start_token_id`` / ``vision_end_token_id`` around them, which the
    template writes). ``weights``: what the tower's projections store, in words."""

    vision: AnyVisionConfig  # its kind: qwen_vl, gemma3, gemma4
    processor: dict[str, Any]
    image_token_id: int
    placeholder: str
    image_token: str
    weights: str
    vision_start_token_id: int | None = None
    vision_end_token_id: int | None = None
    # the tokenizer's names of the family's image tokens where tokenizer_config.json renames
    # them (``image_token``; Gemma's ``boi_token``, ``eoi_token``)
    token_names: dict[str, str] | None = None


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

"""ExportOptions: how a model is compiled (precision, quantization, fusions, context length)."""

from __future__ import annotations

from dataclasses import dataclass

from llm_onnx.errors import ConfigError
from llm_onnx.model_folder import POOLINGS, TASKS

PRECISIONS = ("fp32", "fp16", "int8", "int4")
TARGETS = ("cpu", "cuda")
QUANT_METHODS = ("minmax", "search", "awq")
KV_CACHES = ("float", "int8")
KERNELS = ("ort", "llm_onnx")
# On the CPU, a checkpoint whose fp32 weights take at most this many bytes exports at fp32 unless
# told otherwise: fp32 still decodes at reading speed there (SmolLM2-135M, 540 MB: 39 tok/s on
# 2 cores), while quantizing so small a model costs answers (the README's question loops at int8
# and int4: docs/quantization.md#small-models-that-answer).
SMALL_FP32_BYTES = 1 << 30


def default_precision(cfg, *, cuda: bool) -> str | None:
    """The precision of an export that names none: fp16 for a usable CUDA GPU; on the CPU fp32
    for a checkpoint of at most SMALL_FP32_BYTES of fp32 weights (``cfg``: its ModelConfig),
    else int8. None when that depends on ``cfg`` and it is not known yet (None)."""
    if cuda:
        return "fp16"
    if cfg is None:
        return None
    from llm_onnx.modeling.shapes import num_parameters

    return "fp32" if 4 * num_parameters(cfg) <= SMALL_FP32_BYTES else "int8"


@dataclass(frozen=True, kw_only=True)
class ExportOptions:
    """Args:
        precision: fp32 | fp16 | int8 | int4. int8/int4 quantize the weights (MatMulNBits);
            the activations are quantized to int8 on the fly where accuracy_level is 4.
        block_size: quantization block along the input dimension (power of two >= 16).
        embedding_bits: precision of the token embedding and LM head in quantized exports:
            8, 4, None to keep them float, or "auto" (the default): 4 for int4 with zero points
            on CPU (the LM head is a fifth of a small model's bytes; its scales are searched
            with the activations under awq), else 8. Tied embeddings share one table.
        accuracy_level: MatMulNBits accuracy_level of 4-bit projections: 4 = int8 activations
            (fastest on CPU), 0 = fp32 activations. Default (CPU): 0 with the offset scheme (it
            then reproduces a Q4_1 checkpoint's greedy output exactly), else 4. 8-bit weights
            always use 4: ONNX Runtime has no fast fp32-activation kernel for them.
        experts_accuracy_level: QMoE accuracy_level of a mixture of experts' quantized experts
            on CPU: 4 = int8 activations, 0 = fp32 activations. Default (None): 4 on CPU (the
            QMoE CPU kernel dequantizes every chosen expert's blocks to float at 0: Qwen3-30B-A3B
            decodes 1.9x faster at 4, for 1.5% more KL on a real model; docs/moe.md), 0 for
            CUDA, which ignores it.
        experts_block_size: the quantization block of a mixture of experts' experts. Default
            (None): 64 for 4-bit zero-point experts on CPU when ``block_size`` is the default
            32 (the int8-activation kernel repacks experts into 0.75 bytes a weight at block
            32 against 0.625 at 64: Qwen3-30B-A3B in 18.5 GiB instead of about 22; zero points
            bring block 64's KL to symmetric block 32's), else ``block_size``.
        experts_scheme: how experts' blocks are stored: "zero_point" (a 4-bit zero point per
            block, QMoE's fc*_zero_points; CPU, 4-bit) or "symmetric". Default (None):
            zero_point for 4-bit experts on CPU, symmetric otherwise and for MXFP4 checkpoints'
            experts (gpt-oss), whose blocks are symmetric already (``resolve_source``).
        max_seq_len: context length the graphs support (RoPE tables); default: the config's.
        fuse_qkv, fuse_gate_up, fuse_rotary: fused projections and RoPE inside attention.
        plain_attention: attention in plain ONNX ops even where GroupQueryAttention takes the
            shape (it is chosen by itself where not: attention.attention_form). Slower; for
            measuring that form and for a kernel one suspects.
        all_logits: the prefill graph returns logits for every position, not only the last.
        quant_scheme: how projections are quantized: "zero_point" (per-block uint8 zero points,
            the whole code range for one-sided blocks), "offset" (a float minimum per block added
            by a tiny second term: exact for Q4_1 GGUF weights, slower) or "symmetric". Default
            (``resolve_source``): offset for int4 from an already 4-bit GGUF (Q4_0, Q4_1, Q4_K)
            exported for CPU, else zero_point. The embedding/LM head stay symmetric so a tied
            pair shares its bytes.
        quant_method: how each block's scale and zero point are chosen: "minmax" (the block's
            range), "search" (weighted least-squares search over candidate scales), "awq"
            (activation-aware: a calibration text run through the model one layer at a time;
            per-channel scales folded into the preceding norm or projection and the search
            weighted by each channel's activations; see calibrate.py). Default: awq for int4
            from a float source, else minmax.
        calibration_text: the text file awq and an int8 KV cache calibrate on (its first 512
            tokens, 3,072 with an int8 KV cache; default: a built-in text).
        kv_cache: how the KV cache stores keys and values: "float" (the graphs' compute
            dtype) or "int8": a quarter of float32's bytes, per-channel scales (one per KV head
            and channel, per layer) calibrated at export on the calibration text and applied
            by GroupQueryAttention (x * (1/s) rounded to int8 on write, int8 * s on read;
            docs/notes/kv-int8-gqa.md); where the head size is a power of two, keys (after
            RoPE) and values are stored in the Hadamard basis (kv_rotation.py). Needs the
            GroupQueryAttention forms (not plain attention) and the CPU target for now.
        kernels: whose operators run what ONNX Runtime's CPU op set does poorly: "ort" (its own
            only) or "llm_onnx" (llm-onnx's kernel library, which must be built: Qwen3-MoE-style
            experts run as RoutedExperts instead of QMoE, always with int8 activations; the
            manifest records it and the folder needs the library to load; docs/kernels.md).
        validate: run the ORT vs torch parity gate after writing.
        allow_parity_failure: keep a folder the parity gate finds broken (its figures and the
            reasons go into the manifest's parity report) instead of refusing it.
        task: "generate" (prefill.onnx and decode.onnx: next-token logits over a KV cache) or
            "embed" (embed.onnx: one pooled, maybe normalised, vector per text; no LM head, no
            cache; how it pools is read from the checkpoint: checkpoints/pooling.py).
        pooling, normalize: an embedding export's pooling ("last", "mean", "cls") and L2
            normalisation, instead of what the checkpoint's files say.
        quantize_vision: an int8/int4 export quantizes the vision tower's projections as the
            decoder's (MatMulNBits). Default: the tower keeps float weights (float32, float16
            for fp16 and CUDA exports): a prompt's image tokens all come from it, and its
            weights are a small share of a model's (docs/images.md has the figures).
        target: the execution provider the folder is built for. "cpu": quantized projections
            compute in float32 (or int8 at accuracy_level 4). "cuda": every compute node has a
            CUDA kernel, so quantized folders compute in float16 (GroupQueryAttention and QMoE
            have no float32 CUDA kernels; accuracy_level is ignored there) and fp32 or ALiBi
            models are refused. None: "cuda" when a usable CUDA GPU is present at export time.
    """

    precision: str = "int8"
    block_size: int = 32
    embedding_bits: int | str | None = "auto"
    accuracy_level: int | None = None
    experts_accuracy_level: int | None = None
    experts_block_size: int | None = None
    experts_scheme: str | None = None
    max_seq_len: int | None = None
    fuse_qkv: bool = True
    fuse_gate_up: bool = True
    fuse_rotary: bool = True
    plain_attention: bool = False
    all_logits: bool = False
    quant_scheme: str | None = None
    quant_method: str | None = None
    calibration_text: str | None = None
    validate: bool = True
    allow_parity_failure: bool = False
    target: str | None = None
    task: str = "generate"
    pooling: str | None = None
    normalize: bool | None = None
    kv_cache: str = "float"
    kernels: str = "ort"
    quantize_vision: bool = False

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision {self.precision!r} is not supported; choose one of "
                              f"{', '.join(PRECISIONS)}.")
        bs = self.block_size
        if bs < 16 or bs & (bs - 1):
            raise ConfigError(f"block_size {bs} must be a power of two >= 16 (e.g. 32, 64, 128).")
        ebs = self.experts_block_size
        if ebs is not None and (ebs < 16 or ebs & (ebs - 1)):
            raise ConfigError(f"experts_block_size {ebs} must be a power of two >= 16 (e.g. 32, "
                              f"64, 128).")
        if self.embedding_bits not in (None, 4, 8, "auto"):
            raise ConfigError(f"embedding_bits must be 8, 4, None or 'auto', got "
                              f"{self.embedding_bits!r}.")
        if self.accuracy_level not in (None, 0, 1, 2, 3, 4):
            raise ConfigError(f"accuracy_level must be 0-4, got {self.accuracy_level}.")
        if self.experts_accuracy_level not in (None, 0, 4):
            raise ConfigError(f"experts_accuracy_level must be 0 (fp32 activations) or 4 (int8 "
                              f"activations), got {self.experts_accuracy_level}.")
        if self.experts_accuracy_level == 4 and self.precision not in ("int8", "int4"):
            raise ConfigError(f"experts_accuracy_level 4 applies to quantized experts (QMoE): "
                              f"export int4 or int8, not {self.precision}.")
        if self.experts_scheme not in (None, "zero_point", "symmetric"):
            raise ConfigError(f"experts_scheme must be zero_point or symmetric, got "
                              f"{self.experts_scheme!r}.")
        if self.experts_scheme == "zero_point" and (self.precision != "int4" or self.target == "cuda"):
            raise ConfigError("experts_scheme zero_point is a form of 4-bit experts on the CPU "
                              "(ONNX Runtime's QMoE with zero points is checked there only): "
                              "export --precision int4 --target cpu, or drop --experts-scheme.")
        if self.quant_scheme not in (None, "symmetric", "zero_point", "offset"):
            raise ConfigError(f"quant_scheme must be symmetric, zero_point or offset, got "
                              f"{self.quant_scheme!r}.")
        if self.quant_method not in (None, *QUANT_METHODS):
            raise ConfigError(f"quant_method must be one of {', '.join(QUANT_METHODS)}, got "
                              f"{self.quant_method!r}.")
        if self.quant_method in ("search", "awq") and self.quant_scheme in ("offset", "symmetric"):
            raise ConfigError(f"quant_method {self.quant_method} searches a scale and an integer "
                              f"zero point per block: use it with quant_scheme zero_point (the "
                              f"{self.quant_scheme} scheme rounds the block's own range).")
        if self.target not in (None, *TARGETS):
            raise ConfigError(f"target must be one of {', '.join(TARGETS)}, got {self.target!r}.")
        if self.target == "cuda" and self.precision == "fp32":
            raise ConfigError("precision fp32 cannot run wholly on CUDA: ONNX Runtime's "
                              "GroupQueryAttention has float16/bfloat16 CUDA kernels only. Export "
                              "fp16, int8 or int4 for a GPU (or --target cpu).")
        if self.target == "cuda" and self.accuracy_level == 4:
            raise ConfigError("accuracy_level 4 (int8 activations) is a CPU kernel option; the CUDA "
                              "MatMulNBits ignores it. Leave it unset with --target cuda.")
        if self.target == "cuda" and self.experts_accuracy_level == 4:
            raise ConfigError("experts_accuracy_level 4 (int8 activations) is a CPU kernel option; "
                              "the CUDA QMoE ignores it. Leave it unset with --target cuda.")
        if self.task not in TASKS:
            raise ConfigError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}.")
        if self.pooling not in (None, *POOLINGS):
            raise ConfigError(f"pooling must be one of {', '.join(POOLINGS)}, got "
                              f"{self.pooling!r}.")
        if self.task != "embed" and (self.pooling is not None or self.normalize is not None):
            raise ConfigError("pooling and normalize choose how an embedding model pools: use "
                              "them with task embed (--task embed).")
        if self.task == "embed" and self.all_logits:
            raise ConfigError("all_logits is for generation graphs; an embedding export "
                              "(task embed) returns no logits.")
        if self.kv_cache not in KV_CACHES:
            raise ConfigError(f"kv_cache must be one of {', '.join(KV_CACHES)}, got "
                              f"{self.kv_cache!r}.")
        if self.kv_int8 and self.task == "embed":
            raise ConfigError("kv_cache int8 quantizes a generation model's KV cache; an "
                              "embedding export (task embed) has none. Drop --kv-cache int8.")
        if self.kv_int8 and self.plain_attention:
            raise ConfigError("kv_cache int8 is applied by ONNX Runtime's GroupQueryAttention; "
                              "plain_attention exports attention without it. Drop one of "
                              "--plain-attention and --kv-cache int8.")
        if self.kv_int8 and self.target == "cuda":
            raise ConfigError("kv_cache int8 is checked on the CPU only so far (ONNX Runtime's "
                              "CUDA GroupQueryAttention has int8-cache kernels not yet run "
                              "here). Export with --target cpu, or with --kv-cache float for "
                              "CUDA.")
        if self.kernels not in KERNELS:
            raise ConfigError(f"kernels must be one of {', '.join(KERNELS)}, got {self.kernels!r}.")
        if self.kernels == "llm_onnx" and (not self.quantized or self.cuda):
            raise ConfigError("kernels llm_onnx runs quantized experts on the CPU: export int4 or "
                              "int8 for --target cpu, or drop --kernels.")
        if self.quantize_vision and not self.quantized:
            raise ConfigError("quantize_vision quantizes the vision tower as an int8/int4 "
                              f"export's projections; a {self.precision} export keeps it float.")
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise ConfigError(f"max_seq_len must be at least 2, got {self.max_seq_len}.")

    @property
    def kv_int8(self) -> bool:
        return self.kv_cache == "int8"

    @property
    def quantized(self) -> bool:
        return self.precision in ("int8", "int4")

    @property
    def cuda(self) -> bool:
        return self.target == "cuda"

    @property
    def float16(self) -> bool:
        """Whether the graphs compute in float16 (fp16 exports; quantized exports for CUDA)."""
        return self.precision == "fp16" or (self.quantized and self.cuda)

    @property
    def activation_level(self) -> int:
        """The accuracy_level 4-bit projections get (8-bit ones get 4 on CPU: see NBitsLinear)."""
        if self.accuracy_level is not None:
            return self.accuracy_level
        if self.cuda:
            return 0
        return 0 if self.precision == "int4" and self.scheme == "offset" else 4

    def level_for(self, bits: int) -> int:
        """MatMulNBits accuracy_level of a projection with ``bits``-bit weights. On CPU, 8-bit
        weights always get 4: ONNX Runtime has no fast float-activation CPU kernel for them (the
        unpacked fallback measured 50x slower). CUDA ignores the attribute; 0 keeps the CPU
        parity run of a CUDA folder in float."""
        if self.cuda:
            return 0
        return 4 if bits == 8 else self.activation_level

    @property
    def int8_activations(self) -> bool:
        """Whether some MatMulNBits quantizes its activations to int8 (adds rounding noise)."""
        if self.cuda:  # fp16 activations; only the CPU parity run of 8-bit QMoE quantizes them
            return self.bits == 8
        return self.quantized and (self.bits == 8 or self.head_bits == 8
                                   or self.activation_level == 4
                                   or self.experts_accuracy_level == 4
                                   or self.kernels == "llm_onnx")

    @property
    def scheme(self) -> str:
        # offset only when asked for, or chosen by resolve_source for an already 4-bit GGUF;
        # zero_point is one MatMulNBits per projection, the fast path of the CPU and CUDA kernels
        return self.quant_scheme if self.quant_scheme is not None else "zero_point"

    @property
    def head_bits(self) -> int | None:
        """Bits of the embedding and LM head (``embedding_bits`` with "auto" decided)."""
        if self.embedding_bits != "auto":
            return self.embedding_bits  # type: ignore[return-value]
        if self.precision == "int4" and self.scheme == "zero_point" and not self.cuda:
            return 4
        return 8

    @property
    def method(self) -> str:
        if self.quant_method is not None:
            return self.quant_method
        return "awq" if self.precision == "int4" and self.scheme == "zero_point" else "minmax"

    @property
    def bits(self) -> int | None:
        return {"int8": 8, "int4": 4}.get(self.precision)

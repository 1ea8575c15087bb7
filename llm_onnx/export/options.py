"""ExportOptions: how a model is compiled (precision, quantization, fusions, context length)."""

from __future__ import annotations

from dataclasses import dataclass

from llm_onnx.errors import ConfigError

PRECISIONS = ("fp32", "fp16", "int8", "int4")
TARGETS = ("cpu", "cuda")


@dataclass(frozen=True, kw_only=True)
class ExportOptions:
    """Args:
        precision: fp32 | fp16 | int8 | int4. int8/int4 quantize the weights (MatMulNBits);
            the activations are quantized to int8 on the fly where accuracy_level is 4.
        block_size: quantization block along the input dimension (power of two >= 16).
        embedding_bits: precision of the token embedding and LM head in quantized exports:
            8 (default; tied embeddings then share one int8 table) or None to keep them float.
        accuracy_level: MatMulNBits accuracy_level of 4-bit projections: 4 = int8 activations
            (fastest on CPU), 0 = fp32 activations. Default: 0 for int4 (with the offset scheme
            it reproduces a Q4_1 checkpoint's greedy output exactly). 8-bit weights always use
            4: ONNX Runtime has no fast fp32-activation kernel for them.
        max_seq_len: context length the graphs support (RoPE tables); default: the config's.
        fuse_qkv, fuse_gate_up, fuse_rotary: fused projections and RoPE inside attention.
        all_logits: the prefill graph returns logits for every position, not only the last.
        quant_scheme: how projections are quantized: "zero_point" (per-block uint8 zero points,
            the whole code range for one-sided blocks), "offset" (a float minimum per block added
            by a tiny second term: exact for Q4_1 GGUF weights, slower) or "symmetric". Default:
            zero_point for int8 and for CUDA targets, offset for int4 on CPU. The embedding/LM head stay symmetric so a tied
            pair shares its bytes.
        quant_search: per-block search for the scale with the least squared error.
        validate: run the ORT vs torch parity gate after writing.
        target: the execution provider the folder is built for. "cpu": quantized projections
            compute in float32 (or int8 at accuracy_level 4). "cuda": every compute node has a
            CUDA kernel, so quantized folders compute in float16 (GroupQueryAttention and QMoE
            have no float32 CUDA kernels; accuracy_level is ignored there) and fp32 or ALiBi
            models are refused. None: "cuda" when a usable CUDA GPU is present at export time.
    """

    precision: str = "int8"
    block_size: int = 32
    embedding_bits: int | None = 8
    accuracy_level: int | None = None
    max_seq_len: int | None = None
    fuse_qkv: bool = True
    fuse_gate_up: bool = True
    fuse_rotary: bool = True
    all_logits: bool = False
    quant_scheme: str | None = None
    quant_search: bool = True
    validate: bool = True
    target: str | None = None

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision {self.precision!r} is not supported; choose one of "
                              f"{', '.join(PRECISIONS)}.")
        bs = self.block_size
        if bs < 16 or bs & (bs - 1):
            raise ConfigError(f"block_size {bs} must be a power of two >= 16 (e.g. 32, 64, 128).")
        if self.embedding_bits not in (None, 4, 8):
            raise ConfigError(f"embedding_bits must be 8, 4 or None, got {self.embedding_bits!r}.")
        if self.accuracy_level not in (None, 0, 1, 2, 3, 4):
            raise ConfigError(f"accuracy_level must be 0-4, got {self.accuracy_level}.")
        if self.quant_scheme not in (None, "symmetric", "zero_point", "offset"):
            raise ConfigError(f"quant_scheme must be symmetric, zero_point or offset, got "
                              f"{self.quant_scheme!r}.")
        if self.target not in (None, *TARGETS):
            raise ConfigError(f"target must be one of {', '.join(TARGETS)}, got {self.target!r}.")
        if self.target == "cuda" and self.precision == "fp32":
            raise ConfigError("precision fp32 cannot run wholly on CUDA: ONNX Runtime's "
                              "GroupQueryAttention has float16/bfloat16 CUDA kernels only. Export "
                              "fp16, int8 or int4 for a GPU (or --target cpu).")
        if self.target == "cuda" and self.accuracy_level == 4:
            raise ConfigError("accuracy_level 4 (int8 activations) is a CPU kernel option; the CUDA "
                              "MatMulNBits ignores it. Leave it unset with --target cuda.")
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise ConfigError(f"max_seq_len must be at least 2, got {self.max_seq_len}.")

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
        return 0 if self.precision == "int4" else 4

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
        return self.quantized and (self.bits == 8 or self.embedding_bits == 8
                                   or self.activation_level == 4)

    @property
    def scheme(self) -> str:
        if self.quant_scheme is not None:
            return self.quant_scheme
        if self.cuda:  # one MatMulNBits per projection: the CUDA kernels' fast path
            return "zero_point"
        return "offset" if self.precision == "int4" else "zero_point"

    @property
    def bits(self) -> int | None:
        return {"int8": 8, "int4": 4}.get(self.precision)

"""llm-onnx against onnxruntime-genai, llama.cpp and transformers on the same weights and the same
prompt token ids: `python -m benchmarks.peers` (docs/benchmarks.md). The systems' steps run in
their own venvs as `python -m benchmarks.peers.worker STEP`, so this package imports only the
standard library at module level."""

PRECISIONS = ["fp32", "int8", "int4"]
LLAMA_MATCH = {"fp32": "f32", "int8": "q8_0", "int4": "Q4_1"}
# --shape: llama.cpp's int4 is Q4_0 quantized from the F32 GGUF (there is no Q4_1 original)
LLAMA_MATCH_SHAPE = {"fp32": "f32", "int8": "q8_0", "int4": "q4_0"}
OURS, GENAI, LLAMA, HF = "llm-onnx", "onnxruntime-genai", "llama.cpp", "transformers"


def llama_match(args) -> dict[str, str]:
    """Our precision -> llama.cpp's file type compared with it, in this run's variant."""
    return LLAMA_MATCH_SHAPE if getattr(args, "shape", None) else LLAMA_MATCH

"""The embeddable runtime: ONNX Runtime + numpy + tokenizers only (never torch)."""

"""`llm-onnx serve` measured: under N streaming clients against llama-server (load), an hour of
mixed traffic (soak), structured output's cost and coverage (structured)."""

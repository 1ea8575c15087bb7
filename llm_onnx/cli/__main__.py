"""`python -m llm_onnx.cli`."""

from llm_onnx.cli import main

main()

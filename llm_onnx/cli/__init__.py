"""llm-onnx command line: a thin layer over the library (each command wraps one function).

Heavy imports (torch, onnxruntime) happen inside the commands, so `--help` stays instant.

  app.py           the `llm-onnx` group, one-line errors
  exporting.py     export (and --config/--checkpoint resolution, the re-exec for huge pages)
  generating.py    generate (sampling and chat-template options)
  chatting.py      chat (the prompt: line editing, history, Ctrl-C, commands)
  serving.py       serve (in process or on Ray Serve)
  embedding.py     embed (an embedding model's vectors, as JSON)
  benchmarking.py  bench
  listing.py       models (the exported folders: list, rm)
"""

# the command modules add their commands to `main` when imported
from llm_onnx.cli import (  # noqa: F401
    benchmarking,
    chatting,
    embedding,
    exporting,
    generating,
    listing,
    serving,
)
from llm_onnx.cli.app import main
from llm_onnx.cli.exporting import resolve_checkpoint
from llm_onnx.cli.generating import _TemplateVar

__all__ = ["main", "resolve_checkpoint", "_TemplateVar"]

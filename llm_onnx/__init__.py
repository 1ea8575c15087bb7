"""llm-onnx: decoder-only LLMs defined in torch, compiled to ONNX, run on ONNX Runtime.

Layers, each importing only those before it (tests/test_layering.py holds them to it):
``model_folder`` (the typed manifest of an exported folder; no torch, no onnxruntime),
``model`` (the torch decoder: config, modules, custom ops with their reference math),
``families`` (one module per model family: config.json mapping, tensor names, presets),
``checkpoints`` (safetensors, GGUF and random weights into a model), ``export`` (torch -> ONNX,
quantization, the parity gate), ``runtime`` (ONNX Runtime generation, batching; never imports
torch) and ``serve`` (the OpenAI-compatible server). Importing this package imports nothing heavy.
"""

__version__ = "0.1.0"

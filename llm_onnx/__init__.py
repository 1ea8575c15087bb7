"""llm-onnx: decoder-only LLMs defined in torch, compiled to ONNX, run on ONNX Runtime.

Sub-packages: ``build_model`` (torch decoder and checkpoint loading), ``export`` (torch -> ONNX),
``runtime`` (ONNX Runtime generation; never imports torch), ``models`` (named presets).
Importing this package imports nothing heavy.
"""

__version__ = "0.1.0"

"""torch -> ONNX: ``export_model(checkpoint, out, ExportOptions(...))``."""

from llm_onnx.export.export import export_model
from llm_onnx.export.options import ExportOptions

__all__ = ["ExportOptions", "export_model"]

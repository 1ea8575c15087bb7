"""torch -> ONNX: ``export_model(checkpoint, out, ExportOptions(...))``.

Names are imported lazily, so ``llm_onnx.export.options`` (the CLI's choices) loads without
torch.
"""

import importlib

_EXPORTS = {"export_model": "export", "ExportOptions": "options", "PRECISIONS": "options"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    if name in ("quant", "custom_ops", "modules", "graphs", "weights", "validate"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The decoder in torch: ModelConfig, the modules, and the custom ops whose reference math is
what ONNX Runtime's kernels compute.

    from llm_onnx.modeling import ModelConfig, Decoder

Names are imported lazily: ``llm_onnx.modeling.config`` (pure Python, used by presets and the CLI)
must not drag torch in.
"""

import importlib

_EXPORTS = {"ModelConfig": "config", "MoEConfig": "config", "Decoder": "decoder",
            "Fusion": "decoder"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    if name in ("ops", "rope", "shapes", "decoder", "config", "layers", "attention", "mlp",
                "positions"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

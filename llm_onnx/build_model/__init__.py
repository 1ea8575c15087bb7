"""The decoder in torch: configs, modules, custom ops and checkpoint loading.

    from llm_onnx.build_model import build_model, open_checkpoint
    ckpt = open_checkpoint("path/to/hf_folder_or.gguf")
    model = build_model(ckpt.config, ckpt.source)

Names are imported lazily: ``llm_onnx.build_model.config`` (pure Python, used by presets and the
CLI) must not drag torch in.
"""

import importlib

_EXPORTS = {
    "ModelConfig": "config", "MoEConfig": "config", "from_hf_config": "config",
    "load_hf_config": "config",
    "Checkpoint": "load", "build_model": "load", "load_weights": "load",
    "open_checkpoint": "load", "random_checkpoint": "load",
    "GGUFSource": "sources", "RandomSource": "sources", "SafetensorsSource": "sources",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Reading checkpoints, one tensor at a time: Hugging Face safetensors folders, GGUF files and
seeded random weights, presented under the decoder's names and layouts.

    from llm_onnx.checkpoints import build_model, open_checkpoint
    ckpt = open_checkpoint("path/to/hf_folder_or.gguf")
    model = build_model(ckpt.config, ckpt.source)

Names are imported lazily (torch is needed only once a checkpoint is read).
"""

import importlib

_EXPORTS = {
    "Checkpoint": "load", "build_model": "load", "load_weights": "load",
    "open_checkpoint": "load", "random_checkpoint": "load",
    "GGUFSource": "sources", "RandomSource": "sources", "SafetensorsSource": "sources",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

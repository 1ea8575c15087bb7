"""The decoder in torch (the exporter's side; the runtime's ``Model`` is llm_onnx.runtime's):
ModelConfig and its groups, the parts a layer is assembled from, and the custom ops whose
reference math is what ONNX Runtime's kernels compute.

    from llm_onnx.modeling import ModelConfig, Decoder

    config.py, subconfigs.py  ModelConfig and its groups of family switches (pure Python)
    decoder.py                the stack: embeddings, layers, final norm, LM head
    layer.py                  a layer: residual topology around a token mixer and a feed-forward
    attention.py, linear_attention.py, mlp.py   the mixers and feed-forwards
    layers.py, positions.py   Linear and the norms; RoPE and sinusoidal tables
    ops.py, rope.py, shapes.py  custom ops, RoPE math, the checkpoint's tensor shapes

Names are imported lazily: ``llm_onnx.modeling.config`` (pure Python, used by presets and the
CLI) must not drag torch in.
"""

import importlib

_EXPORTS = {"ModelConfig": "config", "MoEConfig": "config", "Decoder": "decoder",
            "Fusion": "decoder"}
_MODULES = ("attention", "config", "decoder", "embedding", "layer", "layers", "linear_attention",
            "mlp", "ops", "positions", "rope", "shapes", "subconfigs")

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

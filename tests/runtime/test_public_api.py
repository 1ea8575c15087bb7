"""The runtime's public names: what apps import from ``llm_onnx.runtime``. The modules behind
them may move; these names stay importable from the package itself."""

import importlib

import llm_onnx.runtime

PUBLIC = ["ChatPiece", "ChatSession", "Constraint", "ConstraintError", "Engine", "EngineProtocol",
          "GenerationOptions", "Generator", "KVCache", "Model", "Result", "RuntimeOptions",
          "Timings", "TokenEvent", "TokenLogprob", "ToolCall", "ToolCallDelta"]


def test_the_public_names_are_these():
    assert sorted(llm_onnx.runtime.__all__) == sorted(PUBLIC)


def test_each_public_name_is_the_object_its_module_defines():
    for name in PUBLIC:
        obj = getattr(llm_onnx.runtime, name)
        home = importlib.import_module(obj.__module__)
        assert getattr(home, name) is obj, name
        assert home.__name__.startswith("llm_onnx.runtime."), (name, home.__name__)


def test_star_import_gives_the_public_names():
    scope: dict = {}
    exec("from llm_onnx.runtime import *", scope)
    assert sorted(k for k in scope if not k.startswith("__")) == sorted(PUBLIC)

"""The embeddable runtime: ONNX Runtime + numpy + tokenizers + jinja2 only (never torch).

    from llm_onnx.runtime import Model
    model = Model.load("models/smollm2-int8")
    result = model.chat([{"role": "user", "content": "What is the capital of France?"}])
    print(result.text, result.finish_reason, result.timings.decode_tok_s)

Layers, each a client of the one below: ``Engine`` (ONNX Runtime sessions, KV cache bound in
place) -> ``Generator`` (step-wise generation of one or several sequences) -> ``Model``
(generate, stream, chat) and ``Scheduler`` (continuous batching of concurrent requests). A
``Constraint`` (JSON schema, regex, grammar, choice) holds an answer to a form; chat replies with
tools come back with ``ToolCall``s.
"""

from llm_onnx.runtime.constraint import Constraint, ConstraintError
from llm_onnx.runtime.engine import Engine, EngineProtocol, RuntimeOptions
from llm_onnx.runtime.generator import Generator
from llm_onnx.runtime.kv_cache import KVCache
from llm_onnx.runtime.model import ChatSession, Model
from llm_onnx.runtime.reasoning import ChatPiece
from llm_onnx.runtime.sampling import GenerationOptions
from llm_onnx.runtime.sequence import Result, Timings, TokenEvent, TokenLogprob, ToolCall
from llm_onnx.runtime.tools import ToolCallDelta

__all__ = ["ChatPiece", "ChatSession", "Constraint", "ConstraintError", "Engine", "EngineProtocol",
           "GenerationOptions", "Generator", "KVCache", "Model", "Result", "RuntimeOptions",
           "Timings", "TokenEvent", "TokenLogprob", "ToolCall", "ToolCallDelta"]

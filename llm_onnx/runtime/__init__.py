"""The embeddable runtime: ONNX Runtime + numpy + tokenizers + jinja2 only (never torch).

    from llm_onnx.runtime import Model
    model = Model.load("models/smollm2-int8")
    result = model.chat([{"role": "user", "content": "What is the capital of France?"}])
    print(result.text, result.finish_reason, result.timings.decode_tok_s)

Subpackages, each a client of those before it (imports flow one way):

    core/        the engine: ONNX Runtime sessions over a model folder, the per-row state
                 (KV cache) bound in place, execution providers, the folder's safety check;
                 an embedding model's EmbeddingEngine (embed.onnx over batches of ids)
    structured/  constrained decoding: a Constraint (JSON schema, regex, grammar, choice), the
                 llguidance matcher, the schema rewrites; knows nothing of generation or chat
    generation/  the loop: options, sampling, a sequence's bookkeeping, the step-wise
                 Generator, speculative decoding, the batching Scheduler, text streaming
    chat/        chat templates, the dialects (tool-call formats, reasoning splits), a chat
                 request
    model.py     Model (load, generate, stream, chat; embed) and chat_session.py (ChatSession):
                 the API

The names below are the public API; everything else may move between releases.
"""

from llm_onnx.runtime.chat.dialects.base import ChatPiece, ToolCallDelta
from llm_onnx.runtime.chat_session import ChatSession
from llm_onnx.runtime.core.engine import Engine, RuntimeOptions
from llm_onnx.runtime.core.engine_protocol import EngineProtocol
from llm_onnx.runtime.core.kv_cache import KVCache
from llm_onnx.runtime.generation.generator import Generator
from llm_onnx.runtime.generation.options import GenerationOptions
from llm_onnx.runtime.generation.results import Result, Timings, TokenEvent, TokenLogprob, ToolCall
from llm_onnx.runtime.model import Model
from llm_onnx.runtime.structured.constraint import Constraint, ConstraintError

__all__ = ["ChatPiece", "ChatSession", "Constraint", "ConstraintError", "Engine", "EngineProtocol",
           "GenerationOptions", "Generator", "KVCache", "Model", "Result", "RuntimeOptions",
           "Timings", "TokenEvent", "TokenLogprob", "ToolCall", "ToolCallDelta"]

"""The embeddable runtime: ONNX Runtime + numpy + tokenizers + jinja2 only (never torch).

    from llm_onnx.runtime import Model
    model = Model.load("models/smollm2-int8")
    result = model.chat([{"role": "user", "content": "What is the capital of France?"}])
    print(result.text, result.finish_reason, result.timings.decode_tok_s)
"""

from llm_onnx.runtime.generator import ChatSession, Model, Result, Timings
from llm_onnx.runtime.sampling import GenerationOptions
from llm_onnx.runtime.session import RuntimeOptions

__all__ = ["ChatSession", "GenerationOptions", "Model", "Result", "RuntimeOptions", "Timings"]

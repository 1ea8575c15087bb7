"""`llm-onnx serve`: an OpenAI-compatible HTTP server over a model folder, batching concurrent
requests with the runtime's Scheduler.

Needs the optional extra: ``pip install 'llm-onnx[serve]'`` (FastAPI, uvicorn, prometheus-client).
The runtime (``llm_onnx.runtime``) never imports this package. One module per API
(``openai_chat``, ``openai_completions``, ``openai_responses``, ``anthropic_messages``,
``embeddings``, ``tokens``), each a parse step and a render step over the shared pipeline;
``app`` wires them (its docstring says how).
"""

from llm_onnx.serve.app import create_app
from llm_onnx.serve.service import Service

__all__ = ["Service", "create_app"]

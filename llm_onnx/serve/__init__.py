"""`llm-onnx serve`: an OpenAI-compatible HTTP server over a model folder, batching concurrent
requests with the runtime's Scheduler.

Needs the optional extra: ``pip install 'llm-onnx[serve]'`` (FastAPI, uvicorn, prometheus-client).
The runtime (``llm_onnx.runtime``) never imports this package.
"""

from llm_onnx.serve.app import Service, create_app

__all__ = ["Service", "create_app"]

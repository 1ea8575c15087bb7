"""Running the app under uvicorn, with a shutdown that ends streams cleanly.

SIGTERM or Ctrl-C: the server stops accepting connections and new requests (503), lets running
generations go on for ``drain_timeout`` seconds, ends what is left with finish_reason "abort"
(each stream still gets its last chunk and ``data: [DONE]``), then exits. A second Ctrl-C exits
at once.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

import uvicorn

from llm_onnx.errors import LlmOnnxError
from llm_onnx.serve.app import create_app
from llm_onnx.serve.service import Service


class PortInUse(LlmOnnxError):
    """The address the server should listen on is taken or not ours."""


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, service: Service, drain_timeout: float) -> None:
        super().__init__(config)
        self.service, self.drain_timeout = service, drain_timeout

    def handle_exit(self, sig: int, frame: object) -> None:
        self.service.begin_shutdown(self.drain_timeout)
        super().handle_exit(sig, frame)


def check_address(host: str, port: int) -> None:
    """Fail with one line, before loading anything, if ``host:port`` cannot be listened on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise PortInUse(f"cannot listen on {host}:{port} ({e.strerror}); choose another "
                            "--port or --host.") from None


def run(service: Service, *, host: str = "127.0.0.1", port: int = 8000,
        drain_timeout: float = 5.0, log_level: str = "info",
        cors_origins: Sequence[str] = (), web_ui: bool = True) -> None:
    """Serve until SIGTERM / Ctrl-C (blocks); the chat page at ``/`` unless ``web_ui`` is
    False."""
    _log_to(log_level)
    app = create_app(service, cors_origins=cors_origins, web_ui=web_ui)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=int(drain_timeout) + 5,
                            server_header=False)
    _Server(config, service, drain_timeout).run()


def _log_to(level: str) -> None:
    """The server's own log lines (llm_onnx.*: what a request had ignored, errors) beside
    uvicorn's, at ``level``."""
    import logging

    from uvicorn.logging import DefaultFormatter

    logger = logging.getLogger("llm_onnx")
    logger.setLevel(level.upper())
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False

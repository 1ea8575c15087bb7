"""The chat page at ``/``: plain HTML, CSS and JavaScript files shipped in this package (no
build step, nothing fetched from another host), served under a strict Content-Security-Policy.

    GET /                 index.html
    GET /web/{name}       chat.js, render.js, images.js, chat.css, favicon.svg (a fixed list)
    GET /favicon.ico      the same SVG icon (browsers ask for it by default)

The page talks to the server's own OpenAI endpoints (``/v1/models``, ``/v1/chat/completions``)
with ``fetch``. Model output is untrusted: the scripts build every element with
``createElement`` / ``textContent``, and the policy below forbids inline script, ``eval``,
other hosts and any string-to-HTML sink (Trusted Types with no policy), so a slip in the page
could not turn a reply into live HTML either. ``llm-onnx serve --no-web-ui`` leaves these routes
out.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import Response

from llm_onnx.serve.errors import ApiError

FOLDER = Path(__file__).parent
ASSETS = {  # name -> media type: the only files served
    "index.html": "text/html; charset=utf-8",
    "chat.js": "text/javascript; charset=utf-8",
    "render.js": "text/javascript; charset=utf-8",
    "images.js": "text/javascript; charset=utf-8",
    "chat.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
CSP = "; ".join([
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' blob:",  # (blob: the images attached to a message, shown before sending)
    "connect-src 'self'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
    "require-trusted-types-for 'script'",
    "trusted-types 'none'",
])
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-cache",
}


@lru_cache(maxsize=None)
def _read(name: str) -> bytes:
    return (FOLDER / name).read_bytes()


def _asset(name: str) -> Response:
    return Response(_read(name), media_type=ASSETS[name], headers=HEADERS)


def add_routes(app: FastAPI) -> None:
    """The page's routes on ``app`` (no API key: the page asks for it and sends it itself)."""

    @app.get("/", include_in_schema=False)
    async def page() -> Response:
        return _asset("index.html")

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        return _asset("favicon.svg")

    @app.get("/web/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in ASSETS or name == "index.html":
            raise ApiError(404, f"GET /web/{name}: no such file of the chat page.",
                           type="not_found_error")
        return _asset(name)

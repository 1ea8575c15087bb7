"""Errors in the shapes of the APIs served: every refusal is an ``ApiError`` with the status,
``type``, ``param`` and ``code`` OpenAI's API uses, and a message naming the field and what it
accepts; the Messages API's routes answer with the same error in Anthropic's shape. No web
framework here."""

from __future__ import annotations

import hmac
from typing import Any


class ApiError(Exception):
    """An error response in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None) -> None:
        message, param = _encodable(message), _encodable(param)  # a lone surrogate quoted
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def anthropic_body(self) -> dict[str, Any]:
        """The same error in Anthropic's shape (the Messages API's routes answer with it):
        {"type": "error", "error": {"type", "message"}}, the type by status."""
        kind = ANTHROPIC_ERROR_TYPES.get(self.status, "api_error")
        message = self.message if self.param is None or self.message.startswith(self.param) \
            else f"{self.param}: {self.message}"
        return {"type": "error", "error": {"type": kind, "message": message}}


def _encodable(text: str | None) -> str | None:
    """``text`` as UTF-8 can carry it: a lone surrogate from the request (a JSON "\\ud800")
    written as its escape, so that the error can be sent at all."""
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")


# Anthropic's error types by HTTP status (docs.anthropic.com, "Errors")
ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                         403: "permission_error", 404: "not_found_error",
                         413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                         503: "overloaded_error", 529: "overloaded_error"}


def bad(param: str | None, message: str, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


# An image (or audio, or a document) sent to a folder exported for text: the same words in
# every API, saying what to do.
TEXT_ONLY = "this model folder takes text only; export it from the multimodal checkpoint."


def text_only(param: str, what: str) -> ApiError:
    """The 400 for ``what`` (e.g. "an image_url part") at ``param`` of a text-only folder."""
    return bad(param, f"'{param}' is {what}: {TEXT_ONLY}")


def api_key_error(authorization: str, key: str | None, x_api_key: str = "") -> ApiError | None:
    """None if the ``Authorization`` header carries ``Bearer <key>``, or ``X-API-Key`` carries
    the key (Anthropic's clients send it so), or no key is set; else the 401 to answer.
    Constant-time comparison."""
    if key is None:
        return None
    if x_api_key and not authorization:
        if hmac.compare_digest(x_api_key.strip().encode(), key.encode()):
            return None
        return ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
    if not authorization:
        return ApiError(401, "You didn't provide an API key. Send it in the Authorization header "
                             "as 'Bearer <key>'.", code="invalid_api_key")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        return ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
    return None

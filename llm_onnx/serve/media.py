"""Images in the server's APIs: each API's image part, checked where it stands, becomes the
chat template's ``{"type": "image", "image": <data: URL | bytes>}``; a prompt's images are
decoded and placed once its text is rendered.

Where an image may come from (``MediaPolicy``):
- a ``data:image/...;base64,`` URL (OpenAI's image_url and input_image, Anthropic's base64
  source, which becomes one): always;
- an ``http(s)://`` URL: only when its host is one of ``--allowed-media-domains`` (none by
  default), fetched with a time and a size bound and without following redirects, so that a
  request can never make the server call an arbitrary address;
- nothing else (never a path on the server's disk).

A folder that takes text only refuses every image part with the same words in every API
(errors.text_only). The parsers learn what the request may carry from ``accepting`` (set by
the plan builders for the duration of a parse).
"""

from __future__ import annotations

import contextlib
import contextvars
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from llm_onnx.errors import GenerationError, MediaError
from llm_onnx.serve.errors import ApiError, bad, text_only

MAX_FETCH_BYTES = 20 << 20  # the most an image URL may return
FETCH_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class MediaPolicy:
    """Where images may come from (see the module docstring)."""

    allowed_domains: tuple[str, ...] = ()
    max_bytes: int = MAX_FETCH_BYTES
    timeout_s: float = FETCH_TIMEOUT_S

    def allows(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return any(host == d or host.endswith("." + d) for d in self.allowed_domains)


_ACCEPTING: contextvars.ContextVar[MediaPolicy | None] = contextvars.ContextVar(
    "llm_onnx_media", default=None)


@contextlib.contextmanager
def accepting(policy: MediaPolicy | None) -> Iterator[None]:
    """Parse a request's messages taking images under ``policy`` (None: a text-only folder)."""
    token = _ACCEPTING.set(policy)
    try:
        yield
    finally:
        _ACCEPTING.reset(token)


def takes_images() -> bool:
    """Whether the request being parsed may carry images (its folder takes them)."""
    return _ACCEPTING.get() is not None


def policy_for(model: Any, policy: MediaPolicy | None) -> MediaPolicy | None:
    """``policy`` where the model takes images (the default one if none given), else None."""
    if getattr(model, "image_inputs", None) is None:
        return None
    return policy or MediaPolicy()


def image_part(url: Any, where: str, what: str) -> dict[str, Any]:
    """The template's image part for an image at ``url`` (a data: URL or an allowed http(s)
    URL), or the 400 naming ``where`` (``what``: the part in the API's words)."""
    policy = _ACCEPTING.get()
    if policy is None:
        raise text_only(where, what)
    if not isinstance(url, str) or not url:
        raise bad(where, f"'{where}' needs the image's URL (a data: URL).")
    if url[:5].lower() == "data:":
        return {"type": "image", "image": url, "where": where}
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme.lower() not in ("http", "https") or not parsed.hostname:
        raise bad(where, f"'{where}': an image is a data:image/...;base64 URL (or an http(s) "
                         "URL of an allowed domain).")
    if not policy.allows(parsed.hostname):
        raise bad(where, f"'{where}': this server does not fetch image URLs"
                         + (f" from {parsed.hostname} (allowed: "
                            f"{', '.join(policy.allowed_domains)})" if policy.allowed_domains
                            else " (none are allowed: llm-onnx serve --allowed-media-domains)")
                         + "; send the image as a data: URL.")
    return {"type": "image", "image": _fetch(url, where, policy), "where": where}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect is an error: it could lead anywhere


def _fetch(url: str, where: str, policy: MediaPolicy) -> bytes:
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers={"User-Agent": "llm-onnx"}),
                         timeout=policy.timeout_s) as response:
            data = response.read(policy.max_bytes + 1)
    except urllib.error.HTTPError as e:
        if 300 <= e.code < 400:
            raise bad(where, f"'{where}': the image URL redirects (HTTP {e.code}); this server "
                             "does not follow redirects: give the final URL.") from None
        raise bad(where, f"'{where}': fetching the image gave HTTP {e.code}.") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise bad(where, f"'{where}': the image could not be fetched ({reason}).") from None
    if len(data) > policy.max_bytes:
        raise bad(where, f"'{where}': the image is larger than {policy.max_bytes >> 20} MiB.")
    return data


def split(model: Any, messages: list[dict[str, Any]],
              ) -> tuple[list[dict[str, Any]], list[tuple[Any, str]]]:
    """``messages`` with each image part as the template's bare ``{"type": "image"}`` and the
    images in order with the part each came from (see chat.image_parts.split_images)."""
    from llm_onnx.runtime.chat.image_parts import split_images

    try:
        return split_images(messages, getattr(model.engine, "manifest", None))
    except GenerationError as e:
        raise bad("messages", str(e)) from None


def place_images(model: Any, prompt: list[int], sources: Sequence[tuple[Any, str]],
                 text: str | None = None) -> Any:
    """The prompt's images decoded, processed and in place (a RowImages), or the 400 naming
    the part (each source's name is its part's path in the request; ``text``: the rendered
    prompt, which Gemma 3 expands as text)."""
    try:
        return model.image_row(prompt, sources, text)
    except MediaError as e:
        message = str(e)
        where = next((name for _, name in sources if name in message), "messages")
        raise ApiError(400, message, param=where) from None


__all__ = ["MediaPolicy", "accepting", "image_part", "place_images", "policy_for", "split",
           "takes_images"]

"""The field policy: what each field of a request gets, the same way in every API.

Each API module declares at its top the fields it reads:

    FIELDS              honoured: the field does what the API says it does
    IGNORED_FIELDS      hints and metadata that change nothing the model produces (``user``,
                        ``metadata``, cache keys): accepted, and reported as ignored
    TOLERATED_FIELDS    conveniences of the API's own servers that nothing here does
                        (``context_management``, ``client_metadata``): accepted and reported,
                        and under ``--strict-fields`` a 400 naming the field
    UNSUPPORTED_FIELDS  fields that ask for something this server cannot produce: a 400 naming
                        the field unless its value asks for nothing (null, false, [], {})

Any other field (a field a newer client sends) is treated as tolerated: accepted and reported,
a 400 under ``--strict-fields``. Parts of fields follow the same rule where the API module says
so (``output_config.effort`` for a model without effort levels, a built-in tool the server
cannot run: dropped from what the model sees and reported as ``tools.web_search``).

What a request had ignored is reported three ways: the ``llm-onnx-ignored`` response header
(the names, comma-separated), the log (each API's field once at INFO, then at DEBUG), and the
counter ``llm_onnx_ignored_fields_total{api, field}`` in /metrics.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

from llm_onnx.serve.errors import ApiError, bad

log = logging.getLogger("llm_onnx.serve")

HEADER = "llm-onnx-ignored"
STATE_KEY = "llm_onnx_fields"  # where a request's Fields wait for its answer (request.state)
_NAME = re.compile(r"[^A-Za-z0-9_.\[\]-]")
MAX_NAME = 64  # a field's name in the header, the log and the metric
MAX_LABELS = 64  # distinct field labels per API in the metric; later ones count as "other"
EMPTY: tuple[Any, ...] = (None, False, [], {})


def unknown_field(name: str) -> str:
    """OpenAI's refusal of a field it does not know."""
    return f"Unrecognized request argument supplied: {name}."


class Fields:
    """One request's fields under the policy: the names it ignored (``ignored``), and the
    server's choice of refusing instead what it would tolerate (``strict``).

    Args:
        api: the API's name in the metric and the log ("chat.completions", "messages", ...).
        strict: ``--strict-fields``: a field the server would tolerate is a 400 naming it.
    """

    def __init__(self, api: str, strict: bool = False) -> None:
        self.api = api
        self.strict = strict
        self.ignored: list[str] = []

    def check(self, body: Mapping[str, Any], honoured: Collection[str],
              ignored: Collection[str] = (), tolerated: Collection[str] = (),
              unsupported: Mapping[str, Any] | Collection[str] = (),
              unknown: Callable[[str], str] = unknown_field) -> None:
        """Sort the top-level fields of ``body``: honoured ones pass, ignored and tolerated ones
        are reported (tolerated and unknown ones refused under ``strict``), unsupported ones are
        refused unless empty (``unsupported`` may map a name to a value that also asks for
        nothing, as ``"none"`` for ``function_call``, or to (that value, why it is refused)).
        ``unknown`` words the refusal of an unknown field."""
        for name in sorted(body, key=str):
            if name in honoured or body[name] is None:
                continue  # (null asks for nothing: nothing is ignored or refused)
            if name in unsupported:
                rule = unsupported.get(name) if isinstance(unsupported, Mapping) else None
                allowed, why = rule if isinstance(rule, tuple) else (rule, None)
                value = body[name]
                if value in EMPTY or (allowed is not None and value == allowed):
                    continue
                raise bad(name, f"'{name}' is not supported by this server"
                                + (f": {why}." if why else "."))
            if name in ignored:
                self.ignore(name)
            else:
                self.tolerate(name, unknown(name) if name not in tolerated else
                              f"'{name}' is not supported by this server (--strict-fields).")

    def ignore(self, name: str) -> None:
        """``name`` (a field, or a part of one: ``output_config.effort``) was accepted and
        changes nothing here."""
        if name not in self.ignored:
            self.ignored.append(name)

    def tolerate(self, name: str, refusal: str | ApiError) -> None:
        """``name`` is accepted and ignored, or under ``strict`` refused (``refusal``: the
        400's message, or the error itself)."""
        if self.strict:
            raise refusal if isinstance(refusal, ApiError) else bad(name, refusal)
        self.ignore(name)

    def header(self) -> str:
        """The ``llm-onnx-ignored`` header's value."""
        return ", ".join(sorted(dict.fromkeys(_shown(n) for n in self.ignored)))


def _shown(name: str) -> str:
    """A client's field name as the header, the log and the metric may carry it."""
    return _NAME.sub("?", name[:MAX_NAME])


def attach(request: Any, fields: Fields) -> Fields:
    """Keep ``fields`` with ``request`` until its answer starts (``ReportIgnored`` reports
    them then)."""
    setattr(request.state, STATE_KEY, fields)
    return fields


class Reporter:
    """Reports a request's ignored fields once its answer starts: the log and the metric."""

    def __init__(self, counter: Any) -> None:
        self.counter = counter
        self.seen: set[tuple[str, str]] = set()
        self.labels: dict[str, set[str]] = {}

    def report(self, method: str, path: str, fields: Fields) -> None:
        for name in dict.fromkeys(_shown(n) for n in fields.ignored):
            key = (fields.api, name)
            if key not in self.seen:
                self.seen.add(key)
                log.info("%s %s: accepted and ignored %r (named in the llm-onnx-ignored "
                         "header; from now on counted in llm_onnx_ignored_fields_total and "
                         "logged at DEBUG)", method, path, name)
            else:
                log.debug("%s %s: ignored %r", method, path, name)
            labels = self.labels.setdefault(fields.api, set())
            if name not in labels and len(labels) >= MAX_LABELS:
                name = "other"
            labels.add(name)
            self.counter.labels(fields.api, name).inc()


class ReportIgnored:
    """ASGI middleware: a successful answer to a request that ignored fields carries the
    ``llm-onnx-ignored`` header, and they are logged and counted (``reporter``)."""

    def __init__(self, app: Any, reporter: Callable[[], Reporter | None]) -> None:
        self.app = app
        self.reporter = reporter

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def reported(message: dict) -> None:
            if message["type"] == "http.response.start":
                fields = scope.get("state", {}).get(STATE_KEY)
                if fields is not None and fields.ignored and message["status"] < 400:
                    message = {**message, "headers": [*message.get("headers", []),
                                                      (HEADER.encode(),
                                                       fields.header().encode("ascii"))]}
                    reporter = self.reporter()
                    if reporter is not None:
                        reporter.report(scope.get("method", ""), scope.get("path", ""), fields)
            await send(message)

        await self.app(scope, receive, reported)

"""The Responses API's stored responses (``store: true``): what ``previous_response_id`` and
GET /v1/responses/{id} read, kept in memory within a count and a byte bound, the oldest dropped
first."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

from llm_onnx.serve.errors import ApiError


class ResponseStore:
    """Stored responses: id -> (the response, the conversation it answered plus its reply as
    chat messages, the function call ids made), at most ``max_count`` of them and ``max_bytes``
    of JSON, the oldest dropped first. Thread-safe."""

    def __init__(self, max_count: int = 1000, max_bytes: int = 64 << 20) -> None:
        self.max_count, self.max_bytes = max_count, max_bytes
        self._items: OrderedDict[str, tuple[dict, list, set, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]],
            calls: set[str]) -> None:
        size = len(json.dumps(response)) + len(json.dumps(conversation))
        if size > self.max_bytes or self.max_count < 1:
            return
        with self._lock:
            self._items[response["id"]] = (response, conversation, calls, size)
            self._bytes += size
            while len(self._items) > self.max_count or self._bytes > self.max_bytes:
                _, (_, _, _, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped

    def get(self, response_id: str, field: str = "previous_response_id",
            ) -> tuple[dict, list, set]:
        with self._lock:
            entry = self._items.get(response_id)
        if entry is None:
            raise ApiError(404, f"Response with id '{response_id}' not found (never stored, "
                                "deleted, or dropped to keep the server's store within its "
                                "bound).", param=field, type="invalid_request_error",
                           code="response_not_found")
        return entry[0], entry[1], entry[2]

    def delete(self, response_id: str) -> None:
        with self._lock:
            entry = self._items.pop(response_id, None)
            if entry is not None:
                self._bytes -= entry[3]
        if entry is None:
            self.get(response_id, "response_id")  # the 404

    def __len__(self) -> int:
        return len(self._items)

"""The per-row state a generator drives, as an interface: what a step needs to know of a row
(how many positions it holds), and what rewinding and reusing a row may do to it.

``KVCache`` (kv_cache.py) is the one kind today: keys and values per position, so a row can be
cut back to any length and a row's prefix copied into another. A kind whose memory of the past
is not per position (a recurrent state) sits behind the same interface and says where it can be
cut back to.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class CacheProtocol(Protocol):
    """What a generator reads of a cache (KVCache; the fakes' caches)."""

    batch: int
    length: int

    def length_of(self, row: int) -> int: ...

    def truncate(self, row: int, length: int) -> None: ...

    def grow(self, length: int) -> None: ...

    def copy_prefix(self, src: int, dst: int, length: int) -> bool: ...

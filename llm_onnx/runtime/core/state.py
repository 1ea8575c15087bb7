"""The per-row state a generator drives, as an interface: what a step needs to know of a row
(how many positions it holds), and what rewinding and reusing a row may do to it.

``KVCache`` (kv_cache.py): keys and values per position, so a row can be cut back to any length
and a row's prefix copied into another. ``HybridCache`` (recurrent.py): a KV cache for the
attention layers and, for linear-attention layers, a recurrent state per row, which holds no
positions: it says which lengths a row can be cut back to (its checkpoints).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class CacheProtocol(Protocol):
    """What a generator reads of a cache (KVCache, HybridCache; the fakes' caches).

    ``truncate(row, n)`` cuts a row back to ``kept(row, n)`` positions, which may be fewer than
    ``n`` (a recurrent state goes back to its latest checkpoint at or before ``n``): callers
    then run again whatever the row no longer holds. ``checkpoint`` asks the cache to remember
    a row as it is now (transient: only until the next transient copy: a speculative verify
    run), ``checkpoint_at`` where a prompt's run should pause for one."""

    batch: int
    length: int

    def length_of(self, row: int) -> int: ...

    def kept(self, row: int, length: int) -> int: ...

    def truncate(self, row: int, length: int) -> None: ...

    def checkpoint(self, row: int, transient: bool = False) -> None: ...

    def checkpoint_at(self, start: int, stop: int, prompt_length: int,
                      reuse_points: tuple[int, ...] = ()) -> int | None: ...

    def grow(self, length: int) -> None: ...

    def copy_prefix(self, src: int, dst: int, length: int) -> bool: ...

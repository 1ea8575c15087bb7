"""Where a generator's time goes: counters the benchmark, the server's metrics and the
speculator read."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RunStats:
    """Where a generator's time went: seconds inside the engine's prefill and decode runs, prompt
    tokens run, decode runs and the rows they decoded (rows / runs = the mean batch)."""

    prefill_s: float = 0.0
    prefill_tokens: int = 0
    decode_s: float = 0.0
    decode_runs: int = 0
    decode_rows: int = 0
    decode_row_slots: int = 0  # rows in the runs' ranges, those riding along included
    copied_tokens: int = 0  # cached prefix positions copied from another row
    mask_s: float = 0.0  # constraint masks: seconds filling them (overlapping the model runs)
    mask_wait_s: float = 0.0  # ... of which the steps waited for after their run
    mask_rows: int = 0  # masks filled
    forced_tokens: int = 0  # tokens constraints appended without a pick (fast-forward)
    verify_runs: int = 0  # speculative steps: a row's last token and its draft in one run
    verify_s: float = 0.0
    drafted_tokens: int = 0
    accepted_tokens: int = 0  # drafted tokens the model picked itself
    draft_runs: int = 0  # draft-model runs (speculative method "draft")
    draft_s: float = 0.0

    @property
    def acceptance(self) -> float:
        """Accepted / drafted tokens (0 before any draft)."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

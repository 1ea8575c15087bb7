"""A progress bar over the stages of an export (tracing, weights, validation), on stderr."""

from __future__ import annotations

import sys


class Progress:
    def __init__(self, enabled: bool = True, total: int = 0) -> None:
        self.total = total
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="step", file=sys.stderr, dynamic_ncols=True,
                             bar_format="{desc:<20} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                                        "[{elapsed}<{remaining}]")

    def grow(self, steps: int) -> Progress:
        self.total += steps
        if self._bar is not None:
            self._bar.total = self.total
            self._bar.refresh()
        return self

    def stage(self, name: str) -> None:
        if self._bar is not None:
            self._bar.set_description_str(name)

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(steps)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

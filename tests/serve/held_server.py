"""`llm-onnx serve` whose model runs can be held: a server on which a request cannot finish
before the test lets it, however fast or slow the machine (ServerProcess(..., held=N)).

    python -m tests.serve.held_server FREE_RUNS serve --model DIR ...

The first FREE_RUNS model runs (prefill, decode or verify) go through; each later one waits
until the server cancels a request that had not finished (its client left, or a shutdown's
drain ended it) or the process gets SIGUSR1 (``ServerProcess.release()``); from then on every
run goes through. A held run holds the scheduler's whole step, so nothing is admitted,
generated or freed meanwhile. Everything else is the real command: the CLI, the app, the
scheduler, the model folder and its graphs.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any


class Gate:
    def __init__(self, free_runs: int) -> None:
        self.free = free_runs
        self.opened = threading.Event()
        self._lock = threading.Lock()

    def open(self) -> None:
        self.opened.set()

    def run(self) -> None:
        """Called before each model run: returns when the run may go."""
        with self._lock:
            if self.free > 0:
                self.free -= 1
                return
        self.opened.wait()


class HeldEngine:
    """An engine whose runs pass the gate first; everything else is the wrapped engine's."""

    def __init__(self, engine: Any, gate: Gate) -> None:
        self._engine, self._gate = engine, gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def prefill(self, *args: Any, **kwargs: Any) -> Any:
        self._gate.run()
        return self._engine.prefill(*args, **kwargs)

    def decode(self, *args: Any, **kwargs: Any) -> Any:
        self._gate.run()
        return self._engine.decode(*args, **kwargs)

    def verify(self, *args: Any, **kwargs: Any) -> Any:
        self._gate.run()
        return self._engine.verify(*args, **kwargs)


def main(argv: list[str]) -> None:
    from llm_onnx.cli import main as cli
    from llm_onnx.runtime import Model
    from llm_onnx.runtime.generation.scheduler import Request

    gate = Gate(int(argv[0]))
    load = Model.load.__func__  # type: ignore[attr-defined]

    def held_load(cls: type, *args: Any, **kwargs: Any) -> Model:
        model = load(cls, *args, **kwargs)
        model.engine = HeldEngine(model.engine, gate)
        return model

    cancel = Request.cancel

    def cancel_and_open(self: Request) -> None:
        live = not self.finished
        cancel(self)
        if live:
            gate.open()

    Model.load = classmethod(held_load)  # type: ignore[method-assign,assignment]
    Request.cancel = cancel_and_open  # type: ignore[method-assign]
    # A thread, not the handler itself: the handler may interrupt this thread inside
    # Event.set, whose lock is not reentrant.
    signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(target=gate.open).start())
    cli(args=argv[1:], prog_name="llm-onnx")


if __name__ == "__main__":
    main(sys.argv[1:])

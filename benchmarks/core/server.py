"""A server under test: a process on a free loopback port, up once its health endpoint answers,
stopped with SIGTERM (then SIGKILL). httpx is imported when a server is waited for."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process on a free loopback port; waits for its health endpoint."""

    def __init__(self, system: str, cmd: list[str], port: int, logfile: Path) -> None:
        self.system, self.port = system, port
        self.url = f"http://127.0.0.1:{port}"
        logfile.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(logfile, "w")
        self.proc = subprocess.Popen([str(c) for c in cmd], stdout=self._log,
                                     stderr=subprocess.STDOUT)
        self.logfile = logfile
        self._wait()

    def _wait(self, timeout: float = 120) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.system} exited: "
                                   f"{self.logfile.read_text(errors='replace')[-1500:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.system} did not come up within {timeout} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

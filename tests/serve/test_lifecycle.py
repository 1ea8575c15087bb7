"""Starting and stopping: loopback only by default, a taken port is a one-line error, SIGTERM
ends in-flight streams cleanly and the process exits within seconds."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import psutil
import pytest

from tests.serve.conftest import ServerProcess

MODEL = "tiny-chat"


def test_listens_on_loopback_only_by_default(chat_model_folder):
    server = ServerProcess(chat_model_folder)
    try:
        listening = [c.laddr for c in psutil.Process(server.proc.pid).net_connections("inet")
                     if c.status == psutil.CONN_LISTEN]
        assert listening and all(addr.ip == "127.0.0.1" for addr in listening)
        assert all(addr.port == server.port for addr in listening)
    finally:
        server.stop()


def test_a_taken_port_is_a_one_line_error(chat_model_folder):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "llm_onnx.cli", "serve", "--model",
                               str(chat_model_folder), "--port", str(port)],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_sigterm_ends_streams_cleanly_and_exits_within_seconds(chat_model_folder):
    """Two long streams in flight and one request queued behind them; SIGTERM: new requests
    are refused, the streams end after the drain timeout with a last chunk and [DONE], the
    queued request too, and the process exits soon after."""
    server = ServerProcess(chat_model_folder, "--max-batch", "2", "--drain-timeout", "0.3")
    streams: dict[int, list[str]] = {}
    started = [threading.Event() for _ in range(3)]
    body = {"model": MODEL, "prompt": "t4 t5", "max_tokens": 4000, "temperature": 0,
            "ignore_eos": True, "stream": True}

    def stream(i: int) -> None:
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
            lines = []
            for line in r.iter_lines():
                started[i].set()  # headers and a first chunk (the third: once it runs)
                if line:
                    lines.append(line)
            streams[i] = lines

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
    try:
        for i, t in enumerate(threads):  # in order: two take the rows, the third waits
            t.start()
            if i < 2:
                assert started[i].wait(30)
        time.sleep(0.2)  # the third request reaches the queue
        sent = time.monotonic()
        server.signal(signal.SIGTERM)
        time.sleep(0.1)
        try:  # refused: the listener is closed, or the app answers 503 while it drains
            late = httpx.post(server.url + "/v1/completions", json={**body, "stream": False},
                              timeout=5).status_code
        except httpx.TransportError:
            late = "refused"
        assert late in (503, "refused")
        for t in threads:
            t.join(30)
        ended = time.monotonic() - sent
        code = server.proc.wait(30)
        exited = time.monotonic() - sent
    finally:
        server.stop()
    assert code in (0, -signal.SIGTERM)
    assert ended < 5 and exited < 10, (ended, exited)
    for i in range(3):
        lines = streams[i]
        assert lines[-1] == "data: [DONE]"
        last = json.loads(lines[-2][len("data: "):])
        assert last["choices"][0]["finish_reason"] == "abort"
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health", timeout=2)

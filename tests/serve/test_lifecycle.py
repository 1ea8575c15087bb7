"""Starting and stopping: loopback only by default, a taken port is a one-line error, SIGTERM
ends in-flight streams cleanly and the process exits."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading

import httpx
import psutil
import pytest

from tests.serve.conftest import ServerProcess, wait_until

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


def test_sigterm_ends_streams_cleanly_and_exits(chat_model_folder):
    """Two long streams in flight (one request's two choices) and one request queued behind
    them, on a held server (ServerProcess(held=0)): nothing can finish but through the
    shutdown, however fast the machine. SIGTERM: new requests are refused, the streams end
    after the drain timeout with a last chunk and [DONE], the queued request too, and the
    process exits."""
    server = ServerProcess(chat_model_folder, "--max-batch", "2", "--drain-timeout", "0.3",
                           held=0)
    streams: dict[int, list[str]] = {}
    body = {"model": MODEL, "prompt": "t4 t5", "max_tokens": 4000, "temperature": 0,
            "ignore_eos": True, "stream": True}

    def stream(i: int, n: int) -> None:
        with httpx.stream("POST", server.url + "/v1/completions", json={**body, "n": n},
                          timeout=60) as r:
            streams[i] = [line for line in r.iter_lines() if line]

    def late() -> int | str:
        try:
            r = httpx.post(server.url + "/v1/completions",
                           json={**body, "stream": False, "max_tokens": 5}, timeout=30)
        except httpx.TransportError:
            return "refused"
        if r.status_code == 200:  # taken as the signal landed: the drain ends it too
            assert r.json()["choices"][0]["finish_reason"] == "abort", r.text
        return r.status_code

    def health() -> int | str:
        try:
            return httpx.get(server.url + "/health", timeout=30).status_code
        except httpx.TransportError:
            return "refused"

    threads = [threading.Thread(target=stream, args=(0, 2)),
               threading.Thread(target=stream, args=(1, 1))]
    try:
        threads[0].start()  # both choices take the two rows in one step
        wait_until(lambda: server.metric("llm_onnx_running_requests") == 2)
        threads[1].start()
        wait_until(lambda: server.metric("llm_onnx_queue_depth") == 1)
        server.signal(signal.SIGTERM)
        wait_until(lambda: health() in (503, "refused"))  # draining, then closed
        # refused: the listener is closed, or the app answers 503 while it drains
        wait_until(lambda: late() in (503, "refused"))
        for t in threads:
            t.join(30)
            assert not t.is_alive(), "a stream did not end"
        code = server.proc.wait(30)
    finally:
        server.stop()
    assert code in (0, -signal.SIGTERM)
    for i, choices in ((0, 2), (1, 1)):
        lines = streams[i]
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
        last = {c["choices"][0]["index"]: c["choices"][0]["finish_reason"] for c in chunks}
        assert last == {k: "abort" for k in range(choices)}, (i, lines[-3:])
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health", timeout=2)

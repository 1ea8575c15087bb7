"""--llama-amx of the peer benchmarks: llama.cpp built for this CPU with or without its AMX
kernels, and "auto", which finds a native build that crashes on quantized weights (a VM whose CPU
lists AMX faulted in ggml's AMX matmul) and builds it again without AMX. The smoke runs are real
child processes: a fake "llama-server" or "python" that dies on SIGSEGV, and a fake server that
answers, so the crash detection is checked against real exit statuses."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.core import env, llama, machine
from benchmarks.core.proc import StepFailed


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


SEGFAULT = """\
import os, signal
os.kill(os.getpid(), signal.SIGSEGV)
"""

# answers /health and /completion on the --port it is given, like llama-server
SERVER = """\
import http.server, json, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def _ok(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self._ok({"status": "ok"})
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._ok({"content": "a b c d"})
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_without_amx_every_extension_the_cpu_lists_is_on_and_amx_is_off():
    flags = {"avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "amx_int8", "amx_tile"}
    cmake = llama.llama_cpu_cmake(False, flags)
    assert cmake[0] == "-DGGML_NATIVE=OFF"  # -march=native would turn AMX back on
    on = {c[2:-3] for c in cmake if c.endswith("=ON")}
    off = {c[2:-4] for c in cmake if c.endswith("=OFF")}
    assert on == {"GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_AVX512",
                  "GGML_AVX512_VNNI"}
    assert {"GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16", "GGML_AVX512_BF16",
            "GGML_BMI2"} <= off
    assert llama.llama_cpu_cmake(True, flags) == ["-DGGML_NATIVE=ON"]
    # llama-cpp-python gets the same switches through CMAKE_ARGS; native keeps the old env
    assert llama.llama_build_env(True) == llama.LLAMA_BUILD_ENV
    assert "-DGGML_AMX_INT8=OFF" in llama.llama_build_env(False)["CMAKE_ARGS"]


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu avx2 amx_int8\n\n")
    assert machine.cpu_flags(info) == {"fpu", "avx2", "amx_int8"}
    assert machine.cpu_flags(tmp_path / "missing") == set()


def test_auto_is_native_until_a_crash_is_recorded_for_this_cpu(tmp_path):
    assert llama.llama_amx(tmp_path, "auto") is True
    assert llama.llama_amx(tmp_path, "off") is False
    llama.record_amx_crash(tmp_path, "llama-server on m-q8_0.gguf: killed by signal 11")
    assert llama.llama_amx(tmp_path, "auto") is False
    assert llama.llama_amx(tmp_path, "on") is True  # on forces the native build
    record = tmp_path / "llama-amx.json"
    data = json.loads(record.read_text())
    assert data["cpu"] == machine.cpu_name() and "signal 11" in data["what"]
    record.write_text(json.dumps({**data, "cpu": "another CPU"}))  # a work dir moved elsewhere
    assert llama.llama_amx(tmp_path, "auto") is True
    record.write_text("not json")
    assert llama.llama_amx(tmp_path, "auto") is True


def test_the_smoke_runs_tell_a_crash_from_an_answer(tmp_path):
    gguf = tmp_path / "m-q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    crashing = _script(tmp_path / "crashing", SEGFAULT)
    rc = llama.llama_server_smoke(crashing, gguf, 2, tmp_path / "smoke.log", timeout=60)
    assert rc == -signal.SIGSEGV and llama.crashed(rc)
    rc = llama.llama_python_smoke(crashing, gguf, 2, tmp_path / "smoke.log")
    assert rc == -signal.SIGSEGV and llama.crashed(rc)
    answering = _script(tmp_path / "answering", SERVER)
    assert llama.llama_server_smoke(answering, gguf, 2, tmp_path / "smoke.log",
                                         timeout=60) == 0
    assert not llama.crashed(1)  # an error the program reported is not a crash
    assert not llama.crashed(0)


def test_serve_load_rebuilds_without_amx_when_the_native_server_crashes(tmp_path, monkeypatch):
    builds = []

    def fake_binaries(work, logs, amx=True):
        builds.append(amx)
        name = "answering" if not amx else "crashing"
        server = _script(tmp_path / name, SERVER if not amx else SEGFAULT)
        return {"llama-server": server, "llama-quantize": tmp_path / "quantize"}

    q8 = tmp_path / "m-q8_0.gguf"
    q8.write_bytes(b"GGUF")
    monkeypatch.setattr(env, "llama_binaries", fake_binaries)
    monkeypatch.setattr(env, "llama_server_models", lambda *a: {"f32": q8, "q8_0": q8})
    args = argparse.Namespace(work=tmp_path / "work", llama_amx="auto", threads=2)
    setup = env.Setup(argparse.Namespace(work=args.work))
    binaries, files = env.checked_llama(args, setup, tmp_path / "x.gguf")
    assert builds == [True, False]
    assert binaries["llama-server"].name == "answering" and "without AMX" in setup.llama_build
    # the next run builds without AMX straight away; --llama-amx on still builds native
    builds.clear()
    env.checked_llama(args, setup, tmp_path / "x.gguf")
    assert builds == [False]
    builds.clear()
    args.llama_amx = "on"
    env.checked_llama(args, setup, tmp_path / "x.gguf")
    assert builds == [True] and setup.llama_build == "native"


def test_compare_peers_rebuilds_its_llama_venv_without_amx_after_a_crash(tmp_path, monkeypatch):
    envs = []
    q8 = tmp_path / "m-q8_0.gguf"
    q8.write_bytes(b"GGUF")

    def fake_venv(self, name, steps, probe, env=None):
        envs.append(env)
        amx = "AMX_INT8=OFF" not in env["CMAKE_ARGS"]
        return _script(tmp_path / f"python-{amx}", SEGFAULT if amx else "")

    monkeypatch.setattr(env.Setup, "venv", fake_venv)
    monkeypatch.setattr(env.Setup, "llama_models", lambda self, *a: {"q8_0": q8})
    setup = env.Setup(argparse.Namespace(work=tmp_path, llama_amx="auto", threads=2))
    python, files = setup.llama(tmp_path / "x.gguf", tmp_path)
    assert [e == llama.llama_build_env(True) for e in envs] == [True, False]
    assert python.name == "python-False" and files == {"q8_0": q8}
    assert "without AMX" in setup.llama_build
    assert llama.llama_amx(tmp_path, "auto") is False  # recorded for the next run


def test_a_build_without_amx_that_crashes_too_is_an_error_not_a_measurement(tmp_path,
                                                                            monkeypatch):
    crashing = _script(tmp_path / "crashing", SEGFAULT)
    q8 = tmp_path / "m-q8_0.gguf"
    q8.write_bytes(b"GGUF")
    monkeypatch.setattr(env, "llama_binaries", lambda *a: {"llama-server": crashing,
                                                           "llama-quantize": crashing})
    monkeypatch.setattr(env, "llama_server_models", lambda *a: {"f32": q8, "q8_0": q8})
    args = argparse.Namespace(work=tmp_path / "work", llama_amx="auto", threads=2)
    setup = env.Setup(argparse.Namespace(work=args.work))
    with pytest.raises(StepFailed, match="without AMX too"):
        env.checked_llama(args, setup, tmp_path / "x.gguf")


def test_a_venv_built_with_switches_does_not_take_a_cached_wheel(tmp_path, monkeypatch):
    """pip's wheel cache keys a built wheel by its source, not by CMAKE_ARGS: rebuilding
    llama-cpp-python without AMX once reinstalled the native wheel in 9 seconds."""
    commands = []

    def fake_run(cmd, logfile, env=None, capture=False):
        commands.append([str(c) for c in cmd])
        if cmd[1:3] == ["-m", "venv"]:
            (Path(cmd[3]) / "bin").mkdir(parents=True)
        return ""

    monkeypatch.setattr(env, "run", fake_run)
    setup = env.Setup(argparse.Namespace(work=tmp_path))
    setup.venv("llama-cpp", [["llama-cpp-python==0.3.36"]], "llama_cpp",
               env=llama.llama_build_env(False))
    setup.venv("report", [["matplotlib"]], "matplotlib")
    installs = [c for c in commands if "install" in c and "--upgrade" not in c]
    assert "--no-cache-dir" in installs[0] and "--no-cache-dir" not in installs[1]

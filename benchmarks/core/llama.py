"""llama.cpp as the peers run it: built for this CPU with or without its AMX kernels
(``--llama-amx``), through llama-cpp-python's venv (the environment builder's ``llama-cpp``) or
as the ``llama-server`` and ``llama-quantize`` binaries built from the sources that sdist
vendors, and the smoke runs that tell a build that crashes on this CPU's quantized weights.
Standard library only (httpx is imported by the server smoke run)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from benchmarks.core.machine import cpu_flags, cpu_name
from benchmarks.core.proc import StepFailed, log, run, stamp_ok, write_stamp
from benchmarks.core.server import free_port

LLAMA_SDIST = "llama-cpp-python==0.3.36"
LLAMA_PACKAGES = [[LLAMA_SDIST]]
# llava/mtmd (multimodal) is not needed and is a large part of the compile
LLAMA_BUILD_ENV = {"CMAKE_ARGS": "-DLLAVA_BUILD=OFF",
                   "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
LLAMA_TARGETS = ["llama-server", "llama-quantize"]
LLAMA_CMAKE = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_OPENSSL=OFF", "-DBUILD_SHARED_LIBS=OFF"]
# ggml's switches for a build without -march=native, each on when /proc/cpuinfo lists the flag:
# what a native build of this CPU uses, AMX left out (see llama_cpu_cmake)
GGML_ISA = {"avx": "GGML_AVX", "avx2": "GGML_AVX2", "fma": "GGML_FMA", "f16c": "GGML_F16C",
            "bmi2": "GGML_BMI2", "avx_vnni": "GGML_AVX_VNNI", "avx512f": "GGML_AVX512",
            "avx512vbmi": "GGML_AVX512_VBMI", "avx512_vnni": "GGML_AVX512_VNNI",
            "avx512_bf16": "GGML_AVX512_BF16"}
LLAMA_AMX_CHOICES = ("auto", "on", "off")
LLAMA_AMX_HELP = ("llama.cpp's AMX kernels (CPUs that list amx_int8): on, a native build; off, "
                  "the same CPU extensions without AMX; auto (default), native unless a native "
                  "build crashed on this CPU's quantized weights before (WORK/llama-amx.json), and "
                  "where it crashes now, rebuilt without AMX. Seen on a VM: ggml's AMX matmul "
                  "faults in ldtilecfg (general protection fault) on q8_0 and Q4_1 weights")


def llama_cpu_cmake(amx: bool, flags: set[str] | None = None) -> list[str]:
    """CMake switches for llama.cpp's CPU backend: native (``amx``), or this CPU's extensions as
    explicit switches with AMX off (-march=native would turn AMX back on)."""
    if amx:
        return ["-DGGML_NATIVE=ON"]
    flags = cpu_flags() if flags is None else flags
    return (["-DGGML_NATIVE=OFF"]
            + [f"-D{switch}={'ON' if flag in flags else 'OFF'}" for flag, switch in GGML_ISA.items()]
            + ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"])


def llama_build_env(amx: bool) -> dict:
    """llama-cpp-python's pip environment: LLAMA_BUILD_ENV with the CPU switches."""
    extra = "" if amx else " " + " ".join(llama_cpu_cmake(False))
    return {**LLAMA_BUILD_ENV, "CMAKE_ARGS": LLAMA_BUILD_ENV["CMAKE_ARGS"] + extra}


def _amx_record(work: Path) -> Path:
    return work / "llama-amx.json"


def llama_amx(work: Path, choice: str) -> bool:
    """Whether llama.cpp is built with its AMX kernels (``choice``: LLAMA_AMX_CHOICES): "auto"
    is yes unless a native build crashed on this CPU model before (WORK/llama-amx.json)."""
    if choice != "auto":
        return choice == "on"
    record = _amx_record(work)
    try:
        crashed = json.loads(record.read_text())
    except (OSError, ValueError):
        return True
    return crashed.get("cpu") != cpu_name()


def record_amx_crash(work: Path, what: str) -> None:
    """Remember that llama.cpp's native build crashed here, so "auto" builds without AMX."""
    work.mkdir(parents=True, exist_ok=True)
    _amx_record(work).write_text(json.dumps(
        {"cpu": cpu_name(), "what": what,
         "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, indent=1))
    log(f"llama.cpp's native build crashed on this CPU ({what}): building it without AMX "
        f"(recorded in {_amx_record(work)}; --llama-amx on forces the native build)")


def crashed(returncode: int | None) -> bool:
    """A child killed by a signal (SIGSEGV, SIGILL, SIGBUS): not an error it reported."""
    return returncode is not None and returncode < 0


def amx_checked(work: Path, choice: str, amx: bool, built, rebuild, smoke, what: str,
                logfile: Path):
    """``built`` (llama.cpp built with ``amx``) and whether it uses AMX, after --llama-amx
    "auto"'s check: ``smoke(built)`` runs the q8_0 file; a child killed by a signal is recorded
    (record_amx_crash), ``rebuild()`` builds without AMX and that build must pass the same run."""
    if not (amx and choice == "auto"):
        return built, amx
    rc = smoke(built)
    if not crashed(rc):
        return built, True
    record_amx_crash(work, f"{what}: killed by signal {-rc}")
    built = rebuild()
    rc = smoke(built)
    if crashed(rc):
        raise StepFailed(f"{what} crashes on this CPU without AMX too (signal {-rc}; see "
                         f"{logfile})")
    return built, False


def llama_build_label(amx: bool) -> str:
    return "native" if amx else "this CPU's extensions without AMX (GGML_NATIVE=OFF)"


def llama_python_smoke(python: Path, gguf: Path, threads: int, logfile: Path) -> int:
    """Load ``gguf`` with llama-cpp-python and run 8 tokens through it, in a child: its exit
    status (negative: the signal that killed it)."""
    code = ("import sys, llama_cpp; m = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, "
            "n_threads=int(sys.argv[2]), verbose=False); m.eval(list(range(1, 9)))")
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "a") as lf:
        lf.write(f"\n$ llama-cpp-python smoke run on {gguf}\n")
        lf.flush()
        return subprocess.run([str(python), "-c", code, str(gguf), str(threads)], check=False,
                              stdout=lf, stderr=lf, timeout=900).returncode


# ----------------------------------------------------------------------------- llama-server


def llama_binaries(work: Path, logs: Path, amx: bool = True) -> dict[str, Path]:
    """llama-server and llama-quantize, built once from the sdist's vendored llama.cpp: for this
    CPU (native), or (``amx`` false) with its extensions but not AMX (llama_cpu_cmake)."""
    bin_dir = work / "bin"
    cmake = LLAMA_CMAKE + llama_cpu_cmake(amx)
    stamp = {"sdist": LLAMA_SDIST, "cmake": cmake, "targets": LLAMA_TARGETS}
    paths = {t: bin_dir / t for t in LLAMA_TARGETS}
    if stamp_ok(bin_dir, stamp) and all(p.is_file() for p in paths.values()):
        return paths
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    log(f"setup: pip download {LLAMA_SDIST} (sources) and build {', '.join(LLAMA_TARGETS)} "
        "-- compiles llama.cpp, takes many minutes")
    run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
         LLAMA_SDIST, "-d", src], logs / "llama-build.log")
    archive = next(src.glob("*.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(src, filter="data")
    tree = next(p for p in src.glob("*/vendor/llama.cpp") if (p / "CMakeLists.txt").is_file())
    build = src / "build"
    run(["cmake", "-S", tree, "-B", build, *cmake], logs / "llama-build.log")
    run(["cmake", "--build", build, "--target", *LLAMA_TARGETS, "-j", str(os.cpu_count() or 2)],
        logs / "llama-build.log")
    bin_dir.mkdir(parents=True, exist_ok=True)
    for target, path in paths.items():
        shutil.copy2(build / "bin" / target, path)
    write_stamp(bin_dir, stamp)
    shutil.rmtree(src, ignore_errors=True)
    return paths


def llama_server_smoke(server: Path, gguf: Path, threads: int, logfile: Path,
                       timeout: float = 300) -> int:
    """Start ``server`` on ``gguf`` (it runs a warm-up decode while loading) and ask it for 4
    tokens: 0 when it answered, else its exit status (negative: the signal that killed it)."""
    import httpx

    port = free_port()
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "a") as lf:
        lf.write(f"\n$ llama-server smoke run on {gguf}\n")
        lf.flush()
        proc = subprocess.Popen([str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port",
                                 str(port), "-np", "1", "-c", "256", "-t", str(threads),
                                 "--no-webui"], stdout=lf, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    return proc.returncode
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        httpx.post(f"http://127.0.0.1:{port}/completion", timeout=timeout,
                                   json={"prompt": [1, 2, 3, 4, 5, 6, 7, 8], "n_predict": 4})
                        time.sleep(0.2)
                        return proc.poll() or 0
                except httpx.HTTPError:
                    if proc.poll() is not None:
                        return proc.returncode
                time.sleep(0.2)
            raise StepFailed(f"llama-server did not come up on {gguf} within {timeout:.0f} s "
                             f"(see {logfile})")
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

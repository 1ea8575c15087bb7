"""The peer comparison's measuring: rounds of every system on the same token ids, teacher-forced
fidelity, and ONNX Runtime profiles of our and onnxruntime-genai's sessions."""

from __future__ import annotations

import json
import random
import shutil
import statistics
from pathlib import Path

from benchmarks.core.env import GENAI_PACKAGES, Setup, worker
from benchmarks.core.proc import StepFailed, cpu_busy, log, run
from benchmarks.peers import (
    GENAI,
    HF,
    LLAMA,
    LLAMA_MATCH,
    LLAMA_MATCH_SHAPE,
    OURS,
    PRECISIONS,
    llama_match,
)

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
                ours_dirs[p] = setup.ours_export(hf, p, gguf)
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
        match = llama_match(args)
        try:
            llama_py, files = setup.llama(gguf, hf)
            llama_files = {q: f for q, f in files.items()
                           if q in {match[p] for p in args.precision}}
        except StepFailed as e:  # it crashes here even without AMX: the others still run
            rows += [{"system": LLAMA, "precision": match[p], "error": str(e).splitlines()[0]}
                     for p in args.precision]
            log(f"  FAILED: {e}")

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
            "hf_folder": str(hf), "profiles": profiles,
            "llama_build": getattr(setup, "llama_build", None)}


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
    """Rows grouped by precision (llama.cpp's f32/q8_0/Q4_1 or q4_0 beside fp32/int8/int4), then
    system."""
    group = {v: k for m in (LLAMA_MATCH, LLAMA_MATCH_SHAPE) for k, v in m.items()}.get(
        row["precision"], row["precision"])
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



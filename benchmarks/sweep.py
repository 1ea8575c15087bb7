"""Every causal LM class of the installed transformers, tried as a user's checkpoint would be: a
tiny random checkpoint of the class is saved by transformers, exported at fp32 and its greedy
tokens compared with transformers' own. Each class ends in one of:

    agrees        the export's greedy tokens equal transformers' (two prompts, 8 new tokens)
    differs       exported, but the tokens part: a bug of ours (the sweep fails)
    refused       the export refused it in one line (the line is the reason)
    broken        the export failed otherwise (a traceback, not a line: a bug of ours)
    not built     transformers itself could not build or run the tiny model (its reason)

    python -m benchmarks.sweep                          # all classes, writes docs/sweep.md
    python -m benchmarks.sweep --only LlamaForCausalLM MixtralForCausalLM --no-write
    python -m benchmarks.sweep --only MixtralForCausalLM --update   # one row of the table anew

Each class runs in a process of its own with a time limit, so one that hangs or crashes is
recorded, not fatal. The tiny shape is the class's defaults with the common size fields shrunk
(hidden 64, 2 layers, 4 heads of 16, 2 KV heads, vocabulary 256, 4 experts of which 2 active):
fields a class names otherwise keep its defaults, which may be too large to build in the limit
(then "not built: timed out")."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "docs" / "sweep.md"
RESULTS = ROOT / "results" / "sweep.json"
STATUSES = ("agrees", "differs", "refused", "broken", "not built")

# Size fields, by every name transformers' configs give them; a field a config lacks is skipped.
TINY = {
    "vocab_size": 256, "vocab_size_per_layer_input": 256, "hidden_size": 64, "n_embd": 64, "d_model": 64, "dim": 64,
    "num_hidden_layers": 2, "n_layer": 2, "n_layers": 2, "num_layers": 2,
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "num_heads": 4,
    "num_key_value_heads": 2, "multi_query_group_num": 2, "head_dim": 16,
    "intermediate_size": 128, "ffn_hidden_size": 128, "n_inner": 128, "ffn_dim": 128,
    "max_position_embeddings": 256, "n_positions": 256, "n_ctx": 256,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "moe_k": 2, "moe_topk": 2, "top_k": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "first_k_dense_replace": 1, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
    "is_decoder": True,  # the encoders' causal heads (BertLMHeadModel, ...) run as decoders
    # encoder-decoder classes' decoders, latent attention's ranks, partial rotary widths
    "decoder_layers": 2, "encoder_layers": 2, "decoder_attention_heads": 4,
    "encoder_attention_heads": 4, "decoder_ffn_dim": 128, "encoder_ffn_dim": 128,
    "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
    "v_head_dim": 16, "rotary_dim": 8, "n_group": 1, "topk_group": 1,
}
PROMPTS = ([5, 17, 42, 99, 7, 3, 250], [11, 200, 64])
NEW_TOKENS = 8


@dataclass
class Outcome:
    architecture: str
    status: str
    detail: str = ""
    seconds: float = 0.0


def causal_lm_classes() -> list[str]:
    """The class names transformers' AutoModelForCausalLM maps to, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names: set[str] = set()
    for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        names.update([value] if isinstance(value, str) else value)
    return sorted(names)


def _model_type(architecture: str) -> str:
    """The model type whose config builds ``architecture`` (a ``..._text`` one where the class
    is also a multimodal one's text model: Qwen3_5ForCausalLM is qwen3_5_text's)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = [t for t, value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()
             if architecture in ([value] if isinstance(value, str) else value)]
    if not types:
        raise KeyError(architecture)
    return next((t for t in types if t.endswith("_text")), types[0])


def tiny_config(architecture: str, layers: int = 2):
    """transformers' config of ``architecture`` built with the size fields it has shrunk (at
    construction, so the fields it derives, such as a layer pattern, follow them)."""
    from transformers import AutoConfig

    model_type = _model_type(architecture)

    def shrunk(defaults: dict) -> dict:
        out = {k: v for k, v in TINY.items() if k in defaults}
        for key in ("num_hidden_layers", "n_layer", "n_layers", "num_layers"):
            if key in out:
                out[key] = layers
        if isinstance(defaults.get("per_layer_config"), dict):  # 5.23's per-layer values
            out["per_layer_config"] = {k: v for k, v in defaults["per_layer_config"].items()
                                       if int(k) < layers}
        return out

    defaults = AutoConfig.for_model(model_type).to_dict()
    kwargs = shrunk(defaults)
    if isinstance(defaults.get("text_config"), dict):
        kwargs["text_config"] = dict(defaults["text_config"], **shrunk(defaults["text_config"]))
        kwargs["text_config"].pop("layer_types", None)
    try:
        config = AutoConfig.for_model(model_type, **kwargs)
    except Exception:  # noqa: BLE001 - a fixed default pattern: keep its start
        if not isinstance(defaults.get("layer_types"), list):
            raise
        layers = kwargs.get("num_hidden_layers", len(defaults["layer_types"]))
        config = AutoConfig.for_model(model_type, **kwargs,
                                      layer_types=defaults["layer_types"][:layers])
    config.architectures = [architecture]
    return config


def tiny_model(architecture: str, seed: int = 0, layers: int = 2):
    """transformers' model of ``architecture`` at a tiny shape, with random weights spread wide
    enough to expose bugs (norm weights off their init)."""
    import torch
    import transformers

    config = tiny_config(architecture, layers)
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith(".weight"):
                p.add_(0.2 * torch.randn(p.shape, generator=gen))
            elif p.dim() >= 2:
                p.copy_(0.08 * torch.randn(p.shape, generator=gen))
    return model


def _greedy(model, prompt: list[int], eos: list[int]) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                             eos_token_id=eos or None, pad_token_id=0, attention_mask=None)
    return out[0, len(prompt):].tolist()


def try_class(architecture: str) -> Outcome:
    """One class through the sweep, in this process."""
    from transformers.utils import logging

    from llm_onnx.checkpoints import open_checkpoint
    from llm_onnx.errors import LlmOnnxError
    from llm_onnx.export import ExportOptions, export_model
    from llm_onnx.runtime import Model

    logging.disable_progress_bar()
    with tempfile.TemporaryDirectory(prefix="llm-onnx-sweep-") as tmp:
        folder, out = Path(tmp) / "hf", Path(tmp) / "onnx"
        failed = None
        for layers in (2, 4):  # 4: a hybrid whose pattern puts attention 4th (Qwen3-Next)
            try:
                model = tiny_model(architecture, layers=layers)
                for prompt in PROMPTS:  # transformers can run it: else it is no reference
                    _greedy(model, prompt, [])
                model.save_pretrained(folder, safe_serialization=True)
                failed = None
                break
            except Exception as e:  # noqa: BLE001 - transformers' own limits, recorded
                failed = failed or e
        if failed is not None:
            return Outcome(architecture, "not built", _one_line(failed))
        try:
            export_model(open_checkpoint(folder), out,
                         ExportOptions(precision="fp32", max_seq_len=64), progress=False)
        except LlmOnnxError as e:
            message = str(e).replace(str(folder), "config").split(" Supported: ")[0]
            return Outcome(architecture, "refused" if "\n" not in message else "broken", message)
        except Exception:  # noqa: BLE001 - what a user would see as a traceback
            return Outcome(architecture, "broken", traceback.format_exc(limit=-3)[-600:])
        ours = Model.load(out, provider="cpu")
        eos = sorted(ours.eos_token_ids)
        want = [_greedy(model, p, eos) for p in PROMPTS]
        got = [r.token_ids for r in ours.generate(list(PROMPTS), max_new_tokens=NEW_TOKENS,
                                                  temperature=0)]
        if got != want:
            return Outcome(architecture, "differs", f"ours {got}, transformers {want}")
        return Outcome(architecture, "agrees")


def _one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return text[0][:300] if text else type(e).__name__


def _child(architecture: str, queue) -> None:
    try:
        queue.put(asdict(try_class(architecture)))
    except BaseException as e:  # noqa: BLE001 - the parent records it
        queue.put(asdict(Outcome(architecture, "broken", _one_line(e))))


def run_class(architecture: str, timeout: float) -> Outcome:
    """One class in a process of its own, at most ``timeout`` seconds."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start = time.monotonic()
    proc = ctx.Process(target=_child, args=(architecture, queue), daemon=True)
    proc.start()
    try:
        result = Outcome(**queue.get(timeout=timeout))
    except Exception:  # noqa: BLE001 - queue.Empty: hung or crashed
        proc.kill()
        code = proc.exitcode
        result = Outcome(architecture, "not built" if code is None else "broken",
                         f"timed out after {timeout:.0f} s" if code is None
                         else f"the process died (exit code {code})")
    proc.join(5)
    result.seconds = round(time.monotonic() - start, 1)
    return result


def table(outcomes: list[Outcome], version: str) -> str:
    counts = {s: sum(o.status == s for o in outcomes) for s in STATUSES}
    lines = [
        "# transformers' causal LMs, swept",
        "",
        f"Every class transformers {version} maps a causal LM to, as a tiny random checkpoint "
        "saved by transformers, exported at fp32 and compared greedily with transformers "
        f"({time.strftime('%Y-%m-%d')}, `python -m benchmarks.sweep`; what each status means: "
        "the module's docstring).",
        "",
        ", ".join(f"**{n} {s}**" for s, n in counts.items()) + f" of {len(outcomes)}.",
        "",
        "| class | status | detail |",
        "|---|---|---|",
    ]
    for o in sorted(outcomes, key=lambda o: (STATUSES.index(o.status), o.architecture)):
        detail = o.detail.replace("|", "\\|").replace("\n", " ")[:200]
        lines.append(f"| `{o.architecture}` | {o.status} | {detail} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="CLASS", help="these classes only")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per class")
    parser.add_argument("--update", action="store_true",
                        help="keep the other classes' outcomes from the last full sweep's "
                             "results and replace these")
    parser.add_argument("--no-write", action="store_true",
                        help=f"print only; do not write {TABLE.relative_to(ROOT)} and "
                             f"{RESULTS.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    import transformers

    classes = args.only or causal_lm_classes()
    outcomes = []
    for i, name in enumerate(classes, 1):
        outcome = run_class(name, args.timeout)
        outcomes.append(outcome)
        print(f"[{i}/{len(classes)}] {name}: {outcome.status} ({outcome.seconds} s) "
              f"{outcome.detail[:160]}", flush=True)
    if args.update and RESULTS.exists():
        fresh = {o.architecture for o in outcomes}
        kept = [Outcome(**o) for o in json.loads(RESULTS.read_text())["outcomes"]
                if o["architecture"] not in fresh]
        outcomes = sorted(kept + outcomes, key=lambda o: o.architecture)
    if not args.no_write:
        TABLE.write_text(table(outcomes, transformers.__version__), encoding="utf-8")
        RESULTS.write_text(json.dumps({"transformers": transformers.__version__,
                                       "date": time.strftime("%Y-%m-%d"),
                                       "outcomes": [asdict(o) for o in outcomes]}, indent=1),
                           encoding="utf-8")
    bad = [o for o in outcomes if o.status in ("differs", "broken")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""The parity gate: run the exported graphs in ONNX Runtime (CPU) against the torch decoder.

The torch side is the export form of the decoder (same modules, reference ops) holding the
tensors read back from weights.data, so the comparison isolates the graphs and their kernels.
Prompts of several lengths go through prefill.onnx as one right-padded batch, then a few greedy
steps through decode.onnx. An embedding model's embed.onnx is checked in
validate_embeddings.py, a folder's images (vision.onnx, a prompt with an image) in
validate_images.py. Models too large to run twice in memory are checked on their first layers
and the first rows of the vocabulary, exported the same way into a scratch folder.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llm_onnx import model_folder as names
from llm_onnx.errors import ParityError
from llm_onnx.export import quant
from llm_onnx.export.weights import StoredTensor
from llm_onnx.modeling.decoder import Decoder, owned_states
from llm_onnx.modeling.gemma_vision_config import bidirectional_layers
from llm_onnx.modeling.linear_attention import state_shapes

# the first one longer than kv_int8_attention.PROMPT_STEP: an int8 cache's long steps take the float
# node, its short ones the int8 node, and the gate sees both
PROMPT_LENGTHS = (17, 7, 4)
DECODE_STEPS = 4
# The linear-attention states are held to the logits' relative limit times this: they sum a
# whole prompt (float32 in both; quantized weights move them as they move the logits).
STATE_MARGIN = 10.0
# Router logits: a token whose k-th chosen expert leads the next by less than this is a
# near-tie, which the rounding of int8 activations may flip (tests/export/test_export.py).
ROUTING_GAP = 0.02


@dataclass(frozen=True)
class Thresholds:
    """What the gate holds an export to. It judges what a user would call broken: the next-token
    distributions (KL, over all positions and at the worst one, where a layout or packing bug
    shows as nats) and the top token wherever torch's choice was clear. The largest logit
    difference is reported as a diagnostic only: quantized weights of a model with wide logits
    move it past any fixed limit while the distributions agree (a tiny Qwen3.5 at int8: relative
    0.171, KL 0.0024)."""

    kl: float  # mean KL(torch || ORT) over the compared positions
    kl_position: float  # KL at any one position (a bug confined to one prompt or one step)
    # A position where torch's top token leads the second by less than tie x max(1, max|logits|)
    # is a near-tie: ONNX Runtime may pick the other one. Anywhere else it must pick the same.
    tie: float
    # Embeddings (max|diff| relative to their range, cosine 1 - this) and the linear-attention
    # states (times STATE_MARGIN, exact precisions only); a diagnostic for the logits.
    relative_logits: float


FP32 = Thresholds(kl=1e-6, kl_position=1e-5, tie=1e-4, relative_logits=1e-4)
FP16 = Thresholds(kl=2e-3, kl_position=2e-2, tie=2e-2, relative_logits=2e-2)
# Quantized weights with fp32 activations: the same dequantized math, summed in another order.
QUANT_EXACT = Thresholds(kl=1e-5, kl_position=1e-4, tie=1e-3, relative_logits=1e-3)
# int8 activations (accuracy_level 4, and QMoE's 8-bit path always) add rounding noise of their
# own; a layout or packing bug still shows as a KL of whole nats.
QUANT_INT8_ACTIVATIONS = Thresholds(kl=0.05, kl_position=0.25, tie=0.15, relative_logits=0.15)
# An int8 KV cache (--kv-cache int8): torch and ONNX Runtime compute a key a rounding apart, and
# a value near a half step rounds to a different int8 in each, a whole step (1/127 of the
# channel's range) apart. SmolLM2-135M fp32 measured relative 4.4e-3, KL 5e-5 (2026-11-25); a
# transposed or misread scale shows as KL of nats.
KV_INT8 = Thresholds(kl=1e-3, kl_position=1e-2, tie=0.05, relative_logits=0.05)


def thresholds(options) -> Thresholds:
    """The limits for an export with these ExportOptions."""
    base = _weight_thresholds(options)
    if options.kv_cache == "int8":
        return Thresholds(*(max(a, b) for a, b in zip(dataclasses.astuple(base),
                                                       dataclasses.astuple(KV_INT8))))
    return base


def _weight_thresholds(options) -> Thresholds:
    if options.precision == "fp32":
        return FP32
    if options.int8_activations:
        return QUANT_INT8_ACTIVATIONS
    if options.float16:  # fp16, and quantized weights with fp16 activations (CUDA folders)
        return FP16
    return QUANT_EXACT


def load_stored(model: Decoder, data_file: Path, tensors: dict[str, StoredTensor]) -> Decoder:
    """Fill a meta-device export-form decoder with the tensors stored in ``data_file``."""
    raw = np.memmap(data_file, dtype=np.uint8, mode="r")
    for name, st in tensors.items():
        arr = np.array(raw[st.offset:st.offset + st.length]).view(st.dtype).reshape(st.shape)
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        t = torch.from_numpy(arr)
        if attr in module._buffers:
            module._buffers[attr] = t
        else:
            setattr(module, attr, torch.nn.Parameter(t, requires_grad=False))
    head, embed = getattr(model, "lm_head", None), getattr(model.model, "embed_tokens", None)
    if getattr(model.config, "tie_word_embeddings", False) and isinstance(
            getattr(head, "weight", None), torch.nn.Parameter) \
            and isinstance(getattr(embed, "weight", None), torch.nn.Parameter):
        # A tied pair appears in the graph under one of its two names: share whichever was read.
        if head.weight.is_meta:
            head.weight = embed.weight
        elif embed.weight.is_meta:
            embed.weight = head.weight
    return model


def compute_in_float32(model: Decoder) -> Decoder:
    """Cast an fp16 export-form model's float tensors to fp32: the reference math, without
    torch's slow fp16 CPU kernels (ORT's CPU kernels also compute fp16 MatMuls in fp32)."""
    for module in model.modules():
        for name, t in list(module._parameters.items()) + list(module._buffers.items()):
            if t is not None and t.dtype == torch.float16:
                new = t.float()
                if name in module._parameters:
                    module._parameters[name] = torch.nn.Parameter(new, requires_grad=False)
                else:
                    module._buffers[name] = new
        if getattr(module, "dtype", None) == torch.float16:
            module.dtype = torch.float32
    return model


def prompts(vocab_size: int, seed: int = 1234) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, n).tolist() for n in PROMPT_LENGTHS]


@dataclass
class _Steps:
    """Per step: logits (B, V) float32, the first attention layer's present key (B, Hkv, L, D)
    and, for models with linear-attention layers, every such layer's present states."""

    logits: list[np.ndarray]
    keys: list[np.ndarray]
    states: list[list[np.ndarray]] = field(default_factory=list)
    # torch only, MoE models: per step, whether each row's routing has been clear so far (no
    # near-tie in any layer at any of its tokens; None: no experts)
    clear: list[np.ndarray] = field(default_factory=list)

    def record(self, logits: np.ndarray, present: list) -> None:
        """A step's logits and what it wrote: ``present`` in the graphs' output order."""
        cfg = self.cfg
        self.logits.append(logits)
        if cfg.attention_layers:  # (a model of linear-attention layers only has none)
            first = cfg.attention_layers[0]
            self.keys.append(np.asarray(present[2 * first], dtype=np.float32))
        self.states.append([np.asarray(present[2 * i + j], dtype=np.float32)
                            for i in cfg.linear_layers for j in (0, 1)])

    cfg: Any = None


def new_states(cfg, batch: int, length: int, kv_dtype: np.dtype) -> list[np.ndarray]:
    """Zeroed inputs for every layer's two state tensors, in the graphs' order: a KV buffer of
    ``length`` positions, or a linear-attention layer's conv and recurrent states (float32)."""
    out = []
    for i in cfg.state_layers:  # (Gemma 4's KV-shared layers own none)
        if cfg.is_linear_layer(i):
            out += [np.zeros((batch, *shape), dtype=np.float32)
                    for shape in state_shapes(cfg.linear_attention)]
        else:
            heads, head_dim = cfg.layer_kv_shape(i)
            shape = (batch, heads, length, head_dim)
            out += [np.zeros(shape, dtype=kv_dtype), np.zeros(shape, dtype=kv_dtype)]
    return out


def _batch(vocab: int) -> tuple[np.ndarray, list[int]]:
    rows = prompts(vocab)
    lens = [len(p) for p in rows]
    ids = np.zeros((len(rows), max(lens)), dtype=np.int64)
    for i, p in enumerate(rows):
        ids[i, :len(p)] = p
    return ids, lens


def run_reference(reference: Decoder, vocab: int) -> tuple[_Steps, list[np.ndarray]]:
    """Torch: prefill the batch, then greedy steps; returns the steps and the tokens fed."""
    ids, lens = _batch(vocab)
    b, t = ids.shape
    cache = reference.new_cache(b, t + DECODE_STEPS + 1)
    steps = _Steps([], [], cfg=reference.config)
    fed: list[np.ndarray] = []
    seqlens, total, tokens, last_only = [n - 1 for n in lens], t, torch.from_numpy(ids), True
    gaps: list[torch.Tensor] = []
    hooks = _router_hooks(reference, gaps)
    clear = np.ones(b, dtype=bool)
    with torch.no_grad(), quant.dequantized_once():
        for step in range(DECODE_STEPS + 1):
            gaps.clear()
            out = reference(tokens, torch.tensor(seqlens, dtype=torch.int32),
                            torch.tensor(total, dtype=torch.int32), *cache, last_only=last_only)
            if hooks:  # each row's smallest lead of its k-th expert, over layers and its tokens
                real = (torch.arange(tokens.shape[1])[None, :]
                        < torch.tensor(lens if last_only else [1] * b)[:, None])  # not padding
                lead = torch.stack([g.reshape(b, -1).masked_fill(~real, float("inf")).min(1).values
                                    for g in gaps]).min(0).values
                clear &= lead.numpy() >= ROUTING_GAP
                steps.clear.append(clear.copy())
            logits = out[0][:, -1, :vocab].float().numpy()
            steps.record(logits, [t.float().numpy() for t in out[1:]])
            cache = reference.next_cache(out[1:])
            nxt = logits.argmax(-1)[:, None].astype(np.int64)
            fed.append(nxt)
            seqlens = [n + 1 for n in seqlens] if step else [n for n in lens]
            total = max(seqlens) + 1
            tokens, last_only = torch.from_numpy(nxt), False
    for hook in hooks:
        hook.remove()
    return steps, fed


def _router_hooks(model: Decoder, gaps: list[torch.Tensor]) -> list:
    """Hooks recording, per token of every MoE layer, how far the k-th chosen expert's router
    logit leads the next one's."""
    from llm_onnx.modeling.mlp import Gemma4Router, SparseMoE

    moe = model.config.moe
    hooks: list = []
    if moe is None or moe.num_experts_per_tok >= moe.num_experts:
        return hooks
    k = moe.num_experts_per_tok

    def record(_, inputs, output) -> None:
        top = output.float().topk(k + 1, dim=-1).values
        gaps.append(top[..., k - 1] - top[..., k])

    for module in model.modules():
        if isinstance(module, SparseMoE):
            hooks.append(module.gate.register_forward_hook(record))
        elif isinstance(module, Gemma4Router):
            hooks.append(module.proj.register_forward_hook(record))
    return hooks


def run_onnx(folder: Path, cfg, kv_dtype: np.dtype, vocab: int, fed: list[np.ndarray],
             kernels: bool = False, vision=None) -> _Steps:
    """ORT: prefill.onnx on the batch, then decode.onnx on the tokens torch chose. One session
    at a time, so a graph's fp32 copies of fp16 weights are never held twice. ``kernels``: the
    graphs use llm-onnx's own operators (its library is registered). ``vision``: the graphs
    take images too (none here: text positions, no image rows)."""
    import gc

    import onnxruntime as ort

    ids, lens = _batch(vocab)
    b, t = ids.shape
    cache = new_states(cfg, b, t + DECODE_STEPS + 1, kv_dtype)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if kernels:
        from llm_onnx import kernels as library

        library.register(so)
    steps = _Steps([], [], cfg=cfg)
    state_names = names.state_names(cfg.num_hidden_layers, cfg.linear_layers,
                                    [i for i in range(cfg.num_hidden_layers) if cfg.is_kv_shared(i)])

    def feed(tokens: np.ndarray, seqlens: list[int], total: int, valid: list[int]) -> dict:
        out = {names.INPUT_IDS: tokens, names.SEQLENS_K: np.array(seqlens, dtype=np.int32),
               names.TOTAL_SEQUENCE_LENGTH: np.array(total, dtype=np.int32)}
        out.update({past: cache[j] for j, (past, _) in enumerate(state_names)})
        if cfg.linear_layers:
            out[names.VALID_TOKENS] = np.array(valid, dtype=np.int32)
        if vision is not None:  # a first prompt at 0 .. T-1, a step at each row's length
            first = tokens.shape[1] == total
            out.update(text_only_inputs(vision, cfg.hidden_size, np.broadcast_to(
                np.arange(tokens.shape[1]), tokens.shape) if first else
                np.array(seqlens)[:, None] + np.arange(tokens.shape[1]) + 1 - tokens.shape[1],
                bool(bidirectional_layers(vision, cfg))))
        return out

    def record(out: list[np.ndarray]) -> None:
        logits = out[0][:, -1, :vocab].astype(np.float32)
        if out[0].shape[1] > 1:  # an --all-logits prefill: each row's last prompt token
            logits = out[0][np.arange(len(lens)), np.array(lens) - 1, :vocab].astype(np.float32)
        if not np.all(np.isfinite(logits)):
            raise ParityError(f"ONNX Runtime produced inf/NaN logits at step {len(steps.logits)}.")
        steps.record(logits, out[1:])
        cache[:] = owned_states(cfg, out[1:])  # (Gemma 4: not its shared layers' presents)

    session = ort.InferenceSession(str(folder / "prefill.onnx"), so, providers=["CPUExecutionProvider"])
    record(session.run(None, feed(ids, [n - 1 for n in lens], t, lens)))
    del session
    gc.collect()
    session = ort.InferenceSession(str(folder / "decode.onnx"), so, providers=["CPUExecutionProvider"])
    seqlens = list(lens)
    for step in range(DECODE_STEPS):
        record(session.run(None, feed(fed[step], seqlens, max(seqlens) + 1, [1] * len(lens))))
        seqlens = [n + 1 for n in seqlens]
    return steps


def text_only_inputs(vision, width: int, positions: np.ndarray, attend: bool = False) -> dict:
    """The image inputs of a run without images: ``positions`` (B, T) in all three rows
    (Qwen), ``attend_until`` zeros (``attend``: Gemma's image layers; causal)."""
    out = {names.IMAGE_EMBEDS: np.zeros((0, width), np.float32),
           names.IMAGE_TOKEN_INDEX: np.zeros(0, np.int64)}
    if vision.mrope_section:
        out[names.POSITION_IDS] = np.ascontiguousarray(np.broadcast_to(
            np.asarray(positions, dtype=np.int64)[None], (3, *np.shape(positions))))
    if attend:
        out[names.ATTEND_UNTIL] = np.zeros(np.shape(positions), np.int64)
    if vision.deepstack_layers:
        out[names.DEEPSTACK_EMBEDS] = np.zeros((vision.deepstack_layers, 0, width), np.float32)
    return out


def run_engine(engine, vocab: int, fed: list[np.ndarray]) -> _Steps:
    """The runtime's own path (llm_onnx.runtime.Engine: its KV cache, bindings and, on CUDA,
    its device buffers and CUDA graphs) over the same prompts: each row prefilled alone, then
    the rows decoded together (ragged lengths) on the tokens torch chose."""
    ids, lens = _batch(vocab)
    cache = engine.new_cache(len(lens), max(lens) + DECODE_STEPS + 1)
    first = np.stack([engine.prefill(cache, row, ids[row, :n]) for row, n in enumerate(lens)])
    steps = _Steps([first[:, :vocab].astype(np.float32)], [])
    for step in range(DECODE_STEPS):
        logits = engine.decode(cache, fed[step][:, 0])
        steps.logits.append(np.asarray(logits)[:, :vocab].astype(np.float32))
    for logits in steps.logits:
        if not np.all(np.isfinite(logits)):
            raise ParityError("the runtime produced inf/NaN logits.")
    return steps


def _logit_stats(torch_steps: _Steps, other: _Steps, limits: Thresholds,
                 routing_aware: bool = False) -> dict:
    """Two runs over the same inputs, position by position (each prompt row at each step): the
    KL of the next-token distributions (mean and worst), the top tokens (agreement over all
    positions and over those where torch's lead was clear, the first clear one that differs)
    and the largest logit difference (absolute and relative to the logits' range; a
    diagnostic). ``routing_aware`` (int8 activations): in MoE models the worst position, the
    top tokens and the largest difference are taken over the rows whose routing the torch
    reference decided clearly so far (a near-tie that the activations' rounding flips sends a
    token to other experts and moves its row by whole logits: a tiny Qwen3.5-MoE at int8
    measured KL 0.24 at such a position); the mean KL still counts every row."""
    clear = (torch_steps.clear if routing_aware and torch_steps.clear else
             [np.ones(a.shape[0], dtype=bool) for a in torch_steps.logits])
    max_diff = max([float(np.abs(a[c] - b[c]).max())
                    for a, b, c in zip(torch_steps.logits, other.logits, clear) if c.any()],
                   default=0.0)
    max_logit = max(float(np.abs(a).max()) for a in torch_steps.logits)
    scale = max(1.0, max_logit)
    kls, agree, total, flips, decided, decided_agree = [], 0, 0, [], 0, 0
    for step, (a, b) in enumerate(zip(torch_steps.logits, other.logits)):
        row_kl = _kl_rows(a, b)
        top2 = np.sort(a, axis=-1)[:, -2:]
        lead = top2[:, 1] - top2[:, 0]
        for row in range(a.shape[0]):
            kls.append((float(row_kl[row]), row, step, bool(clear[step][row])))
            same = int(a[row].argmax()) == int(b[row].argmax())
            agree += same
            total += 1
            if lead[row] >= limits.tie * scale and clear[step][row]:
                decided += 1
                decided_agree += same
                if not same:
                    flips.append((row, step, int(a[row].argmax()), int(b[row].argmax()),
                                  float(lead[row])))
    routed = [k for k in kls if k[3]] or [(0.0, 0, 0, True)]
    worst = max(routed, key=lambda x: (not math.isfinite(x[0]), x[0]))
    return {"logits_max_abs_diff": max_diff, "logits_max_abs": max_logit,
            "relative_logits_diff": max_diff / scale,
            "kl_divergence": float(np.mean([k[0] for k in kls])),
            "kl_max_position": worst[0], "worst_position": worst[1:3],
            "greedy_agreement": agree / total,
            # (None: no position was clear, as in a tiny random model's flat distributions)
            "clear_positions": decided,
            "clear_agreement": decided_agree / decided if decided else None,
            "clear_flips": flips}


def _kl_rows(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    p = torch.log_softmax(torch.from_numpy(p_logits).double(), -1)
    q = torch.log_softmax(torch.from_numpy(q_logits).double(), -1)
    return (p.exp() * (p - q)).sum(-1).numpy()


def _where(row: int, step: int) -> str:
    """A compared position in words: which prompt (its length) and which step."""
    what = "its prefill" if step == 0 else f"decode step {step}"
    return f"prompt {row + 1} ({PROMPT_LENGTHS[row]} tokens), {what}"


def _failures(stats: dict, limits: Thresholds) -> list[str]:
    """What makes these figures a broken export, in words naming the position (empty: none)."""
    out = []
    kl, worst = stats["kl_divergence"], stats["kl_max_position"]
    if not math.isfinite(kl) or kl > limits.kl:
        out.append(f"mean KL {kl:.3g} over {len(PROMPT_LENGTHS) * (DECODE_STEPS + 1)} positions "
                   f"(limit {limits.kl:g})")
    if not math.isfinite(worst) or worst > limits.kl_position:
        out.append(f"KL {worst:.3g} at {_where(*stats['worst_position'])} (limit "
                   f"{limits.kl_position:g} at any one position)")
    flips = stats["clear_flips"]
    if flips:
        row, step, want, got, lead = flips[0]
        out.append(f"the top token differs at {len(flips)} of {stats['clear_positions']} "
                   f"positions where torch's choice was clear (first at {_where(row, step)}: "
                   f"token {got} instead of {want}, which led by {lead:.3g} logits)")
    return out


def _refusal(what: str, stats: dict, failures: list[str], more: str = "") -> str:
    return (f"{what} vs torch: {'; '.join(failures)}. Diagnostics: logits max|diff| "
            f"{stats['logits_max_abs_diff']:.3g} (relative {stats['relative_logits_diff']:.3g}), "
            f"greedy agreement {stats['greedy_agreement']:.0%}{more}. The export is refused as broken; "
            "--allow-parity-failure keeps it anyway (the figures go into its manifest), "
            "--no-validate skips the check.")


REPORTED = ("relative_logits_diff", "kl_divergence", "kl_max_position", "greedy_agreement",
            "clear_agreement")


def compare_logits(torch_steps: _Steps, other: _Steps, limits: Thresholds, what: str,
                   strict: bool = True) -> dict:
    """Logits-only comparison (KL, top tokens; the relative difference as a diagnostic)."""
    stats = _logit_stats(torch_steps, other, limits, limits == QUANT_INT8_ACTIVATIONS)
    failures = _failures(stats, limits)
    if failures and strict:
        raise ParityError(_refusal(what, stats, failures))
    return {**{k: stats[k] for k in REPORTED}, "failures": failures}


def compare(torch_steps: _Steps, onnx_steps: _Steps, limits: Thresholds,
            strict: bool = True) -> dict:
    """The parity report of two runs over the same inputs; ParityError where the figures say the
    export is broken (``strict`` False: the reasons go into the report's ``failures``)."""
    lens = list(PROMPT_LENGTHS)
    stats = _logit_stats(torch_steps, onnx_steps, limits, limits == QUANT_INT8_ACTIVATIONS)
    failures = _failures(stats, limits)
    kv_diff = 0.0
    for step, (a, b) in enumerate(zip(torch_steps.keys, onnx_steps.keys)):
        for row, n in enumerate(lens):  # only the valid positions of each row
            kv_diff = max(kv_diff, float(np.abs(a[row, :, :n + step] - b[row, :, :n + step]).max()))
    report = {
        "prompts": len(lens), "prompt_lengths": lens, "decode_steps": DECODE_STEPS,
        **{k: v for k, v in stats.items() if k not in ("worst_position", "clear_flips")},
        "present_kv_max_abs_diff": kv_diff,
        "thresholds": {"kl": limits.kl, "kl_position": limits.kl_position, "tie": limits.tie},
    }
    states = [s for step in torch_steps.states for s in step]
    if states:  # linear-attention layers: their states, relative to the states' own size
        diff = max(float(np.abs(a - b).max()) for x, y in zip(torch_steps.states,
                                                            onnx_steps.states)
                   for a, b in zip(x, y))
        scale = max(1.0, max(float(np.abs(a).max()) for a in states))
        report["present_state_max_abs_diff"] = diff
        # Held where the math is the same on both sides (a bug, not rounding, moves them);
        # with int8 activations or fp16 they are a diagnostic as the logits' difference is.
        if limits in (FP32, QUANT_EXACT) and not diff / scale <= limits.relative_logits * STATE_MARGIN:
            failures.append(f"linear-attention states max|diff| {diff:.3g} (relative "
                            f"{diff / scale:.3g}, limit {limits.relative_logits * STATE_MARGIN:g})")
    if failures and strict:
        raise ParityError(_refusal("ONNX", stats, failures,
                                   f", present KV max|diff| {kv_diff:.3g}"))
    report["failures"] = failures
    return report

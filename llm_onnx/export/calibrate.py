"""Activation-aware int4 (``quant_method="awq"``): a short calibration text run through the
float model one layer at a time, then per-channel scales folded into the weights and an
activation-weighted block search.

For each group of projections that read one input (q/k/v, gate/up, down, o) it measures each
input channel's activation mean square h over the calibration tokens. Quantization error on
channel k moves the output by about h_k times its square, so

  1. the block search (quant.search_zero_point) weights each weight's error by h_k;
  2. channels that carry large activations are scaled up before quantizing, W' = W diag(s),
     and the inverse is folded into what produces the input (AWQ): the preceding norm's weight
     (and bias) for q/k/v and gate/up, the rows of up for down, the rows of v for o (s shared
     by the query heads of one KV head). In float the graph computes exactly what it did; the
     scaled weights quantize with smaller relative error where it matters. s = h^(alpha/2),
     alpha per group from 0..0.6, the one whose round-to-nearest error sum(h * dW^2) is least.

A mixture of experts' experts (QMoE: symmetric, no folds) get the search too, weighted per
expert by the router-weighted statistics of the calibration tokens routed to it
(StreamedExperts).

Nothing changes at run time: the graphs and their MatMulNBits layout are those of any
zero-point int4 export; only the stored numbers differ. Memory stays bounded: the calibration
holds one float32 layer (less its experts, read one at a time) and the calibration activations
at a time. The same run records an int8 KV cache's scales (kv_scales.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor, nn

from llm_onnx.checkpoints.load import (
    Checkpoint,
    ExpertsProducer,
    _set_param,
    build_model,
    param_producers,
)
from llm_onnx.checkpoints.sources import TensorSource
from llm_onnx.errors import ExportError
from llm_onnx.export.calibration_text import CALIBRATION_TEXT, KV_CALIBRATION_TEXT
from llm_onnx.export.folder import HeapTrim
from llm_onnx.export.kv_rotation import rotates_values
from llm_onnx.export.kv_scales import layer_scales, watch_layer
from llm_onnx.modeling import ops
from llm_onnx.modeling.attention import SharedKVAttention
from llm_onnx.modeling.config import ModelConfig
from llm_onnx.modeling.decoder import Fusion
from llm_onnx.modeling.layers import Linear
from llm_onnx.modeling.mlp import Experts, GeGLUExperts, PackedGatedMLP, PlainMLP, SharedExpertMoE

ALPHAS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
MAX_TOKENS = 512  # calibration tokens used (one sequence)
KV_MAX_TOKENS = 3072  # with an int8 KV cache, whose static scales must have seen loud channels
PICK_ROWS = 1024  # rows of each projection the choice of alpha is estimated on

@dataclass
class Calibration:
    """What the export applies: ``folds`` (parameter name -> transforms of the checkpoint tensor,
    in order) and ``importance`` (quantized module path -> per-input-channel weights of its block
    search), plus what the manifest says about it."""

    folds: dict[str, list[Callable[[Tensor], Tensor]]] = field(default_factory=dict)
    importance: dict[str, Tensor] = field(default_factory=dict)
    description: str = ""
    kv_scales: dict[str, Tensor] = field(default_factory=dict)  # an int8 KV cache's, by name

    def fold(self, name: str, fn: Callable[[Tensor], Tensor]) -> None:
        self.folds.setdefault(name, []).append(fn)

    def producers(self, producers: dict) -> dict:
        """``producers`` with the folds applied to what they produce (folds of parameters the
        plan lacks are skipped: the parity gate's cut-down model has only the first layer)."""
        out = dict(producers)
        out.update({n: (lambda src, t=t: t) for n, t in self.kv_scales.items() if n in out})
        for name, fns in self.folds.items():
            if name not in producers:
                continue

            def produce(src, base=producers[name], fns=tuple(fns)):
                t = base(src).float()
                for fn in fns:
                    t = fn(t)
                return t
            out[name] = produce
        return out


def calibration_ids(checkpoint: Checkpoint, text: str | None = None,
                    max_tokens: int = MAX_TOKENS, kv: bool = False) -> tuple[list[int], str]:
    """Token ids of the calibration text (the built-in one unless ``text``; with ``kv``, an int8
    KV cache's, the built-in one goes on with KV_CALIBRATION_TEXT) with the checkpoint's
    tokenizer; a checkpoint without one (random weights) gets seeded random ids."""
    vocab = checkpoint.config.vocab_size
    max_tokens = min(max_tokens, checkpoint.config.max_position_embeddings)

    def random_ids(why: str) -> tuple[list[int], str]:
        g = torch.Generator().manual_seed(0)
        n = min(max_tokens, 256)
        return torch.randint(0, vocab, (n,), generator=g).tolist(), f"{n} random token ids ({why})"

    tok_json = checkpoint.tokenizer_files.get("tokenizer.json")
    if tok_json is None:
        return random_ids("no tokenizer")
    from tokenizers import Tokenizer

    builtin = CALIBRATION_TEXT + (KV_CALIBRATION_TEXT if kv else "")
    ids = Tokenizer.from_str(tok_json.decode("utf-8")).encode(
        text or builtin, add_special_tokens=False).ids[:max_tokens]
    ids = [i for i in ids if i < vocab]
    if len(ids) < 16:
        raise ExportError(f"the calibration text gives {len(ids)} tokens; at least 16 are needed.")
    distinct = len(set(ids))
    if distinct < len(ids) // 8:  # e.g. a tokenizer that maps the text to its unknown token
        if text:
            raise ExportError(f"the calibration text gives {len(ids)} tokens but only {distinct} "
                              "distinct ones with this model's tokenizer; give a text in the "
                              "model's language.")
        return random_ids(f"the built-in text gives {distinct} distinct tokens")
    return ids, f"{'given' if text else 'built-in'} text, {len(ids)} tokens"


def calibrate(checkpoint: Checkpoint, fusion: Fusion, block_size: int, ids: list[int],
              description: str, progress: Callable[[int], None] = lambda n: None, *,
              awq: bool = True, kv_scales: bool = False,
              max_positions: int | None = None) -> Calibration:
    """Run ``ids`` through the float32 model a layer at a time (weights read, used, dropped) and
    decide what is asked: awq's scales and search weights, an int8 KV cache's scales (whose
    rotated keys are scaled over RoPE tables of ``max_positions`` rows: the export's context)."""
    cfg = checkpoint.config
    source = checkpoint.source
    model = build_model(cfg, dtype=torch.float32, fusion=fusion,
                        max_positions=max(len(ids), max_positions or 2))
    producers = dict(param_producers(model))
    cal = Calibration(description=description)
    trim = HeapTrim()  # a layer's freed float weights and streamed experts, given back

    def load(prefix: str, keep: Callable[[str], bool] = lambda n: True) -> None:
        for name, produce in producers.items():
            if name.startswith(prefix) and keep(name):
                _set_param(model, name, produce(source))

    def drop(module: nn.Module) -> None:
        module.to("meta")

    m = model.model
    t = len(ids)
    input_ids = torch.tensor([ids])
    seqlens_k = torch.tensor([t - 1], dtype=torch.int32)
    total = torch.tensor(t, dtype=torch.int32)
    with torch.inference_mode():
        # the embedding side (everything before the layers), then dropped. Of the token table
        # only the rows of ``ids`` are kept, cast to float32 after the gather: the whole table in
        # float32 (2.3 GiB for a 152k x 4096 vocabulary) would double the export's peak memory.
        table = "model.embed_tokens.weight"
        per_layer = "model.embed_tokens_per_layer.weight"  # Gemma 4's second token table
        load("model.", keep=lambda n: not n.startswith(("model.layers.", "model.norm."))
             and n not in (table, per_layer))
        rows, row_of = torch.unique(input_ids, return_inverse=True)
        for name, module in ((table, m.embed_tokens),
                             (per_layer, getattr(m, "embed_tokens_per_layer", None))):
            if module is None:
                continue
            stored = producers[name](source)
            module.weight = nn.Parameter(stored[rows].float(), requires_grad=False)
            del stored
        x = model.embed(row_of, seqlens_k, total)
        for name, mod in m.named_children():
            if name != "layers" and not name.startswith("rotary"):
                drop(mod)
        # Gemma 4: a KV-shared layer attends over its source's present cache (Decoder's
        # hidden_states), kept here past the source layer's drop
        sources: dict[int, tuple] = {}
        for i, layer in enumerate(m.layers):
            prefix = f"model.layers.{i}."
            load(prefix, keep=lambda n: ".experts." not in n)
            if isinstance(getattr(layer, "experts", None), GeGLUExperts):
                # Gemma 4's stacked experts stay in the checkpoint's float dtype (a 26B-A4B
                # layer's are 3 GB in float32, 1.5 in bfloat16); GeGLUExperts casts the ones it
                # runs, so the sums are the float32 model's
                for part in ("gate_up_proj", "down_proj"):
                    name = f"{prefix}experts.{part}"
                    stored = producers[name](source)
                    old_param = getattr(layer.experts, part)
                    if tuple(stored.shape) != tuple(old_param.shape):
                        _set_param(model, name, stored)  # raises, naming the tensor and shapes
                    if not stored.is_floating_point() or stored.dtype == torch.float64:
                        stored = stored.float()
                    setattr(layer.experts, part, nn.Parameter(stored, requires_grad=False))
            if isinstance(getattr(layer.mlp, "experts", None), Experts):
                experts = f"{prefix}mlp.experts."
                old = layer.mlp.experts
                layer.mlp.experts = StreamedExperts(producers[f"{experts}gate_up_proj"],
                                                    producers[f"{experts}down_proj"], source)
                if old.bias:  # gpt-oss: its (small) biases loaded whole, its activation kept
                    layer.mlp.experts.biases = tuple(
                        producers[f"{experts}{p}"](source).float()
                        for p in ("gate_up_proj_bias", "down_proj_bias"))
                layer.mlp.experts.activation = old.activation
            stats = _input_stats(layer) if awq else {"hooks": []}
            seen = watch_layer(layer, cfg, i) if kv_scales else None
            if cfg.is_kv_shared(i):
                nk, nv, pk, pv = sources[cfg.kv_source(i)]
                model.run_layer(i, x, seqlens_k, total, pk, pv, reuse=(nk, nv))
            else:
                pk, pv = model.run_layer(i, x, seqlens_k, total,
                                         *model.new_layer_cache(i, 1, t))
                if cfg.shares_kv and not layer.linear:
                    sources[i] = (*layer.new_kv, pk, pv)
            for hook in stats.pop("hooks"):
                hook.remove()
            cal.kv_scales.update(layer_scales(layer, prefix, seen, x.rope if not
                                              cfg.layer_is_local(i) else x.local,
                                              rotates_values(cfg, i)))
            if awq:
                _decide_layer(cal, cfg, layer, prefix, stats, block_size)
                if isinstance(getattr(layer.mlp, "experts", None), StreamedExperts):
                    layer.mlp.experts.decide(cal, f"{prefix}mlp.experts")
            trim(sum(p.nbytes for p in layer.parameters() if not p.is_meta))
            drop(layer)
            progress(1)
        if awq and cfg.embedding.embed_dim is None:  # the LM head input: the final norm output
            if cfg.residual.topology == "post":
                h = x.residual
            else:
                assert x.branch is not None
                load("model.norm.")
                h, _ = m.norm.add(x.branch.float(), x.residual)
                drop(m.norm)
            x = h.reshape(-1, h.shape[-1]).double()
            cal.importance["lm_head"] = _finite((x * x).mean(0).float())
    return cal


class StreamedExperts(nn.Module):
    """A layer's experts for the calibration run: each read from the checkpoint when a token
    chooses it, in float32, and dropped after use (ops.moe_ref over per-expert sequences), so a
    layer's stacked experts (2.3 GiB in float32 for Qwen3-30B-A3B) never exist.

    It also records each expert's router-weighted input statistics: for expert e, over the
    tokens routed to it with routing weights w, h_e = sum(w x^2) / sum(w) per input channel of
    gate/up (x: the normed hidden state) and of down (x: act(gate) * up). They weight the
    experts' block search as the activations weight the dense projections' (``decide``)."""

    def __init__(self, gate_up: ExpertsProducer, down: ExpertsProducer,
                 source: TensorSource) -> None:
        super().__init__()
        self.gate_up = _Experts(gate_up, source)
        self.down = _Experts(down, source)
        self.sums: dict[str, dict[int, Tensor]] = {"gate_up": {}, "down": {}}
        self.weight: dict[int, float] = {}
        self.biases: tuple[Tensor | None, Tensor | None] = (None, None)  # gpt-oss's
        self.activation: tuple[float, float, float | None] = (1.0, 0.0, None)

    def forward(self, x: Tensor, router_logits: Tensor, k: int, normalize: bool) -> Tensor:
        return ops.moe_ref(x, router_logits, self.gate_up, self.down, k, normalize, self._observe,
                           *self.biases, self.activation)

    def _observe(self, e: int, xe: Tensor, weight: Tensor, act: Tensor) -> None:
        w = weight.double()[:, None]
        for part, v in (("gate_up", xe), ("down", act)):
            total = (w * v.double() ** 2).sum(0)
            self.sums[part][e] = self.sums[part].get(e, 0) + total
        self.weight[e] = self.weight.get(e, 0.0) + float(weight.double().sum())

    def decide(self, cal: Calibration, path: str) -> None:
        """cal.importance[f"{path}.gate_up_proj" | ".down_proj"]: (E, K) search weights. An
        expert no calibration token chose gets the router-weighted mean over the layer's others
        (its input's distribution, as far as the calibration saw it)."""
        if not self.weight:
            return
        for part, sums in self.sums.items():
            chosen = sorted(sums)
            mean = sum(sums[e] for e in chosen) / sum(self.weight[e] for e in chosen)
            rows = [sums[e] / self.weight[e] if e in sums and self.weight[e] > 0 else mean
                    for e in range(len(self.gate_up))]
            cal.importance[f"{path}.{part}_proj"] = _finite(torch.stack(rows).float())


class _Experts:
    """Expert e's float32 tensor on indexing, built then from the checkpoint."""

    def __init__(self, producer: ExpertsProducer, source: TensorSource) -> None:
        self.producer, self.source = producer, source

    def __len__(self) -> int:
        return self.producer.num_experts

    def __getitem__(self, e: int) -> Tensor:
        return self.producer.expert(self.source, e).float()


def _finite(h: Tensor) -> Tensor:
    """Activation mean squares, or ones where a random model overflowed."""
    return h if bool(torch.isfinite(h).all()) else torch.ones_like(h)


def _input_stats(layer: nn.Module) -> dict:
    """Forward hooks that record each Linear's input mean square per channel (float64)."""
    stats: dict = {"hooks": []}
    for path, mod in layer.named_modules():
        if isinstance(mod, Linear):
            def hook(mod, inp, out, path=path):
                x = inp[0].reshape(-1, inp[0].shape[-1]).double()
                stats[path] = (x * x).mean(0)
            stats["hooks"].append(mod.register_forward_hook(hook))
    return stats


def _decide_layer(cal: Calibration, cfg: ModelConfig, layer: nn.Module, prefix: str,
                  stats: dict, block_size: int) -> None:
    """Scales and search weights of one layer's groups (see the module docstring)."""
    mlp = layer.mlp
    plain = cfg.residual.topology == "pre"
    if layer.linear:  # Qwen3.5's linear attention: every projection of the normed input (the
        # float in_proj_b / in_proj_a too, so the fold into the norm keeps them exact), and
        # out_proj, whose input the gated norm's weight scales per value-head channel
        _group(cal, layer, prefix, [f"linear_attn.in_proj_{p}" for p in ("qkv", "z", "b", "a")],
               stats, block_size, norm="input_layernorm" if plain else None)
        _group_shared(cal, layer, prefix, "linear_attn.out_proj", "linear_attn.norm", stats,
                      block_size, layer.linear_attn.la.num_value_heads)
    else:
        attn = layer.self_attn
        qkv = ["self_attn.qkv_proj"] if attn.spec.packed_qkv else \
            [f"self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")
             if hasattr(attn, p)]  # (Gemma 4: no v_proj with k_eq_v, only q in shared layers)
        _group(cal, layer, prefix, qkv, stats, block_size,
               norm="input_layernorm" if plain else None)
        _group_o(cal, cfg, layer, prefix, stats, block_size)
    if not hasattr(mlp, "down_proj"):  # MoE: the experts' search weights are per expert
        # (StreamedExperts.decide); no scales are folded into them, nor into the norm they
        # share with a shared expert, whose down_proj still folds into its up_proj
        if isinstance(mlp, SharedExpertMoE):
            _mlp_groups(cal, cfg, layer, prefix, "mlp.shared_expert.", stats, block_size, None)
        return
    _mlp_groups(cal, cfg, layer, prefix, "mlp.", stats, block_size,
                "post_attention_layernorm" if plain else None)


def _mlp_groups(cal: Calibration, cfg: ModelConfig, layer: nn.Module, prefix: str, at: str,
                stats: dict, block_size: int, norm: str | None) -> None:
    """A dense MLP's groups (``at``: its path in the layer, "mlp." or "mlp.shared_expert.")."""
    mlp = layer.get_submodule(at.rstrip("."))
    packed, gated = isinstance(mlp, PackedGatedMLP), not isinstance(mlp, PlainMLP)
    up = [f"{at}gate_up_proj"] if packed else \
        ([f"{at}gate_proj", f"{at}up_proj"] if gated else [f"{at}up_proj"])
    _group(cal, layer, prefix, up, stats, block_size, norm=norm)
    # down's input is act(gate) * up (or act(up)): a scale folds into up's rows when the
    # activation commutes with it (gated, or ReLU: positively homogeneous)
    rows = None
    if gated or cfg.hidden_act == "relu":
        width = mlp.down_proj.in_features
        rows = (f"{at}gate_up_proj", width) if packed else (f"{at}up_proj", 0)
    _group(cal, layer, prefix, [f"{at}down_proj"], stats, block_size, rows=rows)


def _pick(weights: list[Tensor], h: Tensor, block_size: int, shared: Tensor | None = None,
          ) -> tuple[float, Tensor]:
    """The alpha (and its scale vector s, geometric mean 1) whose round-to-nearest int4 error
    sum(h * dW^2) over ``weights`` is least. ``shared`` (the h the scale is computed from) when
    it must be constant over channel groups."""
    from llm_onnx.export.quant import _blocks, _minmax_zero_point

    basis = (shared if shared is not None else h).clamp_min(1e-12)
    best: tuple[float, float, Tensor] | None = None
    for alpha in ALPHAS:
        s = basis.pow(alpha / 2)
        s = s / (s.max() * s.min()).sqrt()
        err = 0.0
        for w in weights:
            w = w[:: -(-w.shape[0] // PICK_ROWS)]  # evenly spaced rows: an estimate is enough
            ws = w * s
            blocks = _blocks(ws, block_size)
            scale, zp, codes = _minmax_zero_point(blocks, 15)
            back = ((codes - zp[..., None]) * scale[..., None]).reshape(w.shape[0], -1)
            d = back[:, : w.shape[1]] / s - w
            err += float((d * d * h).sum())
        if best is None or err < best[1]:
            best = (alpha, err, s)
    assert best is not None
    return best[0], best[2]


def _group(cal: Calibration, layer: nn.Module, prefix: str, paths: list[str], stats: dict,
           block_size: int, norm: str | None = None,
           rows: tuple[str, int] | None = None) -> None:
    """One group of projections reading one input: importance for each, and (when the scale
    can be folded: into ``norm``'s weight/bias, or into ``rows`` = (projection, first row) whose
    output is the input) scaled columns."""
    h = _finite(stats[paths[0]].float())
    alpha, s = (0.0, torch.ones_like(h))
    if norm is not None or rows is not None:
        alpha, s = _pick([layer.get_submodule(p).weight.float() for p in paths], h, block_size)
    _apply(cal, prefix, paths, h, s, alpha)
    if alpha == 0.0:
        return
    if norm is not None:
        inv = 1 / s
        cal.fold(f"{prefix}{norm}.weight", lambda t, inv=inv: t * inv)
        if hasattr(layer.get_submodule(norm), "bias"):
            cal.fold(f"{prefix}{norm}.bias", lambda t, inv=inv: t * inv)
    if rows is not None:
        _fold_rows(cal, layer, prefix, rows[0], rows[1], 1 / s)


def _group_o(cal: Calibration, cfg: ModelConfig, layer: nn.Module, prefix: str, stats: dict,
             block_size: int) -> None:
    """o_proj: its input is attention's weighted sum of v, so a scale folds into v's rows; the
    query heads sharing one KV head share its scale."""
    attn = layer.self_attn
    h = _finite(stats["self_attn.o_proj"].float())
    spec = attn.spec
    if spec.value_norm or spec.key_is_value or isinstance(attn, SharedKVAttention):
        # Gemma 4: the values are RMS-normed (and may be the keys, or another layer's): a
        # scale on v's rows would not pass through, so o_proj keeps its importance alone
        _apply(cal, prefix, ["self_attn.o_proj"], h, torch.ones_like(h), 0.0)
        return
    heads, kv, d = spec.heads, spec.kv_heads, spec.head_dim
    per_kv = h.reshape(kv, heads // kv, d).mean(1)  # (kv, d)
    shared = per_kv[:, None, :].expand(kv, heads // kv, d).reshape(-1)
    alpha, s = _pick([attn.o_proj.weight.float()], h, block_size, shared=shared)
    _apply(cal, prefix, ["self_attn.o_proj"], h, s, alpha)
    if alpha == 0.0:
        return
    inv_v = 1 / s.reshape(kv, heads // kv, d)[:, 0, :].reshape(-1)
    if spec.packed_qkv:
        _fold_rows(cal, layer, prefix, "self_attn.qkv_proj", spec.q_width + spec.kv_width, inv_v)
    else:
        _fold_rows(cal, layer, prefix, "self_attn.v_proj", 0, inv_v)


def _group_shared(cal: Calibration, layer: nn.Module, prefix: str, path: str, norm: str,
                  stats: dict, block_size: int, heads: int) -> None:
    """A projection whose input ``norm``'s weight scales per channel of a head, the same for
    every head (Qwen3.5's out_proj after the gated norm): one scale per head channel, folded
    into that weight."""
    h = _finite(stats[path].float())
    per = h.reshape(heads, -1).mean(0)  # (channels of a head,)
    shared = per[None, :].expand(heads, -1).reshape(-1)
    alpha, s = _pick([layer.get_submodule(path).weight.float()], h, block_size, shared=shared)
    _apply(cal, prefix, [path], h, s, alpha)
    if alpha:
        inv = 1 / s[:per.shape[0]]
        cal.fold(f"{prefix}{norm}.weight", lambda t, inv=inv: t * inv)


def _apply(cal: Calibration, prefix: str, paths: list[str], h: Tensor, s: Tensor,
           alpha: float) -> None:
    for p in paths:
        cal.importance[f"{prefix}{p}"] = h / (s * s)
        if alpha:
            cal.fold(f"{prefix}{p}.weight", lambda t, s=s: t * s)


def _fold_rows(cal: Calibration, layer: nn.Module, prefix: str, path: str, first: int,
               inv: Tensor) -> None:
    """Rows first..first+len(inv) of ``path`` (and its bias) times ``inv``."""
    def rows(t: Tensor, inv=inv, first=first) -> Tensor:
        t = t.clone()
        t[first:first + inv.shape[0]] *= inv.reshape(-1, *([1] * (t.dim() - 1)))
        return t

    cal.fold(f"{prefix}{path}.weight", rows)
    if layer.get_submodule(path).bias is not None:
        cal.fold(f"{prefix}{path}.bias", rows)


def read_text(path: Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ExportError(f"{path}: cannot read the calibration text ({e}).") from e


__all__ = ["ALPHAS", "CALIBRATION_TEXT", "KV_MAX_TOKENS", "MAX_TOKENS", "Calibration",
           "calibrate", "calibration_ids", "read_text"]


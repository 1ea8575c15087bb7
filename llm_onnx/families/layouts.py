"""What family modules use to describe checkpoints whose names or layouts differ from Llama's:
a canonical tensor read from a checkpoint tensor (``Part``, with an optional re-layout), GGUF
name tables, and the re-layouts GPT-2, BLOOM and Falcon need. Pure Python: a re-layout is
called with a torch tensor but imports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

# (checkpoint tensor, config) -> canonical tensor; also applied to meta tensors for shapes
Relayout = Callable[[Any, Any], Any]
Shape = tuple[int, ...]


@dataclass(frozen=True)
class Part:
    """A canonical tensor = ``relayout(checkpoint tensor source)``.

    ``fused_shape``: the part is cut from a tensor holding several (q, k and v; Phi-3's gate and
    up, named by ``fused``); the reader checks the whole tensor's shape first
    (``fused_shape(cfg, is_bias)``) so a wrong size is reported as such.
    """

    source: str
    relayout: Relayout | None = None
    fused_shape: Callable[[Any, bool], Shape] | None = None
    fused: str = "q, k and v"


@dataclass(frozen=True)
class GGUFNames:
    """How llama.cpp names a family in GGUF files.

    ``layer`` maps a per-block suffix (``attn_q.weight`` of ``blk.N.attn_q.weight``) to the
    canonical suffix (``self_attn.q_proj.weight`` of ``model.layers.N....``); ``experts`` maps a
    stacked-experts tensor to the projection of each expert; ``joined`` names canonical tensors a
    file may instead hold in parts, joined on reading; ``config_fields(meta)`` reads the
    metadata into ModelConfig fields; ``unpermute_qk``: llama.cpp's converter interleaved the
    rotary halves of q and k rows (Llama), which the reader undoes; ``norm_shift``: what the
    converter added to the norm weights.
    """

    arch: str
    config_fields: Callable[[Any], dict[str, Any]]
    layer: dict[str, str]
    globals: dict[str, str]
    experts: dict[str, str] = field(default_factory=dict)
    # canonical block suffix -> (the GGUF block suffixes of its parts, the axis they join on),
    # read where the file has every part and not the canonical tensor itself (Gemma 4's experts:
    # ffn_gate_exps and ffn_up_exps, (E, I, D) each, are experts.gate_up_proj (E, 2I, D)). A
    # part's per-expert ``.scale`` (E,), which llama.cpp multiplies into that part's output, is
    # folded into its rows.
    joined: dict[str, tuple[tuple[str, ...], int]] = field(default_factory=dict)
    unpermute_qk: bool = False
    # added by llama.cpp's converter to every ``*norm.weight`` (Gemma 3 stores 1 + w), taken off
    # again on reading so the family's own checkpoint layout applies as to safetensors
    norm_shift: float = 0.0
    norm_shift_skip: tuple[str, ...] = ()  # block suffixes of norms the converter left alone
    # (GGUF tensor name, tensor, config) -> the tensor as the family's checkpoints hold it: what a
    # converter did to a tensor beyond renaming (Qwen3.5: value heads re-ordered, -exp(A_log))
    relayout: Callable[[str, Any, Any], Any] | None = None


QKV = ("q_proj", "k_proj", "v_proj")


def qkv_widths(cfg: Any) -> tuple[int, int]:
    return cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim


def fused_qkv_shape(transposed: bool) -> Callable[[Any, bool], Shape]:
    """The shape of a fused q/k/v tensor: (rows,) for a bias, (rows, hidden) for a weight
    ((hidden, rows) where the checkpoint stores (in, out), as GPT-2's Conv1D)."""

    def shape(cfg: Any, is_bias: bool) -> Shape:
        q, kv = qkv_widths(cfg)
        rows = q + 2 * kv
        if is_bias:
            return (rows,)
        return (cfg.hidden_size, rows) if transposed else (rows, cfg.hidden_size)

    return shape


def transpose(t: Any, cfg: Any) -> Any:
    """GPT-2's Conv1D stores a weight as (in, out)."""
    return t.t()


def concat_part(which: int, transposed: bool) -> Relayout:
    """q, k or v of a fused tensor whose rows are [q | k | v] (GPT-2's c_attn after the
    transpose; Falcon's multi-query query_key_value)."""

    def relayout(t: Any, cfg: Any) -> Any:
        t = t.t() if transposed and t.dim() == 2 else t
        q, kv = qkv_widths(cfg)
        return t.split([q, kv, kv], dim=0)[which]

    return relayout


def fused_gate_up_shape(cfg: Any, is_bias: bool) -> Shape:
    """The shape of a fused gate/up tensor: rows [gate | up], each intermediate_size wide."""
    rows = 2 * cfg.intermediate_size
    return (rows,) if is_bias else (rows, cfg.hidden_size)


def halves_part(which: int) -> Relayout:
    """gate (0) or up (1) of a fused tensor whose rows are [gate | up] (Phi-3's gate_up_proj)."""

    def relayout(t: Any, cfg: Any) -> Any:
        return t.split([cfg.intermediate_size, cfg.intermediate_size], dim=0)[which]

    return relayout


def per_head_part(which: int) -> Relayout:
    """q, k or v of a fused tensor whose rows are (heads, 3, head_dim) (BLOOM; Falcon without
    multi-query)."""

    def relayout(t: Any, cfg: Any) -> Any:
        h, d = cfg.num_attention_heads, cfg.head_dim
        return t.reshape(h, 3, d, *t.shape[1:])[:, which].reshape(h * d, *t.shape[1:])

    return relayout


def fairseq_layer(source: str, target: str) -> dict[str, Part]:
    """The layer tensors of fairseq-born decoders (OPT, XGLM) under the canonical names:
    ``out_proj``, ``fc1``/``fc2``, ``self_attn_layer_norm`` (before attention; OPT-350m's comes
    after it) and ``final_layer_norm`` (the layer's second norm), each weight and bias."""
    names = {"self_attn.q_proj": "self_attn.q_proj", "self_attn.k_proj": "self_attn.k_proj",
             "self_attn.v_proj": "self_attn.v_proj", "self_attn.o_proj": "self_attn.out_proj",
             "mlp.up_proj": "fc1", "mlp.down_proj": "fc2",
             "input_layernorm": "self_attn_layer_norm",
             "post_attention_layernorm": "final_layer_norm"}
    return {f"{target}.{ours}.{kind}": Part(f"{source}.{theirs}.{kind}")
            for ours, theirs in names.items() for kind in ("weight", "bias")}

"""Checkpoints of GPT-2, BLOOM and Falcon under the decoder's canonical names and layouts.

The decoder and ``shapes.py`` speak Llama's names (``model.layers.N.self_attn.q_proj.weight``, an
(out, in) weight per projection). These families name and lay out the same tensors differently:

  GPT-2   transformer.h.N.attn.c_attn   Conv1D: weight (in, out); q, k, v fused as [q | k | v]
  BLOOM   transformer.h.N.self_attention.query_key_value   rows per head: [q_h, k_h, v_h] for each h
  Falcon  transformer.h.N.self_attention.query_key_value   multi-query: [all q heads, k, v];
                                                           otherwise per head, as BLOOM

``FamilySource`` wraps a checkpoint's TensorSource and presents it under the canonical names, one
tensor at a time (a fused tensor is read once per part). Tensors it does not know pass through
under their own names, so the canonical check still reports them, naming the file and tensor.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from llm_onnx.model.config import ModelConfig
from llm_onnx.model.shapes import Shape
from llm_onnx.checkpoints.sources import TensorSource
from llm_onnx.errors import CheckpointError

# A re-layout: (checkpoint tensor, config) -> canonical tensor, and the same on shapes.
Relayout = Callable[[torch.Tensor, ModelConfig], torch.Tensor]


@dataclass(frozen=True)
class _Part:
    """Canonical tensor = relayout(checkpoint tensor ``source``)."""

    source: str
    relayout: Relayout | None = None  # None: the tensor as it is
    fused: bool = False  # one of q, k, v cut from a fused tensor (whose shape is checked first)


def _transpose(t: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    return t.t()  # GPT-2's Conv1D stores (in, out)


def _qkv_widths(cfg: ModelConfig) -> tuple[int, int]:
    return cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim


def _fused_rows(cfg: ModelConfig) -> int:
    q, kv = _qkv_widths(cfg)
    return q + 2 * kv


def _concat_part(which: int, transposed: bool) -> Relayout:
    """GPT-2 c_attn, Falcon multi-query: rows [q | k | v] (after the transpose for GPT-2)."""

    def relayout(t: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
        t = t.t() if transposed and t.dim() == 2 else t
        q, kv = _qkv_widths(cfg)
        return t.split([q, kv, kv], dim=0)[which]

    return relayout


def _per_head_part(which: int) -> Relayout:
    """BLOOM, Falcon without multi-query: rows (H, 3, D) -> q, k or v (H*D, ...)."""

    def relayout(t: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
        h, d = cfg.num_attention_heads, cfg.head_dim
        return t.reshape(h, 3, d, *t.shape[1:])[:, which].reshape(h * d, *t.shape[1:])

    return relayout


_QKV = ("q_proj", "k_proj", "v_proj")


def _gpt2_layer(cfg: ModelConfig, i: int) -> dict[str, _Part]:
    h, p = f"h.{i}", f"model.layers.{i}"
    out = {}
    for kind in ("weight", "bias"):
        for which, proj in enumerate(_QKV):
            out[f"{p}.self_attn.{proj}.{kind}"] = _Part(
                f"{h}.attn.c_attn.{kind}", _concat_part(which, transposed=True), fused=True)
        t = _transpose if kind == "weight" else None
        out[f"{p}.self_attn.o_proj.{kind}"] = _Part(f"{h}.attn.c_proj.{kind}", t)
        out[f"{p}.mlp.up_proj.{kind}"] = _Part(f"{h}.mlp.c_fc.{kind}", t)
        out[f"{p}.mlp.down_proj.{kind}"] = _Part(f"{h}.mlp.c_proj.{kind}", t)
        out[f"{p}.input_layernorm.{kind}"] = _Part(f"{h}.ln_1.{kind}")
        out[f"{p}.post_attention_layernorm.{kind}"] = _Part(f"{h}.ln_2.{kind}")
    return out


def _bloom_falcon_layer(cfg: ModelConfig, i: int) -> dict[str, _Part]:
    h, p = f"h.{i}", f"model.layers.{i}"
    per_head = cfg.architecture == "BloomForCausalLM" or cfg.num_key_value_heads > 1
    out = {}
    for kind in ("weight", "bias"):
        for which, proj in enumerate(_QKV):
            relayout = _per_head_part(which) if per_head else _concat_part(which, transposed=False)
            out[f"{p}.self_attn.{proj}.{kind}"] = _Part(
                f"{h}.self_attention.query_key_value.{kind}", relayout, fused=True)
        out[f"{p}.self_attn.o_proj.{kind}"] = _Part(f"{h}.self_attention.dense.{kind}")
        out[f"{p}.mlp.up_proj.{kind}"] = _Part(f"{h}.mlp.dense_h_to_4h.{kind}")
        out[f"{p}.mlp.down_proj.{kind}"] = _Part(f"{h}.mlp.dense_4h_to_h.{kind}")
        out[f"{p}.input_layernorm.{kind}"] = _Part(f"{h}.input_layernorm.{kind}")
        out[f"{p}.post_attention_layernorm.{kind}"] = _Part(f"{h}.post_attention_layernorm.{kind}")
    return out


# Per family: checkpoint names of the global tensors, the per-layer table, and tensors to skip
# (GPT-2 checkpoints may hold the causal-mask buffers attn.bias / attn.masked_bias).
_GLOBAL = {
    "GPT2LMHeadModel": {"model.embed_tokens.weight": "wte.weight",
                        "model.embed_positions.weight": "wpe.weight",
                        "model.norm.weight": "ln_f.weight", "model.norm.bias": "ln_f.bias"},
    "BloomForCausalLM": {"model.embed_tokens.weight": "word_embeddings.weight",
                         "model.embed_layernorm.weight": "word_embeddings_layernorm.weight",
                         "model.embed_layernorm.bias": "word_embeddings_layernorm.bias",
                         "model.norm.weight": "ln_f.weight", "model.norm.bias": "ln_f.bias"},
    "FalconForCausalLM": {"model.embed_tokens.weight": "word_embeddings.weight",
                          "model.norm.weight": "ln_f.weight", "model.norm.bias": "ln_f.bias"},
}
_LAYER = {"GPT2LMHeadModel": _gpt2_layer, "BloomForCausalLM": _bloom_falcon_layer,
          "FalconForCausalLM": _bloom_falcon_layer}
_SKIP = re.compile(r"^(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)$")


class FamilySource:
    """A GPT-2, BLOOM or Falcon checkpoint presented under the canonical names and layouts."""

    def __init__(self, inner: TensorSource, cfg: ModelConfig) -> None:
        self.inner, self.cfg = inner, cfg
        present = set(inner.names())
        # Checkpoints saved from the bare model (GPT-2's and BLOOM's own files) have no prefix;
        # those saved from the *ForCausalLM class have "transformer.".
        prefix = "transformer." if any(n.startswith("transformer.") for n in present) else ""
        table = {name: _Part(src) for name, src in _GLOBAL[cfg.architecture].items()}
        for i in range(cfg.num_hidden_layers):
            table.update(_LAYER[cfg.architecture](cfg, i))
        table = {name: _Part(prefix + part.source, part.relayout, part.fused)
                 for name, part in table.items()}
        self._checkpoint_names = {name: part.source for name, part in table.items()}
        self._parts = {name: part for name, part in table.items() if part.source in present}
        if "lm_head.weight" in present:
            self._parts["lm_head.weight"] = _Part("lm_head.weight")
        used = {part.source for part in self._parts.values()}
        self._passthrough = [n for n in inner.names() if n not in used and not _SKIP.match(n)]
        self._last: tuple[str, torch.Tensor] | None = None  # a fused tensor is read once per part

    def names(self) -> list[str]:
        return list(self._parts) + self._passthrough

    def checkpoint_name(self, name: str) -> str:
        """The family's own name of the tensor read as canonical ``name`` (for messages)."""
        return self._checkpoint_names.get(name, name)

    def shape(self, name: str) -> Shape:
        part = self._parts.get(name)
        if part is None:
            return self.inner.shape(name)
        got = tuple(self.inner.shape(part.source))
        if part.fused:
            self._check_fused(part.source, got)
        if part.relayout is None:
            return got
        return tuple(part.relayout(torch.empty(got, device="meta"), self.cfg).shape)

    def _check_fused(self, source: str, got: Shape) -> None:
        rows, d = _fused_rows(self.cfg), self.cfg.hidden_size
        if source.endswith(".bias"):
            want: Shape = (rows,)
        else:
            want = (d, rows) if self.cfg.architecture == "GPT2LMHeadModel" else (rows, d)
        if got != want:
            raise CheckpointError(f"{self.inner.describe(source)}: tensor {source} (q, k and v "
                                  f"fused) has shape {list(got)}, expected {list(want)} for "
                                  "this config.")

    def get(self, name: str) -> torch.Tensor:
        part = self._parts.get(name)
        if part is None:
            return self.inner.get(name)
        if part.fused and self._last is not None and self._last[0] == part.source:
            t = self._last[1]
        else:
            t = self.inner.get(part.source)
            self._last = (part.source, t) if part.fused else None
        return t if part.relayout is None else part.relayout(t, self.cfg).contiguous()

    def describe(self, name: str) -> str:
        part = self._parts.get(name)
        if part is None:
            return self.inner.describe(name)
        return f"{self.inner.describe(part.source)} (tensor {part.source})"


def family_source(source: TensorSource, cfg: ModelConfig) -> TensorSource:
    """``source`` under canonical names: wrapped for GPT-2, BLOOM and Falcon, as it is otherwise
    (Llama, Mistral and Qwen3 checkpoints already use them)."""
    return FamilySource(source, cfg) if cfg.architecture in _GLOBAL else source

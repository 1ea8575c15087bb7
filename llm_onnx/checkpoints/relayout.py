"""Checkpoints whose tensor names or layouts are not the decoder's, read as if they were.

The decoder and ``shapes.py`` speak Llama's names (``model.layers.N.self_attn.q_proj.weight``, an
(out, in) weight per projection). A family that names or lays out the same tensors differently
(GPT-2, BLOOM, Falcon) declares its table in its module (``CHECKPOINT_GLOBALS``,
``checkpoint_layer``; see llm_onnx/families/layouts.py for the re-layouts). ``FamilySource`` wraps
a checkpoint's TensorSource and presents it under the canonical names, one tensor at a time (a
fused tensor is read once for its three parts). Tensors it does not know pass through under their
own names, so the canonical check still reports them, naming the file and tensor.
"""

from __future__ import annotations

import re
from dataclasses import replace

import torch

from llm_onnx.checkpoints.sources import TensorSource
from llm_onnx.errors import CheckpointError
from llm_onnx.families import Family, Part, family
from llm_onnx.modeling.config import ModelConfig
from llm_onnx.modeling.shapes import Shape


class FamilySource:
    """A checkpoint presented under the canonical names and layouts of ``fam``."""

    def __init__(self, inner: TensorSource, cfg: ModelConfig, fam: Family) -> None:
        assert fam.checkpoint_globals is not None and fam.checkpoint_layer is not None
        self.inner, self.cfg = inner, cfg
        present = set(inner.names())
        # Checkpoints saved from the bare model (GPT-2's and BLOOM's own files) have no prefix;
        # those saved from the *ForCausalLM class have "transformer.".
        prefix = "transformer." if any(n.startswith("transformer.") for n in present) else ""
        table = {name: Part(src) if isinstance(src, str) else src
                 for name, src in fam.checkpoint_globals.items()}
        for i in range(cfg.num_hidden_layers):
            table.update(fam.checkpoint_layer(cfg, i))
        table = {name: replace(part, source=prefix + part.source) for name, part in table.items()}
        if fam.checkpoint_nested is not None:  # Qwen3.5: the text model under model.language_model.
            short, nested = fam.checkpoint_nested
            if any(n.startswith(nested) for n in present):
                table = {name: replace(part, source=nested + part.source[len(short):])
                         if part.source.startswith(short) else part
                         for name, part in table.items()}
                # a tensor stored as itself, nested (Qwen3.5-MoE's experts one by one, as
                # transformers saves the multimodal class), where the table reads a fused one
                for name, part in list(table.items()):
                    own = nested + name[len(short):]
                    if part.source not in present and name.startswith(short) and own in present:
                        table[name] = Part(own)
        self._checkpoint_names = {name: part.source for name, part in table.items()}
        self._parts = {name: part for name, part in table.items() if part.source in present}
        if "lm_head.weight" in present:
            self._parts["lm_head.weight"] = Part("lm_head.weight")
        used = {part.source for part in self._parts.values()}
        skip = re.compile(fam.checkpoint_skip) if fam.checkpoint_skip else None
        self._passthrough = [n for n in inner.names()
                             if n not in used and not (skip and skip.match(n))]
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
        if part.fused_shape is not None:
            want = part.fused_shape(self.cfg, part.source.endswith(".bias"))
            if got != want:
                raise CheckpointError(f"{self.inner.describe(part.source)}: tensor {part.source} "
                                      f"({part.fused} fused) has shape {list(got)}, expected "
                                      f"{list(want)} for this config.")
        if part.relayout is None:
            return got
        return tuple(part.relayout(torch.empty(got, device="meta"), self.cfg).shape)

    def get(self, name: str) -> torch.Tensor:
        part = self._parts.get(name)
        if part is None:
            return self.inner.get(name)
        fused = part.fused_shape is not None
        if fused and self._last is not None and self._last[0] == part.source:
            t = self._last[1]
        else:
            t = self.inner.get(part.source)
            self._last = (part.source, t) if fused else None
        return t if part.relayout is None else part.relayout(t, self.cfg).contiguous()

    def describe(self, name: str) -> str:
        part = self._parts.get(name)
        if part is None:
            return self.inner.describe(name)
        return f"{self.inner.describe(part.source)} (tensor {part.source})"


class BareModelSource:
    """A Llama-like checkpoint saved from the bare model class (``Qwen3Model``, ``LlamaModel``:
    embedding models such as Qwen3-Embedding), whose tensors lack the ``model.`` prefix and the
    LM head: presented under the canonical names."""

    PREFIX = "model."

    def __init__(self, inner: TensorSource) -> None:
        self.inner = inner

    def names(self) -> list[str]:
        return [self.PREFIX + n for n in self.inner.names()]

    def _own(self, name: str) -> str:
        return name[len(self.PREFIX):] if name.startswith(self.PREFIX) else name

    def checkpoint_name(self, name: str) -> str:
        return self._own(name)

    def shape(self, name: str) -> Shape:
        return self.inner.shape(self._own(name))

    def get(self, name: str) -> torch.Tensor:
        return self.inner.get(self._own(name))

    def describe(self, name: str) -> str:
        return f"{self.inner.describe(self._own(name))} (tensor {self._own(name)})"


def is_bare_model(source: TensorSource) -> bool:
    """Whether a checkpoint holds the bare model's tensors (``embed_tokens.weight``, ``layers.*``,
    ``norm.weight``) rather than a causal LM's (``model.*`` and ``lm_head.weight``)."""
    names = set(source.names())
    return "embed_tokens.weight" in names and "model.embed_tokens.weight" not in names


def family_source(source: TensorSource, cfg: ModelConfig) -> TensorSource:
    """``source`` under canonical names: wrapped where the family renames tensors or the
    checkpoint holds the bare model, as it is otherwise (Llama-like checkpoints already use
    them)."""
    from llm_onnx.checkpoints.mxfp4 import MXFP4Source, has_mxfp4

    fam = family(cfg.architecture)
    if has_mxfp4(source):  # gpt-oss: experts as MXFP4 codes and scales, read as float
        source = MXFP4Source(source)
    if fam.renames:
        return FamilySource(source, cfg, fam)
    return BareModelSource(source) if is_bare_model(source) else source

"""The vision tower's tensors in a checkpoint: checked against its config, read into the torch
tower by name, one tensor at a time. Each kind of tower (``TOWERS``): its tensors' names and
shapes (the family helper's), where the checkpoint keeps them, its torch root:

    qwen_vl  model.visual.*                                      modeling/vision_tower.py
    gemma3   model.vision_tower.*, model.multi_modal_projector.*  modeling/gemma3_vision.py
    gemma4   model.vision_tower.*, model.embed_vision.*          modeling/gemma4_vision.py

The tensors keep transformers' names (its modules'), which are also the parameter names under
the export's root; ``TowerSource`` reads them where a checkpoint keeps them under other
prefixes (Gemma 3's files: ``vision_tower.*``, ``multi_modal_projector.*``). The changes of
layout (``RELAYOUTS``): a patch embedding that is a
convolution in the checkpoint and a linear map here (Qwen's Conv3d, SigLIP's Conv2d), and
Gemma 3's projector norm, stored as 1 + w (Gemma's RMSNorm multiplies by 1 + w)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from llm_onnx.checkpoints.sources import TensorSource, check_shapes
from llm_onnx.errors import CheckpointError
from llm_onnx.families import gemma_vision
from llm_onnx.families.qwen_vision import PREFIX, vision_shapes
from llm_onnx.modeling.gemma3_vision import Gemma3VisionEncoder
from llm_onnx.modeling.gemma4_vision import Gemma4VisionEncoder
from llm_onnx.modeling.gemma_vision_config import AnyVisionConfig
from llm_onnx.modeling.vision_tower import VisionEncoder

PATCH_WEIGHT = f"{PREFIX}patch_embed.proj.weight"
Producer = Callable[[TensorSource], torch.Tensor]  # as checkpoints.load's

# kind -> (its tensors' shapes, {its prefix: the prefixes checkpoints keep it under}, its root)
Layouts = dict[str, tuple[str, ...]]
TOWERS: dict[str, tuple[Callable[[Any], dict[str, tuple[int, ...]]], Layouts, type]] = {
    "qwen_vl": (vision_shapes, {PREFIX: (PREFIX,)}, VisionEncoder),
    "gemma3": (gemma_vision.gemma3_vision_shapes, gemma_vision.GEMMA3_LAYOUTS,
               Gemma3VisionEncoder),
    "gemma4": (gemma_vision.gemma4_vision_shapes, gemma_vision.GEMMA4_LAYOUTS,
               Gemma4VisionEncoder),
}
RELAYOUTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    PATCH_WEIGHT: lambda t: t.flatten(1),  # Conv3d (out, C, T, P, P) -> (out, C*T*P*P)
    # Conv2d (out, C, P, P) -> (out, C*P*P), the channel-major patches of gemma3_vision.py
    f"{gemma_vision.GEMMA3_PREFIXES[0]}embeddings.patch_embedding.weight":
        lambda t: t.flatten(1),
    f"{gemma_vision.GEMMA3_PREFIXES[1]}mm_soft_emb_norm.weight": lambda t: t.float() + 1.0,
}


class TowerSource:
    """A checkpoint with its tower's tensors under the tower's own prefixes (each name read
    under the first of its layouts' prefixes the checkpoint uses); other tensors as they are."""

    def __init__(self, inner: TensorSource, layouts: Layouts) -> None:
        self.inner = inner
        self._own: dict[str, str] = {}  # our name -> the checkpoint's
        for name in inner.names():
            ours = name
            for prefix, places in layouts.items():
                place = next((p for p in places if name.startswith(p)), None)
                if place is not None:
                    ours = prefix + name[len(place):]
                    break
            self._own[ours] = name

    def names(self) -> list[str]:
        return list(self._own)

    def shape(self, name: str):
        return self.inner.shape(self._own.get(name, name))

    def get(self, name: str) -> torch.Tensor:
        return self.inner.get(self._own.get(name, name))

    def describe(self, name: str) -> str:
        return self.inner.describe(self._own.get(name, name))


def vision_source(vision: AnyVisionConfig, source: TensorSource) -> TensorSource:
    """``source`` (a checkpoint's own names) with the tower of ``vision`` under its names."""
    return TowerSource(source, TOWERS[vision.kind][1])


def check_vision_tensors(vision: AnyVisionConfig, source: TensorSource, where: str) -> None:
    """Every tensor of the tower present with its shape, and no other under its prefixes
    (``source``: a ``vision_source``)."""
    shapes, layouts, _ = TOWERS[vision.kind]
    expected = shapes(vision)
    present = {n for n in source.names() if n.startswith(tuple(layouts))}
    missing = [n for n in expected if n not in present]
    if missing:
        raise CheckpointError(
            f"{where}: checkpoint lacks {len(missing)} vision tensor(s) its config.json "
            f"describes (e.g. {missing[0]} of shape {list(expected[missing[0]])}); export it "
            "with --text-only to leave the vision tower out.")
    extra = sorted(present - set(expected))
    if extra:
        raise CheckpointError(
            f"{where}: checkpoint has {len(extra)} vision tensor(s) its vision_config does not "
            f"describe (e.g. {extra[0]}); is config.json for this checkpoint?")
    check_shapes(source, expected)


def vision_producers(model: nn.Module) -> Iterator[tuple[str, Producer]]:
    """For each parameter of a vision root, how to read it from the checkpoint."""
    for name, _ in model.named_parameters():
        relayout = RELAYOUTS.get(name)
        if relayout is not None:
            yield name, (lambda src, n=name, f=relayout: f(src.get(n)))
        else:
            yield name, (lambda src, n=name: src.get(n))


def build_vision(vision: AnyVisionConfig, source: TensorSource | None = None, *,
                 dtype: torch.dtype = torch.float32) -> nn.Module:
    """The tower of ``vision`` (its kind's root): weightless on the meta device, or filled
    from ``source``."""
    with torch.device("meta"):
        model = TOWERS[vision.kind][2](vision, dtype)
    if source is not None:
        for name, produce in vision_producers(model):
            module_name, _, attr = name.rpartition(".")
            module = model.get_submodule(module_name)
            old = getattr(module, attr)
            value = produce(source)
            if tuple(value.shape) != tuple(old.shape):
                raise CheckpointError(f"tensor for {name} has shape {list(value.shape)}, "
                                      f"expected {list(old.shape)}.")
            setattr(module, attr, nn.Parameter(value.to(old.dtype).contiguous(),
                                               requires_grad=False))
    return model.eval()


__all__ = ["TowerSource", "build_vision", "check_vision_tensors", "vision_producers",
           "vision_source"]

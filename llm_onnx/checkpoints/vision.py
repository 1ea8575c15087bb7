"""The vision tower's tensors in a checkpoint: checked against its VisionConfig, read into the
torch tower (modeling/vision_tower.py) by name, one tensor at a time.

The tower's tensors keep the checkpoint's names (``model.visual.*``, transformers'), which are
also the tower's parameter names under the export's root (``VisionEncoder``); the one change of
layout is the patch embedding, a Conv3d in the checkpoint and a linear map here."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn

from llm_onnx.checkpoints.sources import TensorSource
from llm_onnx.errors import CheckpointError
from llm_onnx.families.qwen_vision import PREFIX, vision_shapes
from llm_onnx.modeling.vision_config import VisionConfig
from llm_onnx.modeling.vision_tower import VisionEncoder

PATCH_WEIGHT = f"{PREFIX}patch_embed.proj.weight"
Producer = Callable[[TensorSource], torch.Tensor]  # as checkpoints.load's


def check_vision_tensors(vision: VisionConfig, source: TensorSource, where: str) -> None:
    """Every tensor of the tower present with its shape, and no other ``model.visual.*``."""
    expected = vision_shapes(vision)
    present = {n for n in source.names() if n.startswith(PREFIX)}
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
    for name, shape in expected.items():
        got = tuple(source.shape(name))
        if got != tuple(shape):
            raise CheckpointError(f"{source.describe(name)}: tensor {name} has shape "
                                  f"{list(got)}, expected {list(shape)} for this config.")


def vision_producers(model: nn.Module) -> Iterator[tuple[str, Producer]]:
    """For each parameter of a VisionEncoder, how to read it from the checkpoint."""
    for name, _ in model.named_parameters():
        if name == PATCH_WEIGHT:  # Conv3d (out, C, T, P, P) -> (out, C*T*P*P)
            yield name, (lambda src, n=name: src.get(n).flatten(1))
        else:
            yield name, (lambda src, n=name: src.get(n))


def build_vision(vision: VisionConfig, source: TensorSource | None = None, *,
                 dtype: torch.dtype = torch.float32) -> VisionEncoder:
    """The tower of ``vision``: weightless on the meta device, or filled from ``source``."""
    with torch.device("meta"):
        model = VisionEncoder(vision, dtype)
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


__all__ = ["build_vision", "check_vision_tensors", "vision_producers"]

"""The twin of every parity test: the same comparison against a reference with one weight
perturbed must fail, which proves the comparison can fail at all (a test that compares two
things that are always equal, or a tolerance wider than any bug, passes its twin too).

    with perturbed(hf_model) as moved:              # restored on exit
        assert diff(ours, moved) > TOLERANCE         # the twin
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Iterator

import torch

# Layer 1 (not 0): a bug confined to the later layers must move the logits too.
LAYER = ".1."


# The attention output projection of a layer under each family's transformers name: it writes
# into the residual stream directly, so perturbing it moves the logits in every family.
ATTENTION_OUTPUT = re.compile(r"(o_proj|attn\.c_proj|self_attention\.dense|out_proj)\.weight$")


@contextmanager
def perturbed(model: torch.nn.Module, scale: float = 0.01, seed: int = 5,
              kind: str = "matrix", pattern: re.Pattern | None = None,
              ) -> Iterator[torch.nn.Module]:
    """``model`` (transformers' or ours) with the first float parameter of layer 1 moved by
    ``scale`` × standard-normal noise, restored when the block ends. ``kind``: ``"matrix"`` (a
    2-D projection weight, the query or key projection in most families) or ``"vector"`` (a 1-D
    norm weight, present in every export form, quantized or not); ``pattern``: the first one
    whose name matches instead (e.g. ATTENTION_OUTPUT)."""
    dims = 2 if kind == "matrix" else 1
    weight = next(p for n, p in model.named_parameters()
                  if LAYER in n and p.dim() == dims and p.is_floating_point()
                  and (pattern is None or pattern.search(n)))
    saved = weight.detach().clone()
    noise = torch.randn(weight.shape, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        weight.add_(scale * noise.to(weight.dtype))
    try:
        yield model
    finally:
        with torch.no_grad():
            weight.copy_(saved)

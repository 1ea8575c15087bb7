"""VisionConfig: the vision tower beside a decoder (Qwen3-VL, Qwen3.5, Qwen3.6), and how its
output joins the decoder. Pure Python: the manifest and the runtime read it without torch.

The tower is a second model beside the text one (``ModelConfig`` stays the decoder's): a
folder exported with one takes images, and ``--text-only`` leaves it out. Field names are
transformers' ``vision_config`` names; the last three say how the decoder takes the tower's
output:

- ``mrope_section``: the decoder's multimodal RoPE (Qwen): rotary frequency j turns by the
  token's time, height or width position, interleaved (j % 3 == 1 below 3 * sections[1]: height;
  j % 3 == 2 below 3 * sections[2]: width; else time). Text tokens have three equal positions,
  so for text alone this is ordinary RoPE.
- ``deepstack_visual_indexes``: Qwen3-VL's DeepStack: the tower's hidden states after these
  blocks, each through its own merger, are added to the decoder's hidden states at the image
  positions after its first ``len(deepstack_visual_indexes)`` layers. Empty for Qwen3.5.
- ``image_token_id``: the id the prompt holds at each image position (``<|image_pad|>``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from llm_onnx.errors import ConfigError

VISION_KINDS = ("qwen_vl",)
_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu", "gelu_new", "gelu_fast")


def positive_problems(config: Any, names: tuple[str, ...]) -> list[str]:
    """What is wrong with ``config``'s fields ``names``, each to be a positive integer."""
    problems = []
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            problems.append(f"vision.{name} must be a positive integer, got {value!r}")
    return problems


def raise_problems(problems: list[str]) -> None:
    """ConfigError naming every problem of a vision config, if there is any."""
    if problems:
        raise ConfigError("Invalid vision config: " + "; ".join(problems) + ".")


@dataclass(frozen=True, kw_only=True)
class VisionConfig:
    """The Qwen vision tower (transformers' ``Qwen3VLVisionModel``, ``Qwen3_5VisionModel``).

    Args:
        depth, hidden_size, intermediate_size, num_heads: the tower's blocks (pre-norm
            LayerNorm, full attention with 2-D RoPE over one image's patches, a GELU MLP).
        patch_size, temporal_patch_size, in_channels: a patch is (in_channels, temporal,
            patch, patch) pixels, embedded by one linear map (transformers' Conv3d).
        spatial_merge_size: each merge × merge group of neighbouring patches becomes one token
            (the merger: LayerNorm, then a GELU MLP over the group's concatenated features).
        out_hidden_size: the tokens' width (the decoder's hidden size).
        num_position_embeddings: the learned position table (a square grid), resampled
            bilinearly to each image's patch grid.
        hidden_act: the blocks' MLP activation.
        rope_theta: the base of the tower's 2-D RoPE.
        mrope_section, deepstack_visual_indexes, image_token_id: see the module docstring.
    """

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    patch_size: int = 16
    temporal_patch_size: int = 2
    in_channels: int = 3
    spatial_merge_size: int = 2
    num_position_embeddings: int = 2304
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10_000.0
    layer_norm_eps: float = 1e-6
    mrope_section: tuple[int, ...] = (24, 20, 20)  # (time, height, width)
    deepstack_visual_indexes: tuple[int, ...] = ()
    image_token_id: int = 0
    kind: str = "qwen_vl"

    def __post_init__(self) -> None:
        raise_problems(positive_problems(self, (
            "depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size",
            "patch_size", "temporal_patch_size", "in_channels", "spatial_merge_size",
            "num_position_embeddings")))
        problems = []
        if self.kind not in VISION_KINDS:
            problems.append(f"vision.kind {self.kind!r} is not one of {', '.join(VISION_KINDS)}")
        if self.hidden_size % self.num_heads:
            problems.append(f"vision.hidden_size ({self.hidden_size}) must be a multiple of "
                            f"num_heads ({self.num_heads})")
        elif self.head_dim % 4:
            problems.append(f"vision head size {self.head_dim} must be a multiple of 4 (its "
                            "2-D RoPE turns a quarter of it by each of height and width)")
        side = round(self.num_position_embeddings ** 0.5)
        if side * side != self.num_position_embeddings:
            problems.append(f"vision.num_position_embeddings ({self.num_position_embeddings}) "
                            "must be a square (a grid of positions)")
        if self.hidden_act not in _ACTIVATIONS:
            problems.append(f"vision.hidden_act {self.hidden_act!r} is not supported; "
                            f"supported: {', '.join(_ACTIVATIONS)}")
        if len(self.mrope_section) != 3 or not all(
                isinstance(s, int) and s >= 0 for s in self.mrope_section):
            problems.append(f"vision.mrope_section must be three counts, got "
                            f"{self.mrope_section!r}")
        bad = [i for i in self.deepstack_visual_indexes
               if not isinstance(i, int) or not 0 <= i < self.depth]
        if bad:
            problems.append(f"vision.deepstack_visual_indexes names block {bad[0]!r}; the "
                            f"tower has {self.depth}")
        raise_problems(problems)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_width(self) -> int:
        """Values of one patch: in_channels × temporal × patch × patch."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def merge_unit(self) -> int:
        """Patches per token."""
        return self.spatial_merge_size ** 2

    @property
    def grid_side(self) -> int:
        """Side of the learned position grid."""
        return round(self.num_position_embeddings ** 0.5)

    @property
    def deepstack_layers(self) -> int:
        """How many of the decoder's first layers take DeepStack features."""
        return len(self.deepstack_visual_indexes)

    @property
    def image_pad_token_id(self) -> int | None:
        """The id the text embeddings look up at image positions (None: the image id; its
        embedding is replaced)."""
        return None

    def bidirectional_layers(self, layer_types: tuple[str, ...]) -> tuple[int, ...]:
        """Decoder layers where an image's tokens see each other both ways (Qwen: none)."""
        return ()

    def check_decoder(self, hidden_size: int, rotary_dim: int, layers: int) -> None:
        """ConfigError where the tower's output cannot join a decoder of this shape."""
        problems = []
        if self.out_hidden_size != hidden_size:
            problems.append(f"vision.out_hidden_size ({self.out_hidden_size}) must be the "
                            f"decoder's hidden_size ({hidden_size})")
        if sum(self.mrope_section) != rotary_dim // 2:
            problems.append(f"vision.mrope_section {list(self.mrope_section)} must add up to "
                            f"half the decoder's rotary width ({rotary_dim // 2})")
        if self.deepstack_layers > layers:
            problems.append(f"DeepStack feeds {self.deepstack_layers} decoder layers; the "
                            f"decoder has {layers}")
        raise_problems(problems)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VisionConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"Unknown vision config fields: {', '.join(unknown)}.")
        data = dict(data)
        for name in ("mrope_section", "deepstack_visual_indexes"):
            if data.get(name) is not None:
                data[name] = tuple(data[name])
        return cls(**data)

    def replace(self, **changes: Any) -> VisionConfig:
        return dataclasses.replace(self, **changes)

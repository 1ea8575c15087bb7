"""The Gemma vision towers' configs, siblings of VisionConfig (vision_config.py, Qwen's): the
tower beside a decoder and how its output joins it. Pure Python: the manifest and the runtime
read them without torch.

    Gemma3VisionConfig  SigLIP at a fixed square size, then the projector: average pooling to
                        ``mm_tokens_per_image`` soft tokens, RMSNorm, a projection to the text
                        width (transformers' ``Gemma3ForConditionalGeneration``)
    Gemma4VisionConfig  Gemma 4's own tower at variable resolution (patches with their (x, y)
                        positions), 2-D RoPE, pooling by ``pooling_kernel_size``², then the
                        embedder into the text width (``Gemma4ForConditionalGeneration``)

Field names are transformers' ``vision_config`` names (Gemma 4's ``hidden_activation``
included); the last ones say how the decoder takes the tower's output. What the decoder reads
of any tower config (this module's and Qwen's alike):

- ``image_token_id``: the id the prompt holds at each image position;
- ``image_pad_token_id``: the id the text embeddings look up there instead (None: the image
  id itself). Gemma 4's per-layer embeddings read the pad id's row at image positions;
- ``mrope_section`` (empty: plain 1-D RoPE) and ``deepstack_layers`` (0): Qwen's mechanisms;
- ``bidirectional_layers(layer_types)``: the decoder layers where an image's tokens attend to
  each other both ways during prefill (Gemma 3: all; Gemma 4 with
  ``use_bidirectional_attention`` "vision": the sliding-window layers; otherwise none).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Union

from llm_onnx.errors import ConfigError
from llm_onnx.modeling.vision_config import VisionConfig, positive_problems, raise_problems

_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu")


class _Join:
    """What the decoder reads of a Gemma tower (see the module docstring)."""

    out_hidden_size: int
    image_token_id: int
    pad_token_id: int

    mrope_section: tuple[int, ...] = ()  # plain 1-D RoPE: image tokens at ordinary positions
    deepstack_layers: int = 0

    @property
    def image_pad_token_id(self) -> int | None:
        return self.pad_token_id

    def bidirectional_layers(self, layer_types: tuple[str, ...]) -> tuple[int, ...]:
        raise NotImplementedError

    def check_decoder(self, hidden_size: int, rotary_dim: int, layers: int) -> None:
        """ConfigError where the tower's output cannot join a decoder of this shape."""
        if self.out_hidden_size != hidden_size:
            raise ConfigError(f"Invalid vision config: vision.out_hidden_size "
                              f"({self.out_hidden_size}) must be the decoder's hidden_size "
                              f"({hidden_size}).")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def replace(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


@dataclass(frozen=True, kw_only=True)
class Gemma3VisionConfig(_Join):
    """SigLIP and Gemma 3's projector (transformers' ``SiglipVisionConfig`` fields, and the
    multimodal config's ``mm_tokens_per_image`` and token ids).

    Args:
        hidden_size, intermediate_size, num_hidden_layers, num_attention_heads: SigLIP's
            pre-norm LayerNorm blocks (full attention over one image's patches, a GELU MLP).
        image_size, patch_size, num_channels: the fixed square input, cut into
            (image_size / patch_size)² patches, each embedded by one linear map (the
            checkpoint's Conv2d) plus a learned position per patch.
        hidden_act, layer_norm_eps: the blocks' activation and norms' epsilon (also the
            projector's RMSNorm's).
        mm_tokens_per_image: soft tokens per image, a square: the patch grid is average-pooled
            to it.
        out_hidden_size: the text model's hidden size (the projection's output).
        image_token_id, boi_token_id, eoi_token_id: ``<image_soft_token>``,
            ``<start_of_image>``, ``<end_of_image>``.
        pad_token_id: the text model's pad id, looked up at image positions (their embeddings
            are replaced; an image id past the vocabulary must not be looked up).
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    out_hidden_size: int
    image_size: int = 224
    patch_size: int = 16
    num_channels: int = 3
    hidden_act: str = "gelu_pytorch_tanh"
    layer_norm_eps: float = 1e-6
    mm_tokens_per_image: int = 256
    image_token_id: int = 262_144
    boi_token_id: int = 255_999
    eoi_token_id: int = 256_000
    pad_token_id: int = 0
    kind: str = "gemma3"

    def __post_init__(self) -> None:
        raise_problems(positive_problems(self, ("hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "out_hidden_size", "image_size",
                                "patch_size", "num_channels", "mm_tokens_per_image")))
        problems = []
        if self.kind != "gemma3":
            problems.append(f"vision.kind must be 'gemma3', got {self.kind!r}")
        if self.hidden_size % self.num_attention_heads:
            problems.append(f"vision.hidden_size ({self.hidden_size}) must be a multiple of "
                            f"num_attention_heads ({self.num_attention_heads})")
        if self.image_size % self.patch_size:
            problems.append(f"vision.image_size ({self.image_size}) must be a multiple of "
                            f"patch_size ({self.patch_size})")
        side = round(self.mm_tokens_per_image ** 0.5)
        if side * side != self.mm_tokens_per_image:
            problems.append(f"mm_tokens_per_image ({self.mm_tokens_per_image}) must be a "
                            "square (a grid of soft tokens)")
        elif self.patches_per_side % side:
            problems.append(f"the patch grid's side ({self.patches_per_side}) must be a "
                            f"multiple of the soft-token grid's ({side})")
        if self.hidden_act not in _ACTIVATIONS:
            problems.append(f"vision.hidden_act {self.hidden_act!r} is not supported; "
                            f"supported: {', '.join(_ACTIVATIONS)}")
        raise_problems(problems)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.patches_per_side ** 2

    @property
    def patch_width(self) -> int:
        """Values of one patch: channels × patch × patch (channel-major, as the Conv2d's)."""
        return self.num_channels * self.patch_size ** 2

    @property
    def tokens_per_side(self) -> int:
        return round(self.mm_tokens_per_image ** 0.5)

    @property
    def pool_kernel(self) -> int:
        """Patches per soft token along each side (AvgPool2d's kernel and stride)."""
        return self.patches_per_side // self.tokens_per_side

    def bidirectional_layers(self, layer_types: tuple[str, ...]) -> tuple[int, ...]:
        """Gemma 3: every layer (its sliding ones within their window)."""
        return tuple(range(len(layer_types)))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Gemma3VisionConfig:
        return cls(**_known(cls, data))


@dataclass(frozen=True, kw_only=True)
class Gemma4VisionConfig(_Join):
    """Gemma 4's vision tower and embedder (transformers' ``Gemma4VisionConfig`` fields, the
    multimodal config's token ids, the text config's ``use_bidirectional_attention``).

    Args:
        hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
            num_key_value_heads, head_dim: Gemma-style blocks (four RMSNorms, q/k norms with
            weights, a weightless value norm, unscaled scores, a GeGLU MLP) with full
            attention over one image's patches.
        patch_size: a patch is patch × patch × 3 pixels in [0, 1], embedded by one linear map.
        position_embedding_size: rows of the learned position tables (one for x, one for y).
        pooling_kernel_size: each k × k block of patches becomes one soft token.
        rms_norm_eps, rope_theta, hidden_activation: the norms, the 2-D RoPE's base (x turns
            the first half of each head, y the second), the MLP's activation.
        use_clipped_linears: each projection clamps its input and output to stored bounds.
        standardize: the pooled features are shifted and scaled by stored vectors.
        out_hidden_size: the text model's hidden size (the embedder's output).
        image_token_id, boi_token_id, eoi_token_id: ``<|image|>``, ``<|image>``,
            ``<image|>``.
        pad_token_id: the text model's pad id: its token and per-layer embedding rows are
            what the decoder reads at image positions (before the image embeddings replace
            the token embeddings there).
        bidirectional: the text config's ``use_bidirectional_attention``: "vision" (an image's
            tokens see each other both ways in the sliding-window layers) or None.
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    out_hidden_size: int
    patch_size: int = 16
    position_embedding_size: int = 10 * 1024
    pooling_kernel_size: int = 3
    rms_norm_eps: float = 1e-6
    rope_theta: float = 100.0
    hidden_activation: str = "gelu_pytorch_tanh"
    use_clipped_linears: bool = False
    standardize: bool = False
    image_token_id: int = 258_880
    boi_token_id: int = 255_999
    eoi_token_id: int = 258_882
    pad_token_id: int = 0
    bidirectional: str | None = None
    kind: str = "gemma4"

    def __post_init__(self) -> None:
        raise_problems(positive_problems(self, ("hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "head_dim",
                                "out_hidden_size", "patch_size", "position_embedding_size",
                                "pooling_kernel_size")))
        problems = []
        if self.kind != "gemma4":
            problems.append(f"vision.kind must be 'gemma4', got {self.kind!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            problems.append(f"vision.num_attention_heads ({self.num_attention_heads}) must be "
                            f"a multiple of num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 4:
            problems.append(f"vision.head_dim ({self.head_dim}) must be a multiple of 4 (its "
                            "2-D RoPE rotates each half of a head by one coordinate)")
        if self.hidden_activation not in _ACTIVATIONS:
            problems.append(f"vision.hidden_activation {self.hidden_activation!r} is not "
                            f"supported; supported: {', '.join(_ACTIVATIONS)}")
        if self.bidirectional not in (None, "vision"):
            problems.append(f"use_bidirectional_attention {self.bidirectional!r} is not "
                            "supported with images; supported: \"vision\", null")
        raise_problems(problems)

    @property
    def patch_width(self) -> int:
        """Values of one patch: patch × patch × 3 (row-major pixels, channels innermost)."""
        return 3 * self.patch_size ** 2

    @property
    def pool_area(self) -> int:
        """Patches per soft token."""
        return self.pooling_kernel_size ** 2

    def bidirectional_layers(self, layer_types: tuple[str, ...]) -> tuple[int, ...]:
        """Gemma 4 ("vision"): the sliding-window layers only; its full layers stay causal."""
        if self.bidirectional != "vision":
            return ()
        return tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Gemma4VisionConfig:
        return cls(**_known(cls, data))


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"Unknown vision config fields: {', '.join(unknown)}.")
    return dict(data)


# Any tower a decoder may have beside it (Decoder(cfg, vision=...)).
AnyVisionConfig = Union[VisionConfig, Gemma3VisionConfig, Gemma4VisionConfig]
_KINDS: dict[str, Any] = {"qwen_vl": VisionConfig, "gemma3": Gemma3VisionConfig,
                          "gemma4": Gemma4VisionConfig}


def bidirectional_layers(vision: AnyVisionConfig, cfg: Any) -> tuple[int, ...]:
    """The layers of decoder ``cfg`` (a ModelConfig) where an image's tokens see each other
    both ways: they run plain attention and take ``attend_until``."""
    return vision.bidirectional_layers(tuple(
        "full_attention" if cfg.layer_window(i) is None else "sliding_attention"
        for i in range(cfg.num_hidden_layers)))


def vision_config_from_dict(data: dict[str, Any]) -> AnyVisionConfig:
    """A tower config from its ``to_dict()`` (the manifest's), by its ``kind``."""
    kind = data.get("kind", "qwen_vl")
    if kind not in _KINDS:
        raise ConfigError(f"Unknown vision kind {kind!r}; known: {', '.join(sorted(_KINDS))}.")
    return _KINDS[kind].from_dict(data)


__all__ = ["AnyVisionConfig", "bidirectional_layers", "Gemma3VisionConfig", "Gemma4VisionConfig",
           "vision_config_from_dict"]

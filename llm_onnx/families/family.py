"""What a family module declares: one ``Family`` record (``FAMILY``), and ``HFConfig``, the
config.json reader its ``config_fields`` takes. Pure Python."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from llm_onnx.errors import ConfigError
from llm_onnx.families.layouts import GGUFNames, Part
from llm_onnx.modeling.config import ModelConfig
from llm_onnx.modeling.vision_config import VisionConfig

__all__ = ["Family", "HFConfig"]


class HFConfig:
    """One checkpoint's config.json, read field by field; errors name the file and the field."""

    def __init__(self, data: dict[str, Any], source: str) -> None:
        self.data, self.source = data, source
        archs = data.get("architectures") or []
        self.architecture = archs[0] if archs else None

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def require(self, key: str) -> Any:
        if self.data.get(key) is None:
            raise ConfigError(f"{self.source}: missing field '{key}' needed by "
                              f"{self.architecture}.")
        return self.data[key]

    def text(self) -> HFConfig:
        """The text model's fields: ``text_config`` of a multimodal config, else the config."""
        nested = self.data.get("text_config")
        if nested is None:
            return self
        if not isinstance(nested, dict):
            raise ConfigError(f"{self.source}: text_config must be an object.")
        return type(self)(dict(nested, architectures=[self.architecture]),
                          f"{self.source} (text_config)")

    def layer_overrides(self) -> dict[int, dict[str, Any]]:
        """transformers' ``per_layer_config`` (written by 5.23 and later, for any family): layer
        index -> the fields that layer sets to a value of its own ({} when absent)."""
        raw = self.data.get("per_layer_config")
        if raw is None:
            return {}
        if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
            raise ConfigError(f"{self.source}: per_layer_config must map layer indices to "
                              "objects of fields.")
        try:
            return {int(k): dict(v) for k, v in raw.items()}
        except ValueError:
            raise ConfigError(f"{self.source}: per_layer_config's keys must be layer indices, "
                              f"got {sorted(raw)!r}.") from None

    def refuse(self, **unsupported: Any) -> None:
        """ConfigError if a field has a value whose variant of the architecture is not built."""
        for key, value in unsupported.items():
            if key in self.data and self.data[key] == value:
                raise ConfigError(f"{self.source}: {key}={json.dumps(value)} is not supported "
                                  f"for {self.architecture}.")


@dataclass(frozen=True, kw_only=True)
class Family:
    """One family, as its module declares it.

    Args:
        architecture: the Hugging Face class (``Qwen3ForCausalLM``), the registry key.
        summary: what the family is and how it differs from Llama (its module's docstring).
        config_fields: its config.json -> ModelConfig fields, flat (a group's fields by their
            own names: ``ModelConfig.from_fields``).
        presets: named full-size configs (equal to the vendors' config.json) and tiny test
            shapes.
        hf_config: the transformers config.json of a ModelConfig (the tests' reference twin).
        hf_config_class: transformers' config class (LlamaConfig, ...), for the tests' twin.
        hf_repos: where the vendors publish the presets (looked up in the local HF cache only).
        checkpoint_globals: canonical name -> the checkpoint's name (or a Part, to re-lay it
            out) for the tensors outside the layers; None: Llama's names.
        checkpoint_layer: the same for layer i's tensors.
        checkpoint_skip: regex of checkpoint tensors that are not weights.
        gguf: llama.cpp's architecture name and tensor names, when GGUF files are read.
        norm_weight_offset: Gemma: norms multiply by (offset + stored weight), so the twin's
            random norm weights are drawn around 0 rather than 1.
        aliases: other Hugging Face classes whose checkpoints hold this model (a multimodal
            class whose text model is read, the bare model of an embedding checkpoint).
        checkpoint_nested: (canonical prefix, nested prefix): checkpoints that keep the text
            model's tensors under a longer prefix (``model.language_model.``) are read as well.
        per_layer_fields: the fields of transformers' ``per_layer_config`` that its
            ``config_fields`` reads itself (Gemma 4: its full layers' head size and KV heads).
            Any other field a layer overrides with a value of its own is refused, naming it;
            one equal to the model's is the same model.
        vision_config: the vision tower beside the text model, from config.json (None where
            the checkpoint has none: a text-only class); families without one leave it None.
            The tower's tensors keep their checkpoint names (qwen_vision.py).
    """

    architecture: str
    summary: str
    config_fields: Callable[[HFConfig], dict[str, Any]]
    presets: dict[str, ModelConfig]
    hf_config: Callable[[ModelConfig], dict[str, Any]]
    hf_config_class: str
    hf_repos: dict[str, str] = field(default_factory=dict)
    checkpoint_globals: dict[str, str | Part] | None = None
    checkpoint_layer: Callable[[ModelConfig, int], dict[str, Part]] | None = None
    checkpoint_skip: str | None = None
    gguf: GGUFNames | None = None
    norm_weight_offset: float = 0.0
    aliases: tuple[str, ...] = ()
    checkpoint_nested: tuple[str, str] | None = None
    per_layer_fields: tuple[str, ...] = ()
    vision_config: Callable[[HFConfig], VisionConfig | None] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "summary", (self.summary or "").strip())
        wrong = sorted(name for name, cfg in self.presets.items()
                       if cfg.architecture != self.architecture)
        if wrong:
            raise ValueError(f"{self.architecture}: presets {', '.join(wrong)} name another "
                             "architecture")
        if (self.checkpoint_globals is None) != (self.checkpoint_layer is None):
            raise ValueError(f"{self.architecture}: checkpoint_globals and checkpoint_layer come "
                             "together (a table of its own names) or not at all (Llama's)")

    def config(self, hf: HFConfig) -> ModelConfig:
        self._check_layer_overrides(hf.text())
        fields = dict(self.config_fields(hf), architecture=self.architecture)
        try:
            return ModelConfig.from_fields(fields)
        except TypeError as e:  # a field of the wrong kind
            raise ConfigError(f"{hf.source}: {e}.") from e

    def _check_layer_overrides(self, hf: HFConfig) -> None:
        for layer, overrides in sorted(hf.layer_overrides().items()):
            for key, value in overrides.items():
                if key in self.per_layer_fields or value == hf.data.get(key):
                    continue
                raise ConfigError(
                    f"{hf.source}: per_layer_config gives layer {layer} its own {key} "
                    f"({json.dumps(value)}; the model's is {json.dumps(hf.data.get(key))}), but "
                    f"llm-onnx builds {self.architecture} with one {key} for every layer.")
    def vision(self, hf: HFConfig) -> VisionConfig | None:
        """The checkpoint's vision tower (None: the family has none, or this config lacks
        one)."""
        return self.vision_config(hf) if self.vision_config is not None else None

    @property
    def renames(self) -> bool:
        """Whether its checkpoints name or lay out tensors differently from Llama's."""
        return self.checkpoint_globals is not None

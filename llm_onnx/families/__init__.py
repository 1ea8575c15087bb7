"""Model families: one module each, and the registry everything that lists families derives from.

A family module (``llama.py``, ``qwen3.py``, ...) says what its architecture is and how it differs
from Llama, in one place:

    ARCHITECTURE   the Hugging Face class (``Qwen3ForCausalLM``), the registry key
    config_fields  its config.json -> ModelConfig fields
    PRESETS        named full-size configs (equal to the vendors' config.json) and tiny test shapes
    HF_REPOS       where the vendors publish the presets (looked up in the local HF cache only)
    checkpoint     tensor names and layouts when they are not Llama's (GPT-2, BLOOM, Falcon)
    GGUF           llama.cpp's architecture name and tensor names, when GGUF files are read
    hf_config      the transformers config.json of a ModelConfig (the tests' reference twin)
    NORM_WEIGHT_OFFSET  Gemma: norms multiply by (1 + stored weight), so the twin's random norm
                   weights are drawn around 0 rather than 1
    ALIASES        other Hugging Face classes whose checkpoints hold this model (Qwen3.5's
                   multimodal class, whose text model is read)
    CHECKPOINT_NESTED  (canonical prefix, nested prefix): checkpoints that keep the text model's
                   tensors under a longer prefix (``model.language_model.``) are read as well

    from llm_onnx import families
    families.get_config("qwen3_8b")                 # a preset, or a ConfigError naming close ones
    families.from_hf_config(json.load(f), "x.json")  # any supported architecture
    families.SUPPORTED_ARCHITECTURES, families.GGUF_ARCHITECTURES, families.PRESETS

Pure Python: presets and the CLI's help load without torch. Adding a family is adding its module
here: every module of this package that defines ARCHITECTURE is registered
(docs/adding-an-architecture.md).
"""

from __future__ import annotations

import difflib
import importlib
import json
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from llm_onnx.errors import ConfigError
from llm_onnx.families.layouts import GGUFNames, Part
from llm_onnx.modeling.config import ModelConfig

__all__ = ["Family", "GGUFNames", "HFConfig", "Part", "REGISTRY", "PRESETS", "TINY", "HF_REPOS",
           "SUPPORTED_ARCHITECTURES", "GGUF_ARCHITECTURES", "ALIASES", "family", "get_config",
           "from_hf_config", "load_hf_config", "suggest"]

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

    def refuse(self, **unsupported: Any) -> None:
        """ConfigError if a field has a value whose variant of the architecture is not built."""
        for key, value in unsupported.items():
            if key in self.data and self.data[key] == value:
                raise ConfigError(f"{self.source}: {key}={json.dumps(value)} is not supported "
                                  f"for {self.architecture}.")


@dataclass(frozen=True)
class Family:
    """What one family module declares (see the module docstring)."""

    architecture: str
    config_fields: Callable[[HFConfig], dict[str, Any]]
    presets: dict[str, ModelConfig]
    hf_config: Callable[[ModelConfig], dict[str, Any]]
    hf_config_class: str  # transformers' config class (LlamaConfig, ...), for the tests' twin
    hf_repos: dict[str, str] = field(default_factory=dict)
    # canonical name -> the checkpoint's name (or a Part, to re-lay it out); None: Llama's names
    checkpoint_globals: dict[str, str | Part] | None = None
    checkpoint_layer: Callable[[ModelConfig, int], dict[str, Part]] | None = None
    checkpoint_skip: str | None = None  # regex of checkpoint tensors that are not weights
    gguf: GGUFNames | None = None
    summary: str = ""
    norm_weight_offset: float = 0.0  # Gemma: its norms multiply by (offset + stored weight)
    aliases: tuple[str, ...] = ()  # other classes whose checkpoints hold this model
    checkpoint_nested: tuple[str, str] | None = None  # (canonical prefix, nested prefix)

    def config(self, hf: HFConfig) -> ModelConfig:
        fields = dict(self.config_fields(hf), architecture=self.architecture)
        try:
            return ModelConfig.from_fields(fields)
        except TypeError as e:  # a field of the wrong kind
            raise ConfigError(f"{hf.source}: {e}.") from e

    @property
    def renames(self) -> bool:
        """Whether its checkpoints name or lay out tensors differently from Llama's."""
        return self.checkpoint_globals is not None


def _load() -> dict[str, Family]:
    registry: dict[str, Family] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module: ModuleType = importlib.import_module(f"{__name__}.{info.name}")
        if not hasattr(module, "ARCHITECTURE"):
            continue  # a helper module (layouts)
        fam = Family(
            architecture=module.ARCHITECTURE, config_fields=module.config_fields,
            presets=module.PRESETS, hf_config=module.hf_config,
            hf_config_class=module.HF_CONFIG_CLASS, hf_repos=getattr(module, "HF_REPOS", {}),
            checkpoint_globals=getattr(module, "CHECKPOINT_GLOBALS", None),
            checkpoint_layer=getattr(module, "checkpoint_layer", None),
            checkpoint_skip=getattr(module, "CHECKPOINT_SKIP", None),
            gguf=getattr(module, "GGUF", None), summary=(module.__doc__ or "").strip(),
            norm_weight_offset=getattr(module, "NORM_WEIGHT_OFFSET", 0.0),
            aliases=tuple(getattr(module, "ALIASES", ())),
            checkpoint_nested=getattr(module, "CHECKPOINT_NESTED", None))
        registry[fam.architecture] = fam
    return registry


REGISTRY: dict[str, Family] = _load()
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(REGISTRY)
GGUF_ARCHITECTURES: dict[str, str] = {f.gguf.arch: a for a, f in REGISTRY.items() if f.gguf}
PRESETS: dict[str, ModelConfig] = {k: v for f in REGISTRY.values() for k, v in f.presets.items()}
TINY: frozenset[str] = frozenset(name for name in PRESETS if name.endswith("_tiny"))
HF_REPOS: dict[str, str] = {k: v for f in REGISTRY.values() for k, v in f.hf_repos.items()}
ALIASES: dict[str, str] = {a: f.architecture for f in REGISTRY.values() for a in f.aliases}


def family(architecture: str) -> Family:
    """The family of a Hugging Face architecture name (ConfigError if not supported)."""
    architecture = ALIASES.get(architecture, architecture)
    if architecture not in REGISTRY:
        raise ConfigError(f"architecture {architecture!r} is not supported. "
                          f"Supported: {', '.join(SUPPORTED_ARCHITECTURES)}.")
    return REGISTRY[architecture]


def suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else ""


def get_config(name: str) -> ModelConfig:
    """The preset called ``name``; ConfigError listing the known ones otherwise."""
    if name in PRESETS:
        return PRESETS[name]
    known = sorted(PRESETS)
    raise ConfigError(f"Unknown config '{name}'. Known: {', '.join(known)}.{suggest(name, known)}")


def from_hf_config(data: dict[str, Any], source: str = "config.json") -> ModelConfig:
    """Map a Hugging Face config.json dict to a ModelConfig; ConfigError naming the file and the
    field for an unsupported architecture, variant or a missing field."""
    hf = HFConfig(data, source)
    architecture = ALIASES.get(hf.architecture, hf.architecture)  # type: ignore[arg-type]
    if architecture not in REGISTRY:
        raise ConfigError(f"{source}: architecture {hf.architecture!r} is not supported. "
                          f"Supported: {', '.join(SUPPORTED_ARCHITECTURES)}.")
    return REGISTRY[architecture].config(hf)


def load_hf_config(path: Path) -> ModelConfig:
    """Read config.json (a file or the folder holding it)."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"{file}: no config.json here; a Hugging Face checkpoint folder has one.")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{file}: not valid JSON ({e}).") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: expected a JSON object.")
    return from_hf_config(data, source=str(file))

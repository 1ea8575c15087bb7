"""Model families: one module each, and the registry everything that lists families derives from.

A family module (``llama.py``, ``qwen3.py``, ...) says what its architecture is and how it differs
from Llama, in one place, and declares it in one record, ``FAMILY = Family(...)`` (family.py):
its Hugging Face class, its config.json mapping (``config_fields``, flat ModelConfig fields),
its presets, its checkpoint and GGUF tensor names where they are not Llama's, and the
transformers twin the tests compare against. Its presets read as a list of the parts the family
uses: the ModelConfig groups it sets (attention, mlp, norm, residual, positions, embedding, moe,
linear_attention; llm_onnx/modeling/subconfigs.py).

    from llm_onnx import families
    families.get_config("qwen3_8b")                 # a preset, or a ConfigError naming close ones
    families.from_hf_config(json.load(f), "x.json")  # any supported architecture
    families.SUPPORTED_ARCHITECTURES, families.GGUF_ARCHITECTURES, families.PRESETS

Pure Python: presets and the CLI's help load without torch. Adding a family is adding its module
and its line in FAMILIES (docs/adding-an-architecture.md); a record's fields are checked as any
dataclass's, so a misspelt one is an error, not a silently missing feature.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from llm_onnx.errors import ConfigError
from llm_onnx.families import (
    bloom,
    falcon,
    gemma3,
    gemma4,
    gpt2,
    gpt_oss,
    llama,
    mistral,
    opt,
    phi3,
    qwen2,
    qwen3,
    qwen3_5,
    qwen3_5_moe,
    qwen3_moe,
    qwen3_next,
    qwen3_vl,
    smollm3,
    xglm,
)
from llm_onnx.families.family import Family, HFConfig
from llm_onnx.families.layouts import GGUFNames, Part
from llm_onnx.modeling.config import ModelConfig
from llm_onnx.modeling.vision_config import VisionConfig

__all__ = ["FAMILIES", "Family", "GGUFNames", "HFConfig", "Part", "REGISTRY", "PRESETS", "TINY",
           "HF_REPOS", "SUPPORTED_ARCHITECTURES", "GGUF_ARCHITECTURES", "ALIASES", "family",
           "get_config", "from_hf_config", "load_hf_config", "load_vision_config",
           "vision_from_hf_config", "suggest"]

# Every family, explicitly: adding one is its module plus a line here.
FAMILIES: tuple[Family, ...] = (
    bloom.FAMILY, falcon.FAMILY, gemma3.FAMILY, gemma4.FAMILY, gpt2.FAMILY, gpt_oss.FAMILY,
    llama.FAMILY, mistral.FAMILY, opt.FAMILY, phi3.FAMILY, qwen2.FAMILY, qwen3.FAMILY,
    qwen3_5.FAMILY, qwen3_5_moe.FAMILY, qwen3_moe.FAMILY, qwen3_next.FAMILY, qwen3_vl.FAMILY,
    smollm3.FAMILY, xglm.FAMILY,
)


def _registry(families: tuple[Family, ...]) -> dict[str, Family]:
    registry: dict[str, Family] = {}
    for fam in families:
        if fam.architecture in registry:
            raise ValueError(f"two families declare {fam.architecture}")
        registry[fam.architecture] = fam
    return registry


REGISTRY: dict[str, Family] = _registry(FAMILIES)
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


def vision_from_hf_config(data: dict[str, Any], source: str = "config.json",
                          ) -> VisionConfig | None:
    """The vision tower a config.json describes beside its text model (None: none, or a
    family that reads none)."""
    hf = HFConfig(data, source)
    architecture = ALIASES.get(hf.architecture, hf.architecture)  # type: ignore[arg-type]
    if architecture not in REGISTRY:
        return None
    return REGISTRY[architecture].vision(hf)


def load_vision_config(path: Path) -> VisionConfig | None:
    """The vision tower of config.json (a file or the folder holding it), if any."""
    return vision_from_hf_config(*_read_config(path))


def load_hf_config(path: Path) -> ModelConfig:
    """Read config.json (a file or the folder holding it)."""
    return from_hf_config(*_read_config(path))


def _read_config(path: Path) -> tuple[dict[str, Any], str]:
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
    return data, str(file)

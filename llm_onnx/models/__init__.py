"""Named model presets. ``REGISTRY`` maps a name to its ModelConfig; ``get_config`` looks one up
by exact name and suggests the closest on a typo."""

from llm_onnx.build_model.config import ModelConfig, suggest
from llm_onnx.errors import ConfigError
from llm_onnx.models import llama, qwen3, qwen3_moe

REGISTRY: dict[str, ModelConfig] = {**llama.CONFIGS, **qwen3.CONFIGS, **qwen3_moe.CONFIGS}

# Which presets are tiny test shapes, and the full-size preset of the same family.
TINY = {name for name in REGISTRY if name.endswith("_tiny")}


def get_config(name: str) -> ModelConfig:
    """The preset called ``name``; ConfigError listing the known ones otherwise."""
    if name in REGISTRY:
        return REGISTRY[name]
    known = sorted(REGISTRY)
    raise ConfigError(f"Unknown config '{name}'. Known: {', '.join(known)}.{suggest(name, known)}")

"""Named model presets. ``REGISTRY`` maps a name to its ModelConfig; ``get_config`` looks one up
by exact name and suggests the closest on a typo."""

from llm_onnx.model.config import ModelConfig, suggest
from llm_onnx.errors import ConfigError
from llm_onnx.models import bloom, falcon, gpt2, llama, mistral, qwen3, qwen3_moe

REGISTRY: dict[str, ModelConfig] = {
    **llama.CONFIGS, **mistral.CONFIGS, **qwen3.CONFIGS, **qwen3_moe.CONFIGS, **gpt2.CONFIGS,
    **bloom.CONFIGS, **falcon.CONFIGS,
}

# Presets that are tiny test shapes.
TINY = {name for name in REGISTRY if name.endswith("_tiny")}

# Where the vendors publish each full-size preset (looked up in the local Hugging Face cache only).
HF_REPOS = {
    "qwen3_8b": "Qwen/Qwen3-8B",
    "qwen3_30b_a3b": "Qwen/Qwen3-30B-A3B",
    "smollm2_135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "llama3_8b": "meta-llama/Meta-Llama-3-8B",
    "mistral_7b": "mistralai/Mistral-7B-v0.1",
    "gpt2": "openai-community/gpt2",
    "bloom_560m": "bigscience/bloom-560m",
    "falcon_7b": "tiiuae/falcon-7b",
}


def get_config(name: str) -> ModelConfig:
    """The preset called ``name``; ConfigError listing the known ones otherwise."""
    if name in REGISTRY:
        return REGISTRY[name]
    known = sorted(REGISTRY)
    raise ConfigError(f"Unknown config '{name}'. Known: {', '.join(known)}.{suggest(name, known)}")

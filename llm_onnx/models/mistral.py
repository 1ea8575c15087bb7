"""Mistral presets. Mistral-7B-v0.1 is Llama with sliding-window attention (each query sees its
last 4096 keys). Values equal the vendor's config.json (see tests/fixtures/configs/)."""

from llm_onnx.model.config import ModelConfig

MISTRAL_7B = ModelConfig(
    architecture="MistralForCausalLM",
    vocab_size=32_000, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, intermediate_size=14_336,
    max_position_embeddings=32_768, rope_theta=10_000.0, rms_norm_eps=1e-5,
    tie_word_embeddings=False, sliding_window=4096,
)

# A window of 4 keys: prompts of a dozen tokens already slide it.
MISTRAL_TINY = MISTRAL_7B.replace(
    vocab_size=256, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, intermediate_size=96, max_position_embeddings=256,
    sliding_window=4,
)

CONFIGS = {"mistral_7b": MISTRAL_7B, "mistral_tiny": MISTRAL_TINY}

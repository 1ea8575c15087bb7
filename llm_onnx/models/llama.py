"""Llama-family presets (Llama 3, SmolLM2). Values equal the vendors' config.json
(vendored in tests/fixtures/configs/ and compared by tests/build_model/test_presets.py)."""

from llm_onnx.model.config import ModelConfig

LLAMA3_8B = ModelConfig(
    architecture="LlamaForCausalLM",
    vocab_size=128_256, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, intermediate_size=14_336, rope_theta=500_000.0,
    rms_norm_eps=1e-5, max_position_embeddings=8192, tie_word_embeddings=False,
)

SMOLLM2_135M = ModelConfig(
    architecture="LlamaForCausalLM",
    vocab_size=49_152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, head_dim=64, intermediate_size=1536, rope_theta=100_000.0,
    rms_norm_eps=1e-5, max_position_embeddings=8192, tie_word_embeddings=True,
)

# Tiny test shapes. head_dim != hidden/heads and kv heads < heads expose layout bugs;
# one tied, one untied.
LLAMA_TINY = LLAMA3_8B.replace(
    vocab_size=256, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, intermediate_size=96, max_position_embeddings=256,
)
SMOLLM2_TINY = SMOLLM2_135M.replace(
    vocab_size=256, hidden_size=48, num_hidden_layers=2, num_attention_heads=6,
    num_key_value_heads=2, head_dim=16, intermediate_size=64, max_position_embeddings=256,
)

CONFIGS = {
    "llama3_8b": LLAMA3_8B,
    "smollm2_135m": SMOLLM2_135M,
    "llama_tiny": LLAMA_TINY,
    "smollm2_tiny": SMOLLM2_TINY,
}

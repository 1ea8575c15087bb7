"""Qwen3 dense presets. Qwen3 differs from Llama by a per-head RMSNorm on q and k (before RoPE)
and an explicit head_dim. Values equal the vendor's config.json (see tests/fixtures/configs/)."""

from llm_onnx.model.config import ModelConfig

QWEN3_8B = ModelConfig(
    architecture="Qwen3ForCausalLM",
    vocab_size=151_936, hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, intermediate_size=12_288, rope_theta=1_000_000.0,
    rms_norm_eps=1e-6, max_position_embeddings=40_960, tie_word_embeddings=False, qk_norm=True,
)

QWEN3_TINY = QWEN3_8B.replace(
    vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, intermediate_size=128, max_position_embeddings=256,
)

CONFIGS = {"qwen3_8b": QWEN3_8B, "qwen3_tiny": QWEN3_TINY}

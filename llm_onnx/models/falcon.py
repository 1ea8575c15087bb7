"""Falcon presets (7B style). Falcon-7B differs from Llama by multi-query attention (one kv head),
attention and MLP in parallel from one shared LayerNorm, a plain exact-GELU MLP and no biases.
Values equal the vendor's config.json (see tests/fixtures/configs/)."""

from llm_onnx.model.config import ModelConfig

FALCON_7B = ModelConfig(
    architecture="FalconForCausalLM",
    vocab_size=65_024, hidden_size=4544, num_hidden_layers=32, num_attention_heads=71,
    num_key_value_heads=1, head_dim=64, intermediate_size=18_176, max_position_embeddings=2048,
    rope_theta=10_000.0, hidden_act="gelu", gated_mlp=False, norm_type="layer",
    layer_norm_epsilon=1e-5, parallel_attn=True, tie_word_embeddings=True,
)

FALCON_TINY = FALCON_7B.replace(
    vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=1, head_dim=16, intermediate_size=256, max_position_embeddings=128,
)

CONFIGS = {"falcon_7b": FALCON_7B, "falcon_tiny": FALCON_TINY}

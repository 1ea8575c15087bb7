"""Qwen3-MoE presets: Qwen3 attention with a sparse MLP (softmax router over 128 experts, top-8,
renormalised, SwiGLU experts). Values equal the vendor's config.json (see tests/fixtures/configs/)."""

from llm_onnx.model.config import ModelConfig, MoEConfig

QWEN3_30B_A3B = ModelConfig(
    architecture="Qwen3MoeForCausalLM",
    vocab_size=151_936, hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
    num_key_value_heads=4, head_dim=128, intermediate_size=6144, rope_theta=1_000_000.0,
    rms_norm_eps=1e-6, max_position_embeddings=40_960, tie_word_embeddings=False, qk_norm=True,
    moe=MoEConfig(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                  norm_topk_prob=True),
)

# E=4, K=2 with renormalisation; a second tiny preset without it keeps both router paths tested.
QWEN3_MOE_TINY = QWEN3_30B_A3B.replace(
    vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, intermediate_size=128, max_position_embeddings=256,
    moe=MoEConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True),
)

CONFIGS = {"qwen3_30b_a3b": QWEN3_30B_A3B, "qwen3_moe_tiny": QWEN3_MOE_TINY}

"""BLOOM presets. BLOOM differs from Llama by ALiBi instead of RoPE, LayerNorm (also right after
the embedding), a plain GELU (tanh) MLP, biases and multi-head attention. Values equal the
vendor's config.json (see tests/fixtures/configs/)."""

from llm_onnx.model.config import ModelConfig

BLOOM_560M = ModelConfig(
    architecture="BloomForCausalLM",
    vocab_size=250_880, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
    num_key_value_heads=16, head_dim=64, intermediate_size=4096, max_position_embeddings=2048,
    hidden_act="gelu_new", gated_mlp=False, position_embedding_type="alibi", norm_type="layer",
    layer_norm_epsilon=1e-5, embedding_layernorm=True, attention_bias=True, o_proj_bias=True,
    mlp_bias=True, tie_word_embeddings=True,
)

# 6 heads: not a power of two, so the second series of ALiBi slopes is used too. Untied: a tiny
# random BLOOM with a tied head only ever repeats its last token (the embedding LayerNorm makes
# the token's own embedding dominate the logits), which would make greedy comparisons vacuous.
BLOOM_TINY = BLOOM_560M.replace(
    vocab_size=256, hidden_size=96, num_hidden_layers=2, num_attention_heads=6,
    num_key_value_heads=6, head_dim=16, intermediate_size=384, tie_word_embeddings=False,
)

CONFIGS = {"bloom_560m": BLOOM_560M, "bloom_tiny": BLOOM_TINY}

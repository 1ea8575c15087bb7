"""GPT-2 presets. GPT-2 differs from Llama by learned absolute positions, LayerNorm, a plain GELU
(tanh) MLP, biases on every projection and multi-head attention. Values equal the vendor's
config.json (see tests/fixtures/configs/)."""

from llm_onnx.model.config import ModelConfig

GPT2 = ModelConfig(
    architecture="GPT2LMHeadModel",
    vocab_size=50_257, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
    num_key_value_heads=12, head_dim=64, intermediate_size=3072, max_position_embeddings=1024,
    hidden_act="gelu_new", gated_mlp=False, position_embedding_type="learned", norm_type="layer",
    layer_norm_epsilon=1e-5, attention_bias=True, o_proj_bias=True, mlp_bias=True,
    tie_word_embeddings=True,
)

# Multi-head attention fixes head_dim = hidden / heads here; n_inner != 4 * hidden.
GPT2_TINY = GPT2.replace(
    vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, head_dim=16, intermediate_size=96, max_position_embeddings=128,
)

CONFIGS = {"gpt2": GPT2, "gpt2_tiny": GPT2_TINY}

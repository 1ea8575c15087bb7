"""The decoder as an embedding model: each row's final hidden states pooled into one vector.

    forward(input_ids, sequence_lengths) -> embeddings

    input_ids         (B, T) int64, right-padded: row b's text is input_ids[b, :n_b]
    sequence_lengths  (B,) int32, n_b with 1 <= n_b <= T, and T the longest row's length
    embeddings        (B, E) float32, E the hidden size (the embedding width of OPT-350m)

One run, no cache kept: the layers run the decoder's prefill path over keys and values of the
run's own (one zeroed (B, Hkv, T, D) buffer, every layer's past, written into each layer's
present and dropped). Attention is causal, so a row's real tokens never see its padding: the
states pooled are the ones the text gets alone.

Pooling (model_folder.EmbeddingSpec): "last" the last real token's state (decoder embedding
models such as Qwen3-Embedding), "mean" the average over the real tokens, "cls" the first
token's; then, with ``normalize``, divided by its L2 norm (at least 1e-12, as torch's
F.normalize and sentence-transformers' Normalize).
"""

from __future__ import annotations

import torch
from torch import Tensor

from llm_onnx.model_folder import POOLINGS
from llm_onnx.modeling.config import ModelConfig
from llm_onnx.modeling.decoder import Decoder, Fusion
from llm_onnx.modeling.linear_attention import state_shapes


def pool(h: Tensor, lengths: Tensor, pooling: str, normalize: bool) -> Tensor:
    """(B, T, D) hidden states -> (B, D): pooled over each row's first ``lengths[b]`` tokens."""
    if pooling == "last":
        index = (lengths - 1).clamp_min(0)
        out = h.gather(1, index[:, None, None].expand(-1, 1, h.shape[-1]))[:, 0]
    elif pooling == "cls":
        out = h[:, 0]
    else:  # mean over the real tokens
        positions = torch.arange(h.shape[1], device=h.device, dtype=torch.int64)
        mask = (positions[None, :] < lengths[:, None]).to(h.dtype)  # (B, T)
        out = (h * mask[:, :, None]).sum(1) / lengths.clamp_min(1).to(h.dtype)[:, None]
    if normalize:
        out = out / out.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return out


class EmbeddingDecoder(Decoder):
    """A Decoder without its LM head whose forward pools (see the module docstring). Its
    parameters keep the Decoder's names, so checkpoints, export forms and weights.data are the
    generation model's, less ``lm_head``."""

    def __init__(self, cfg: ModelConfig, *, pooling: str, normalize: bool,
                 dtype: torch.dtype = torch.float32, fusion: Fusion | None = None,
                 max_positions: int | None = None) -> None:
        super().__init__(cfg, dtype=dtype, fusion=fusion, max_positions=max_positions, head=False)
        if pooling not in POOLINGS:
            raise ValueError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
        self.pooling, self.normalize = pooling, normalize

    def forward(self, input_ids: Tensor, sequence_lengths: Tensor) -> Tensor:  # type: ignore[override]
        cfg = self.config
        lengths = sequence_lengths.to(torch.int64)
        seqlens_k = (lengths - 1).to(torch.int32)
        # T from the values (a sum over a row of ones), as ops.device_positions counts it
        total = (input_ids[:1] * 0 + 1).sum().to(torch.int32)
        valid = sequence_lengths.to(torch.int32) if cfg.linear_attention is not None else None
        h, _, _ = self.hidden_states(input_ids, seqlens_k, total, *self.scratch_past(input_ids),
                                     valid_tokens=valid)
        if cfg.embedding.embed_dim is not None:  # OPT-350m: the bare output is projected out
            h = self.model.project_out(h.to(self.dtype)).float()
        return pool(h, lengths, self.pooling, self.normalize)

    def scratch_past(self, input_ids: Tensor) -> list[Tensor]:
        """Every layer's past for one run from empty: one zeroed (B, Hkv, T, D) buffer shared
        by the attention layers (each writes its own present), zeroed states for
        linear-attention layers."""
        cfg = self.config
        b, t = input_ids.shape
        buffers: dict[tuple[int, int], Tensor] = {}  # one per (Hkv, D) (Gemma 4: two)
        past: list[Tensor] = []
        for i in cfg.state_layers:
            if cfg.is_linear_layer(i):
                assert cfg.linear_attention is not None
                past += [torch.zeros((b, *shape), device=input_ids.device)
                         for shape in state_shapes(cfg.linear_attention)]
            else:
                heads, head_dim = cfg.layer_kv_shape(i)
                kv = buffers.get((heads, head_dim))
                if kv is None:
                    kv = buffers[(heads, head_dim)] = torch.zeros(
                        (b, heads, t, head_dim), dtype=self.dtype, device=input_ids.device)
                past += [kv, kv]
        return past

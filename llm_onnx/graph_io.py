"""The graphs' input and output names, the one place they are spelled (the exporter names the
graphs' values with them, the runtime binds them); model_folder re-exports them."""

from __future__ import annotations

from collections.abc import Collection

INPUT_IDS = "input_ids"  # (B, T) int64
SEQLENS_K = "seqlens_k"  # (B,) int32: valid tokens of each row (past + new) minus one
TOTAL_SEQUENCE_LENGTH = "total_sequence_length"  # () int32: the batch's largest valid length
PAST_KEY = "past_key_values.{}.key"  # (B, Hkv, max_len, D)
PAST_VALUE = "past_key_values.{}.value"
LOGITS = "logits"  # (B, T or W, V) float32
LOGITS_WINDOW = "logits_window"  # (W,) int64, prefill only: logits of the last W new tokens
PRESENT_KEY = "present.{}.key"  # same buffer as the past when bound in place
PRESENT_VALUE = "present.{}.value"
# A linear-attention layer's state instead of keys and values (Qwen3.5's Gated DeltaNet)
PAST_CONV = "past_state.{}.conv"  # (B, K-1, C): the convolution's last K-1 inputs
PAST_RECURRENT = "past_state.{}.recurrent"  # (B, Hv, dk, dv) float32
PRESENT_CONV = "present_state.{}.conv"
PRESENT_RECURRENT = "present_state.{}.recurrent"
VALID_TOKENS = "valid_tokens"  # (B,) int32, models with such layers: new tokens each row runs
# embed.onnx: input_ids (B, T) int64 right-padded, and each row's real tokens; one vector a row
SEQUENCE_LENGTHS = "sequence_lengths"  # (B,) int32, 1 <= n <= T
EMBEDDINGS = "embeddings"  # (B, E) float32, pooled (and L2-normalised where the spec says)
# A folder that takes images: prefill.onnx and decode.onnx also take (modeling/multimodal.py)
POSITION_IDS = "position_ids"  # (3, B, T) int64: each new token's time, height, width position
IMAGE_EMBEDS = "image_embeds"  # (M, D) float32: embeddings to place (vision.onnx's output too)
IMAGE_TOKEN_INDEX = "image_token_index"  # (M,) int64: where, among the B*T new tokens
DEEPSTACK_EMBEDS = "deepstack_embeds"  # (K, M, D) float32: Qwen3-VL's DeepStack features
# (B, T) int64, Gemma: the last key position each new token sees (an image's tokens: the end of
# their image; max with the token's own position, so zeros mean causal)
ATTEND_UNTIL = "attend_until"
# vision.onnx: one image's patches in, its soft tokens' embeddings out (modeling/vision_tower.py)
PIXEL_VALUES = "pixel_values"  # (N, C*T*P*P) float32, the processor's patches in its order
POSITION_INDEX = "position_index"  # (N, 4) int64: rows of the learned position grid blended
POSITION_WEIGHT = "position_weight"  # (N, 4) float32: their bilinear weights
ROTARY_COS = "rotary_cos"  # (N, D/2) float32: each patch's 2-D RoPE (height, then width angles)
ROTARY_SIN = "rotary_sin"
VISION_INPUTS = (PIXEL_VALUES, POSITION_INDEX, POSITION_WEIGHT, ROTARY_COS, ROTARY_SIN)
# Gemma 3's vision.onnx takes pixel_values (I, 3, S, S) alone; Gemma 4's, (N, P*P*3) patches in
# [0, 1] and their (column, row) (modeling/gemma3_vision.py, gemma4_vision.py)
PIXEL_POSITION_IDS = "pixel_position_ids"  # (N, 2) int64
VISION_INPUTS_BY_KIND = {"qwen_vl": VISION_INPUTS, "gemma3": (PIXEL_VALUES,),
                         "gemma4": (PIXEL_VALUES, PIXEL_POSITION_IDS)}


def state_names(num_layers: int, linear: Collection[int] = (),
                shared: Collection[int] = ()) -> list[tuple[str, str]]:
    """(past, present) graph names of every layer's two state tensors, in the graphs' order:
    keys and values, or a linear-attention layer's conv and recurrent states; ``shared``
    layers (Gemma 4's KV-shared ones) have none."""
    out = []
    for i in range(num_layers):
        if i in shared:
            continue
        if i in linear:
            out += [(PAST_CONV.format(i), PRESENT_CONV.format(i)),
                    (PAST_RECURRENT.format(i), PRESENT_RECURRENT.format(i))]
        else:
            out += [(PAST_KEY.format(i), PRESENT_KEY.format(i)),
                    (PAST_VALUE.format(i), PRESENT_VALUE.format(i))]
    return out


def input_names(num_layers: int, linear: Collection[int] = (),
                shared: Collection[int] = ()) -> list[str]:
    return [INPUT_IDS, SEQLENS_K, TOTAL_SEQUENCE_LENGTH] + [
        past for past, _ in state_names(num_layers, linear, shared)]


def image_input_names(deepstack: bool, mrope: bool = True, attend: bool = False) -> list[str]:
    """The inputs a decoder that takes images adds, in the graphs' order: Qwen's position rows
    (``mrope``) and DeepStack features (``deepstack``), Gemma's ``attend_until`` (``attend``:
    layers where an image's tokens see each other both ways)."""
    return [POSITION_IDS] * mrope + [IMAGE_EMBEDS, IMAGE_TOKEN_INDEX] + \
        [DEEPSTACK_EMBEDS] * deepstack + [ATTEND_UNTIL] * attend


def vision_output_names(deepstack: bool) -> list[str]:
    return [IMAGE_EMBEDS] + ([DEEPSTACK_EMBEDS] if deepstack else [])


def output_names(num_layers: int, linear: Collection[int] = ()) -> list[str]:
    """Every layer's presents (Gemma 4's KV-shared layers too: bound to their source's buffer,
    while their pasts are not inputs)."""
    return [LOGITS] + [present for _, present in state_names(num_layers, linear)]


__all__ = ["INPUT_IDS", "SEQLENS_K", "TOTAL_SEQUENCE_LENGTH", "PAST_KEY", "PAST_VALUE", "LOGITS",
           "LOGITS_WINDOW", "PRESENT_KEY", "PRESENT_VALUE", "PAST_CONV", "PAST_RECURRENT",
           "PRESENT_CONV", "PRESENT_RECURRENT", "VALID_TOKENS", "SEQUENCE_LENGTHS", "EMBEDDINGS",
           "state_names", "input_names", "output_names", "POSITION_IDS", "IMAGE_EMBEDS",
           "IMAGE_TOKEN_INDEX", "DEEPSTACK_EMBEDS", "PIXEL_VALUES", "POSITION_INDEX",
           "POSITION_WEIGHT", "ROTARY_COS", "ROTARY_SIN", "VISION_INPUTS", "ATTEND_UNTIL",
           "PIXEL_POSITION_IDS", "VISION_INPUTS_BY_KIND", "image_input_names", "vision_output_names"]

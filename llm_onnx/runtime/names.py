"""Graph input and output names: the one place both the exporter and the runtime take them from."""

INPUT_IDS = "input_ids"  # (B, T) int64
SEQLENS_K = "seqlens_k"  # (B,) int32: valid tokens of each row (past + new) minus one
TOTAL_SEQUENCE_LENGTH = "total_sequence_length"  # () int32: the batch's largest valid length
PAST_KEY = "past_key_values.{}.key"  # (B, Hkv, max_len, D)
PAST_VALUE = "past_key_values.{}.value"
LOGITS = "logits"  # (B, T or 1, V) float32
PRESENT_KEY = "present.{}.key"  # same buffer as the past when bound in place
PRESENT_VALUE = "present.{}.value"


def input_names(num_layers: int) -> list[str]:
    names = [INPUT_IDS, SEQLENS_K, TOTAL_SEQUENCE_LENGTH]
    for i in range(num_layers):
        names += [PAST_KEY.format(i), PAST_VALUE.format(i)]
    return names


def output_names(num_layers: int) -> list[str]:
    names = [LOGITS]
    for i in range(num_layers):
        names += [PRESENT_KEY.format(i), PRESENT_VALUE.format(i)]
    return names

"""Tolerances of the parity ladder (docs/testing.md), in one place."""

# our torch decoder vs transformers, fp32, same weights.
TORCH_VS_HF_FP32 = 1e-4
# KV path (prefill + single-token steps) vs one full forward, fp32.
KV_PATH_FP32 = 1e-4
# One custom op vs its torch reference, alone, fp32.
OP_FP32 = 1e-5
# ONNX Runtime vs torch / transformers, fp32.
ORT_FP32 = 1e-4
# ONNX Runtime fp16 graph vs the fp32 torch model (logits of tiny random models are O(1)).
ORT_FP16 = 5e-2
# ONNX Runtime int8/int4 vs torch running the dequantized weights.
ORT_QUANT = 2e-3
# A vision tower's soft tokens (values of order 1) vs transformers' get_image_features, fp32.
VISION_TOWER_FP32 = 1e-5

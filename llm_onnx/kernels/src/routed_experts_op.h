// The RoutedExperts operator (domain llm_onnx, version 1), ONNX Runtime's side of experts.h.
//
// Inputs (float, int64 index, uint8 codes and zero points):
//   0 x (N, D)   1 index (N, K)   2 weight (N, K)
//   3 gate_up_codes (E, 2I, ...) 4 gate_up_scales (E, 2I, ceil(D / block))
//   5 down_codes (E, D, ...)     6 down_scales (E, D, ceil(I / block))
//   7 gate_up_bias (E, 2I)?  8 down_bias (E, D)?  9 gate_up_zero_points?  10 down_zero_points?
// Output: y (N, D).
// Attributes: bits (4 | 8), block_size, activation ("swiglu" | "geglu"), gate_up_layout
// ("interleaved" | "halves"), alpha, beta, limit (SwiGLU's; limit absent = no clamp).
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include "cpu.h"
#include "experts.h"

namespace llm_onnx_kernels {

struct RoutedExpertsKernel {
  RoutedExpertsKernel(const OrtApi& api, const OrtKernelInfo* info);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

  const OrtApi& api;
  Isa isa{};
  int bits = 4, block = 32;
  Activation activation = Activation::kSwiGLU;
  bool interleaved = true;
  float alpha = 1.0f, beta = 0.0f, limit = INFINITY;
};

struct RoutedExpertsOp : Ort::CustomOpBase<RoutedExpertsOp, RoutedExpertsKernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const;
  const char* GetName() const { return "RoutedExperts"; }
  size_t GetInputTypeCount() const { return 11; }
  ONNXTensorElementDataType GetInputType(size_t index) const;
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const;
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const {
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
};

}  // namespace llm_onnx_kernels

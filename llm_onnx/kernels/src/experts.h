// Routed experts on block-quantized weights, independent of ONNX Runtime (routed_experts_op.cc
// wraps it as an operator; the thread pool comes in as a ParallelFor).
//
//   x (N, D) --quantize per token, per block--> xq int8
//   tokens grouped by expert: the (token, slot) pairs of expert 0, then expert 1, ...
//   stage 1, per chosen expert e and tile of j < I:  gate_j, up_j = rows of gate_up[e] . xq
//            act[pair, j] = activation(gate_j + bias, up_j + bias)               (N*K, I) fp32
//   act --quantize per pair, per block--> aq int8
//   stage 2, per tile of output columns n < D, every chosen expert in order:
//            out[t, n] += weight[pair] * (down[e] row n . aq[pair] + bias)
//
// Only the chosen experts' weight bytes are read. Each work item writes its own part of act or
// out, so no two threads ever write one element (no atomics, no lost updates), and each output
// sums its experts in expert order whatever the number of threads.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "dot.h"

namespace llm_onnx_kernels {

// E stacked (rows, cols) matrices, each row ceil(cols / block) blocks of packed codes
// (MatMulNBits' layout), a float scale per block and optionally a packed zero point per block
// (null: 2^(bits - 1), the symmetric quantization's).
struct QuantMatrix {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  const uint8_t* zero_points = nullptr;
  int64_t rows = 0, cols = 0;
};

enum class Activation { kSwiGLU, kGeGLU };

struct ExpertsArgs {
  int64_t tokens = 0, top_k = 0, experts = 0, hidden = 0, width = 0;  // N, K, E, D, I
  const float* x = nullptr;        // (N, D)
  const int64_t* index = nullptr;  // (N, K) chosen experts
  const float* weight = nullptr;   // (N, K) their routing weights
  QuantMatrix gate_up;             // (E, 2I, D)
  QuantMatrix down;                // (E, D, I)
  const float* gate_up_bias = nullptr;  // (E, 2I) in gate_up's row order, or null
  const float* down_bias = nullptr;     // (E, D) or null
  int bits = 4, block = 32;
  Activation activation = Activation::kSwiGLU;
  bool interleaved = true;  // gate_up rows g0, u0, g1, u1, ... (QMoE's); else [gate | up]
  // SwiGLU: min(g, limit) * sigmoid(alpha * min(g, limit)) * (clamp(u, +-limit) + beta);
  // silu(g) * u is (1, 0, inf), gpt-oss's clamped form (1.702, 1, 7)
  float alpha = 1.0f, beta = 0.0f, limit = INFINITY;
  float* out = nullptr;            // (N, D)
};

// Calls fn(i) for each i < total, possibly on several threads at once.
using ParallelFor = std::function<void(size_t total, const std::function<void(size_t)>& fn)>;

// Empty when args are consistent, else what is wrong (for the operator's error).
std::string check_args(const ExpertsArgs& args);

void run_experts(const ExpertsArgs& args, BlockDots dots, const ParallelFor& parallel_for);

}  // namespace llm_onnx_kernels

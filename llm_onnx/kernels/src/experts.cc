// run_experts: see experts.h for the data flow.
#include "experts.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace llm_onnx_kernels {

namespace {

constexpr int64_t kRowsPerItem = 16;  // weight rows (stage 1: row pairs) a work item reads
constexpr int kChunk = 64;            // blocks whose integer dots are taken at once

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Activations quantized per row and per block: q (rows, blocks * block) int8 with zeros past
// cols, scale (rows, blocks) = max|x| / 127, sum (rows, blocks) = sum of q.
struct QuantRows {
  int64_t blocks = 0, stride = 0;
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> sum;
};

void quantize_row(const float* src, int64_t cols, int block, int8_t* q, float* scale,
                  int32_t* sum, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * block, c1 = std::min<int64_t>(c0 + block, cols);
    float amax = 0.0f;
    for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(src[c]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t s = 0;
    for (int64_t c = c0; c < c1; ++c) {
      const float r = std::nearbyint(src[c] * inv);  // to nearest, ties to even
      const int32_t v = static_cast<int32_t>(std::max(-127.0f, std::min(127.0f, r)));
      q[c] = static_cast<int8_t>(v);
      s += v;
    }
    for (int64_t c = c1; c < c0 + block; ++c) q[c] = 0;
    scale[b] = amax / 127.0f;
    sum[b] = s;
  }
}

void quantize_rows(const float* src, int64_t rows, int64_t cols, int block, QuantRows* out,
                   const ParallelFor& parallel_for) {
  out->blocks = ceil_div(cols, block);
  out->stride = out->blocks * block;
  out->q.assign(static_cast<size_t>(rows * out->stride), 0);
  out->scale.assign(static_cast<size_t>(rows * out->blocks), 0.0f);
  out->sum.assign(static_cast<size_t>(rows * out->blocks), 0);
  parallel_for(static_cast<size_t>(rows), [&](size_t r) {
    quantize_row(src + r * cols, cols, block, out->q.data() + r * out->stride,
                 out->scale.data() + r * out->blocks, out->sum.data() + r * out->blocks,
                 out->blocks);
  });
}

int zero_point(const QuantMatrix& m, int64_t row, int64_t b, int64_t blocks, int bits) {
  if (m.zero_points == nullptr) return 1 << (bits - 1);
  if (bits == 8) return m.zero_points[row * blocks + b];
  const uint8_t byte = m.zero_points[row * ceil_div(blocks, 2) + b / 2];
  return (b & 1) ? byte >> 4 : byte & 0x0F;
}

// Row `row` of the stacked matrix (expert-major) times quantized row `r` of `a`:
// sum over blocks of w_scale * x_scale * (sum code * xq - zero_point * sum xq).
float row_dot(const QuantMatrix& m, int64_t row, const QuantRows& a, int64_t r, int bits,
              int block, BlockDots dots) {
  const int64_t blocks = a.blocks, row_bytes = blocks * block * bits / 8;
  const uint8_t* codes = m.codes + row * row_bytes;
  const float* ws = m.scales + row * blocks;
  const int8_t* xq = a.q.data() + r * a.stride;
  const float* xs = a.scale.data() + r * blocks;
  const int32_t* xsum = a.sum.data() + r * blocks;
  int32_t ints[kChunk];
  float acc = 0.0f;
  for (int64_t b0 = 0; b0 < blocks; b0 += kChunk) {
    const int n = static_cast<int>(std::min<int64_t>(kChunk, blocks - b0));
    dots(codes + b0 * block * bits / 8, xq + b0 * block, xsum + b0, n, block, bits, ints);
    for (int i = 0; i < n; ++i) {
      const int32_t zp = zero_point(m, row, b0 + i, blocks, bits);
      acc += ws[b0 + i] * xs[b0 + i] * static_cast<float>(ints[i] - zp * xsum[b0 + i]);
    }
  }
  return acc;
}

float activate(const ExpertsArgs& args, float g, float u) {
  if (args.activation == Activation::kGeGLU) {  // gelu, tanh form (Gemma's gelu_pytorch_tanh)
    const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);
    return 0.5f * g * (1.0f + std::tanh(inner)) * u;
  }
  g = g > args.limit ? args.limit : g;
  u = u > args.limit ? args.limit : (u < -args.limit ? -args.limit : u);
  return g / (1.0f + std::exp(-args.alpha * g)) * (u + args.beta);
}

}  // namespace

std::string check_args(const ExpertsArgs& a) {
  if (a.bits != 4 && a.bits != 8) return "bits must be 4 or 8, got " + std::to_string(a.bits);
  if (a.block < 16 || a.block % 16 != 0)
    return "block_size must be a multiple of 16, got " + std::to_string(a.block);
  if (a.gate_up.rows != 2 * a.width || a.gate_up.cols != a.hidden)
    return "gate_up must be (E, 2I, D) and down (E, D, I)";
  if (a.down.rows != a.hidden || a.down.cols != a.width)
    return "gate_up must be (E, 2I, D) and down (E, D, I)";
  for (int64_t i = 0; i < a.tokens * a.top_k; ++i) {
    if (a.index[i] < 0 || a.index[i] >= a.experts)
      return "expert index " + std::to_string(a.index[i]) + " out of range for " +
             std::to_string(a.experts) + " experts";
  }
  return "";
}

void run_experts(const ExpertsArgs& a, BlockDots dots, const ParallelFor& parallel_for) {
  const int64_t n = a.tokens, k = a.top_k, d = a.hidden, width = a.width;
  // Group the (token, slot) pairs by expert, tokens in order within each (a counting sort).
  std::vector<int64_t> begin(static_cast<size_t>(a.experts + 1), 0);
  for (int64_t i = 0; i < n * k; ++i) ++begin[static_cast<size_t>(a.index[i] + 1)];
  for (int64_t e = 0; e < a.experts; ++e) begin[e + 1] += begin[e];
  std::vector<int64_t> pair_token(static_cast<size_t>(n * k));
  std::vector<float> pair_weight(static_cast<size_t>(n * k));
  {
    std::vector<int64_t> next(begin.begin(), begin.end() - 1);
    for (int64_t i = 0; i < n * k; ++i) {
      const int64_t p = next[static_cast<size_t>(a.index[i])]++;
      pair_token[p] = i / k;
      pair_weight[p] = a.weight[i];
    }
  }
  std::vector<int64_t> chosen;  // experts some token chose, in order
  for (int64_t e = 0; e < a.experts; ++e)
    if (begin[e + 1] > begin[e]) chosen.push_back(e);

  QuantRows xq;
  quantize_rows(a.x, n, d, a.block, &xq, parallel_for);

  // Stage 1: work item = (chosen expert, tile of kRowsPerItem gate/up row pairs).
  const int64_t tiles1 = ceil_div(width, kRowsPerItem);
  std::vector<float> act(static_cast<size_t>(n * k * width));
  parallel_for(chosen.size() * static_cast<size_t>(tiles1), [&](size_t item) {
    const int64_t e = chosen[item / tiles1], j0 = (item % tiles1) * kRowsPerItem;
    const int64_t j1 = std::min(j0 + kRowsPerItem, width);
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t g_row = a.interleaved ? 2 * j : j, u_row = a.interleaved ? 2 * j + 1 : width + j;
      const float gb = a.gate_up_bias ? a.gate_up_bias[e * 2 * width + g_row] : 0.0f;
      const float ub = a.gate_up_bias ? a.gate_up_bias[e * 2 * width + u_row] : 0.0f;
      for (int64_t p = begin[e]; p < begin[e + 1]; ++p) {
        const int64_t t = pair_token[p];
        const float g = row_dot(a.gate_up, e * 2 * width + g_row, xq, t, a.bits, a.block, dots);
        const float u = row_dot(a.gate_up, e * 2 * width + u_row, xq, t, a.bits, a.block, dots);
        act[p * width + j] = activate(a, g + gb, u + ub);
      }
    }
  });

  QuantRows aq;
  quantize_rows(act.data(), n * k, width, a.block, &aq, parallel_for);

  // Stage 2: work item = tile of kRowsPerItem output columns, over every chosen expert.
  const int64_t tiles2 = ceil_div(d, kRowsPerItem);
  parallel_for(static_cast<size_t>(tiles2), [&](size_t item) {
    const int64_t c0 = static_cast<int64_t>(item) * kRowsPerItem;
    const int64_t c1 = std::min(c0 + kRowsPerItem, d);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = c0; c < c1; ++c) a.out[t * d + c] = 0.0f;
    for (const int64_t e : chosen) {
      for (int64_t c = c0; c < c1; ++c) {
        const float bias = a.down_bias ? a.down_bias[e * d + c] : 0.0f;
        for (int64_t p = begin[e]; p < begin[e + 1]; ++p) {
          const float y = row_dot(a.down, e * d + c, aq, p, a.bits, a.block, dots);
          a.out[pair_token[p] * d + c] += pair_weight[p] * (y + bias);
        }
      }
    }
  });
}

}  // namespace llm_onnx_kernels

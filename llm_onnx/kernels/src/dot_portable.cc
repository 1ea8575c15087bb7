// block_dots in plain C++: the reference every other instruction set must equal.
#include "dot.h"

namespace llm_onnx_kernels {

void block_dots_portable(const uint8_t* codes, const int8_t* xq, const int32_t* /*xsum*/,
                         int n_blocks, int block, int bits, int32_t* out) {
  for (int b = 0; b < n_blocks; ++b) {
    const int8_t* x = xq + static_cast<int64_t>(b) * block;
    int32_t acc = 0;
    if (bits == 8) {
      const uint8_t* w = codes + static_cast<int64_t>(b) * block;
      for (int c = 0; c < block; ++c) acc += static_cast<int32_t>(w[c]) * x[c];
    } else {  // 4 bits: byte j holds codes 2j (low nibble) and 2j + 1 (high nibble)
      const uint8_t* w = codes + static_cast<int64_t>(b) * (block / 2);
      for (int c = 0; c < block / 2; ++c) {
        acc += static_cast<int32_t>(w[c] & 0x0F) * x[2 * c] +
               static_cast<int32_t>(w[c] >> 4) * x[2 * c + 1];
      }
    }
    out[b] = acc;
  }
}

}  // namespace llm_onnx_kernels

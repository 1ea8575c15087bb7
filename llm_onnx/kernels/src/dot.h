// Integer block dot products of block-quantized weight rows with int8 activations: the one part
// of the kernels written once per instruction set (dot_*.cc), chosen at run time (cpu.cc).
//
// A weight row is `n_blocks` blocks of `block` codes, packed `bits` wide (ONNX Runtime's
// MatMulNBits layout: 8 bits a byte each, or 4 bits two to a byte, low nibble first). Codes are
// unsigned (0..255 or 0..15); the zero point is applied by the caller, from `xsum`.
//
//   out[b] = sum over c in block b of code[c] * xq[c]          (int32, exact)
//
// Every implementation returns the same integers, so the float results built on them are
// identical whichever is chosen. The ISA files include nothing but intrinsics and <cstdint>:
// an inline template instantiated there with wider instructions could otherwise be picked by
// the linker for the portable code too.
#pragma once

#include <cstdint>

namespace llm_onnx_kernels {

using BlockDots = void (*)(const uint8_t* codes, const int8_t* xq, const int32_t* xsum,
                           int n_blocks, int block, int bits, int32_t* out);

void block_dots_portable(const uint8_t* codes, const int8_t* xq, const int32_t* xsum,
                         int n_blocks, int block, int bits, int32_t* out);
#if LLM_ONNX_X86
void block_dots_avx2(const uint8_t* codes, const int8_t* xq, const int32_t* xsum, int n_blocks,
                     int block, int bits, int32_t* out);
void block_dots_avxvnni(const uint8_t* codes, const int8_t* xq, const int32_t* xsum,
                        int n_blocks, int block, int bits, int32_t* out);
void block_dots_avx512vnni(const uint8_t* codes, const int8_t* xq, const int32_t* xsum,
                           int n_blocks, int block, int bits, int32_t* out);
#endif

}  // namespace llm_onnx_kernels

// block_dots with AVX-VNNI (the VEX-encoded vpdpbusd on 32 bytes, Alder Lake and later without
// AVX-512): unsigned codes times signed int8 activations. Blocks are multiples of 16 codes: 32
// at a time, then one 16-code step with the 128-bit form.
#include <immintrin.h>

#include "dot.h"

namespace llm_onnx_kernels {

namespace {

#include "dot_avx256.h"  // hsum, unpack_nibbles, unpack_nibbles8

}  // namespace

void block_dots_avxvnni(const uint8_t* codes, const int8_t* xq, const int32_t* /*xsum*/,
                        int n_blocks, int block, int bits, int32_t* out) {
  for (int b = 0; b < n_blocks; ++b) {
    const int8_t* x = xq + static_cast<int64_t>(b) * block;
    __m256i acc = _mm256_setzero_si256();
    __m128i tail = _mm_setzero_si128();
    int c = 0;
    if (bits == 8) {
      const uint8_t* w = codes + static_cast<int64_t>(b) * block;
      for (; c + 32 <= block; c += 32) {
        acc = _mm256_dpbusd_avx_epi32(
            acc, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c)),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + c)));
      }
      if (c < block) {
        tail = _mm_dpbusd_avx_epi32(tail, _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + c)),
                                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + c)));
      }
    } else {
      const uint8_t* w = codes + static_cast<int64_t>(b) * (block / 2);
      for (; c + 32 <= block; c += 32) {
        const __m256i wc =
            unpack_nibbles(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + c / 2)));
        acc = _mm256_dpbusd_avx_epi32(acc, wc,
                                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + c)));
      }
      if (c < block) {
        const __m128i wc =
            unpack_nibbles8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + c / 2)));
        tail = _mm_dpbusd_avx_epi32(tail, wc, _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + c)));
      }
    }
    out[b] = hsum(_mm256_add_epi32(acc, _mm256_zextsi128_si256(tail)));
  }
}

}  // namespace llm_onnx_kernels

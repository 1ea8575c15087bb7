// block_dots with AVX-512 VNNI (vpdpbusd on 64 bytes): unsigned codes times signed int8
// activations, four products summed into each int32 lane. Blocks are multiples of 16 codes;
// a block's last partial vector is read with a masked load (masked bytes read as zero).
#include <immintrin.h>

#include "dot.h"

namespace llm_onnx_kernels {

namespace {

// 64 codes from 32 bytes of 4-bit pairs, in order: each byte widened to 16 bits, its low nibble
// kept in the low byte and its high nibble moved to the high byte.
inline __m512i unpack_nibbles(__m256i bytes) {
  const __m512i wide = _mm512_cvtepu8_epi16(bytes);
  const __m512i lo = _mm512_and_si512(wide, _mm512_set1_epi16(0x000F));
  const __m512i hi = _mm512_and_si512(_mm512_slli_epi16(wide, 4), _mm512_set1_epi16(0x0F00));
  return _mm512_or_si512(lo, hi);
}

inline int32_t hsum(__m512i v) {
  // (masked extracts: GCC 12's plain ones warn of an uninitialised value in its own header)
  const __m256i zero = _mm256_setzero_si256();
  const __m256i h = _mm256_add_epi32(_mm512_mask_extracti64x4_epi64(zero, 0xFF, v, 0),
                                     _mm512_mask_extracti64x4_epi64(zero, 0xFF, v, 1));
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

}  // namespace

void block_dots_avx512vnni(const uint8_t* codes, const int8_t* xq, const int32_t* /*xsum*/,
                           int n_blocks, int block, int bits, int32_t* out) {
  for (int b = 0; b < n_blocks; ++b) {
    const int8_t* x = xq + static_cast<int64_t>(b) * block;
    __m512i acc = _mm512_setzero_si512();
    if (bits == 8) {
      const uint8_t* w = codes + static_cast<int64_t>(b) * block;
      for (int c = 0; c < block; c += 64) {
        const int n = block - c < 64 ? block - c : 64;
        const __mmask64 m = n == 64 ? ~0ULL : (1ULL << n) - 1;
        acc = _mm512_dpbusd_epi32(acc, _mm512_maskz_loadu_epi8(m, w + c),
                                  _mm512_maskz_loadu_epi8(m, x + c));
      }
    } else {
      const uint8_t* w = codes + static_cast<int64_t>(b) * (block / 2);
      for (int c = 0; c < block; c += 64) {
        const int n = block - c < 64 ? block - c : 64;  // codes in this step
        const __mmask32 mw = n == 64 ? ~0U : (1U << (n / 2)) - 1;
        const __mmask64 mx = n == 64 ? ~0ULL : (1ULL << n) - 1;
        const __m512i wc = unpack_nibbles(_mm256_maskz_loadu_epi8(mw, w + c / 2));
        acc = _mm512_dpbusd_epi32(acc, wc, _mm512_maskz_loadu_epi8(mx, x + c));
      }
    }
    out[b] = hsum(acc);
  }
}

}  // namespace llm_onnx_kernels

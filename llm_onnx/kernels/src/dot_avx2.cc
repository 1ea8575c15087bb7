// block_dots with AVX2 (no VNNI): vpmaddubsw multiplies unsigned bytes by signed ones and adds
// pairs into int16 with saturation, then vpmaddwd widens to int32.
//   4 bits: codes <= 15, so a pair is at most 2 * 15 * 127: no saturation.
//   8 bits: codes up to 255 could saturate (2 * 255 * 127 > 32767), so the codes are first
//           centred (code - 128, in [-128, 127]) and multiplied as |c| * sign(x, c): a pair is
//           at most 2 * 128 * 127 = 32512. The block's sum of x (xsum) times 128 adds the centre
//           back, so the result is sum(code * x) as the other instruction sets return it.
#include <immintrin.h>

#include "dot.h"

namespace llm_onnx_kernels {

namespace {

#include "dot_avx256.h"  // hsum, unpack_nibbles, unpack_nibbles8

// sum of products of 32 unsigned codes and 32 signed activations, as 8 int32 lanes
inline __m256i dot32_u4(__m256i codes, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, x), _mm256_set1_epi16(1));
}

inline __m256i dot32_centred(__m256i codes, __m256i x) {  // (code - 128) * x
  const __m256i c = _mm256_xor_si256(codes, _mm256_set1_epi8(static_cast<char>(0x80)));
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(c, c), _mm256_sign_epi8(x, c)),
                           _mm256_set1_epi16(1));
}

inline __m128i dot16_u4(__m128i codes, __m128i x) {
  return _mm_madd_epi16(_mm_maddubs_epi16(codes, x), _mm_set1_epi16(1));
}

inline __m128i dot16_centred(__m128i codes, __m128i x) {
  const __m128i c = _mm_xor_si128(codes, _mm_set1_epi8(static_cast<char>(0x80)));
  return _mm_madd_epi16(_mm_maddubs_epi16(_mm_sign_epi8(c, c), _mm_sign_epi8(x, c)),
                        _mm_set1_epi16(1));
}

}  // namespace

void block_dots_avx2(const uint8_t* codes, const int8_t* xq, const int32_t* xsum, int n_blocks,
                     int block, int bits, int32_t* out) {
  for (int b = 0; b < n_blocks; ++b) {
    const int8_t* x = xq + static_cast<int64_t>(b) * block;
    __m256i acc = _mm256_setzero_si256();
    __m128i tail = _mm_setzero_si128();
    int c = 0;
    if (bits == 8) {
      const uint8_t* w = codes + static_cast<int64_t>(b) * block;
      for (; c + 32 <= block; c += 32) {
        acc = _mm256_add_epi32(
            acc, dot32_centred(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c)),
                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + c))));
      }
      if (c < block) {
        tail = dot16_centred(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + c)),
                             _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + c)));
      }
      out[b] = hsum(_mm256_add_epi32(acc, _mm256_zextsi128_si256(tail))) + 128 * xsum[b];
    } else {
      const uint8_t* w = codes + static_cast<int64_t>(b) * (block / 2);
      for (; c + 32 <= block; c += 32) {
        acc = _mm256_add_epi32(
            acc, dot32_u4(unpack_nibbles(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + c / 2))),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + c))));
      }
      if (c < block) {
        tail = dot16_u4(unpack_nibbles8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + c / 2))),
                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + c)));
      }
      out[b] = hsum(_mm256_add_epi32(acc, _mm256_zextsi128_si256(tail)));
    }
  }
}

}  // namespace llm_onnx_kernels

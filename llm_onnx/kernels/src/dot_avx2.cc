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

inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

inline __m256i unpack_nibbles(__m128i bytes) {  // 32 codes from 16 bytes, in order
  const __m256i wide = _mm256_cvtepu8_epi16(bytes);
  const __m256i lo = _mm256_and_si256(wide, _mm256_set1_epi16(0x000F));
  const __m256i hi = _mm256_and_si256(_mm256_slli_epi16(wide, 4), _mm256_set1_epi16(0x0F00));
  return _mm256_or_si256(lo, hi);
}

inline __m128i unpack_nibbles8(__m128i bytes) {  // 16 codes from the low 8 bytes
  const __m128i wide = _mm_cvtepu8_epi16(bytes);
  const __m128i lo = _mm_and_si128(wide, _mm_set1_epi16(0x000F));
  const __m128i hi = _mm_and_si128(_mm_slli_epi16(wide, 4), _mm_set1_epi16(0x0F00));
  return _mm_or_si128(lo, hi);
}

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

// Helpers of the two 256-bit paths (dot_avx2.cc, dot_avxvnni.cc), each compiled with its own
// instruction-set flags. Included inside each file's unnamed namespace, after <immintrin.h> and
// dot.h: each file keeps a copy of its own, built with its flags (one shared inline definition
// could be linked from the AVX-VNNI file into the AVX2 path). No include guard, no includes.
inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// 32 codes from 16 bytes of 4-bit pairs, in order (see dot_avx512vnni.cc).
inline __m256i unpack_nibbles(__m128i bytes) {
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

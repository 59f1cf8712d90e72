// Activations quantized as llama.cpp quantizes them for its integer dot products: each row's
// groups of 32 to int8 with a scale of their own, d = max|x| / 127, q[k] = round(x[k] / d) in
// [-127, 127] (to nearest even), and s = d * (sum of the q[k]). Shared by the 4-bit kernel
// (int4_rows.cpp, which wants each 8 codes in nibble order) and the 5-to-8-bit kernel
// (int8_rows.cpp, which wants them in input order and the integer sums of each half group).
//
// AVX2 code in every build: the codes round to nearest even and are whole numbers, so their sums
// are exact in any order, and the maximum is exact in any order too. A row's codes, scales and
// sums depend on that row alone: the kernels' batch invariance starts here.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <cstdint>

namespace mohawk {

constexpr int kActivationGroup = 32;

inline float horizontal_sum(__m256 v) {
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// One group of 32 activations -> its int8 codes, d and s; with kNibbleOrder each block of 8 codes
// is stored q0 q2 q4 q6 q1 q3 q5 q7 (the 4-bit kernel's word holds inputs 2i and 2i + 1 in byte
// i's low and high nibble), else in input order. `halves`, where not null, gets the integer sums
// of codes 0-15 and 16-31.
template <bool kNibbleOrder>
inline void quantize_group(const float* x, int8_t* q, float* d, float* s, int32_t* halves) {
  const __m256 a = _mm256_loadu_ps(x), b = _mm256_loadu_ps(x + 8), c = _mm256_loadu_ps(x + 16),
               e = _mm256_loadu_ps(x + 24);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, a), _mm256_andnot_ps(sign, b)),
                                  _mm256_max_ps(_mm256_andnot_ps(sign, c), _mm256_andnot_ps(sign, e)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
  const float scale = amax / 127.f;
  const __m256 inverse = _mm256_set1_ps(scale > 0.f ? 1.f / scale : 0.f);
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m256 ra = _mm256_round_ps(_mm256_mul_ps(a, inverse), kNearest),
               rb = _mm256_round_ps(_mm256_mul_ps(b, inverse), kNearest),
               rc = _mm256_round_ps(_mm256_mul_ps(c, inverse), kNearest),
               re = _mm256_round_ps(_mm256_mul_ps(e, inverse), kNearest);
  const float first = horizontal_sum(_mm256_add_ps(ra, rb)), second = horizontal_sum(_mm256_add_ps(rc, re));
  *d = scale;
  *s = scale * (first + second);  // whole numbers below 2^12: exact, as any order of summing them
  if (halves != nullptr) {
    halves[0] = static_cast<int32_t>(first);
    halves[1] = static_cast<int32_t>(second);
  }
  const __m256i ab = _mm256_packs_epi32(_mm256_cvtps_epi32(ra), _mm256_cvtps_epi32(rb));
  const __m256i ce = _mm256_packs_epi32(_mm256_cvtps_epi32(rc), _mm256_cvtps_epi32(re));
  // bytes: a0-3 b0-3 c0-3 e0-3 | a4-7 b4-7 c4-7 e4-7 -> input order
  __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, ce), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  if constexpr (kNibbleOrder)
    bytes = _mm256_shuffle_epi8(bytes, _mm256_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15, 0, 2, 4,
                                                        6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), bytes);
}

// Row m's int8 codes q [M, K], group scales d and sums s [M, K/32] and, where `halves` is not
// null, the integer sums of each half group [M, K/16]; each row alone.
template <bool kNibbleOrder>
void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* s, int32_t* halves,
                   int num_threads) {
  const int64_t G = K / kActivationGroup;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (M * K >= 65536)
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g)
      quantize_group<kNibbleOrder>(x + m * K + g * kActivationGroup, q + m * K + g * kActivationGroup, d + m * G + g,
                                   s + m * G + g, halves == nullptr ? nullptr : halves + (m * G + g) * 2);
}

}  // namespace mohawk

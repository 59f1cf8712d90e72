// Activations quantized as llama.cpp quantizes them for its integer dot products: each row's
// groups of 32 to int8 with a scale of their own, d = max|x| / 127, q[k] = round(x[k] / d) in
// [-127, 127] (to nearest even), and s = d * (sum of the q[k]). Shared by the 4-bit kernel
// (int4_rows.cpp, which wants each 8 codes in nibble order) and the 5-to-8-bit kernel
// (int8_rows.cpp, which wants them in input order and the integer sums of each half group); the
// Q4_K kernel (q4k_rows.cpp) takes one scale a super-block of 256 instead, as llama.cpp's q8_K.
//
// AVX2 code in every build: the codes round to nearest even and are whole numbers, so their sums
// are exact in any order, and the maximum is exact in any order too. A row's codes, scales and
// sums depend on that row alone: the kernels' batch invariance starts here.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace mohawk {

constexpr int kActivationGroup = 32;

inline float horizontal_sum(__m256 v) {
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// The largest |x| of a group of 32 activations (exact in any order).
inline float group_max(const float* x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x)), _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8))),
                                  _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + 16)), _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 24))));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}

// A group of 32 activations' int8 codes q[k] = round(x[k] · inverse) (to nearest even); with
// kNibbleOrder each block of 8 codes is stored q0 q2 q4 q6 q1 q3 q5 q7 (the 4-bit kernels' word
// holds inputs 2i and 2i + 1 in byte i's low and high nibble), else in input order. `first` and
// `second` get the sums of codes 0-15 and 16-31: whole numbers, exact in any order.
template <bool kNibbleOrder>
inline void group_codes(const float* x, float inverse_scale, int8_t* q, float* first, float* second) {
  const __m256 inverse = _mm256_set1_ps(inverse_scale);
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m256 ra = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x), inverse), kNearest),
               rb = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8), inverse), kNearest),
               rc = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 16), inverse), kNearest),
               re = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 24), inverse), kNearest);
  *first = horizontal_sum(_mm256_add_ps(ra, rb));
  *second = horizontal_sum(_mm256_add_ps(rc, re));
  const __m256i ab = _mm256_packs_epi32(_mm256_cvtps_epi32(ra), _mm256_cvtps_epi32(rb));
  const __m256i ce = _mm256_packs_epi32(_mm256_cvtps_epi32(rc), _mm256_cvtps_epi32(re));
  // bytes: a0-3 b0-3 c0-3 e0-3 | a4-7 b4-7 c4-7 e4-7 -> input order
  __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, ce), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  if constexpr (kNibbleOrder)
    bytes = _mm256_shuffle_epi8(bytes, _mm256_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15, 0, 2, 4,
                                                        6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), bytes);
}

// One group of 32 activations -> its int8 codes, d and s (`group_codes`); `halves`, where not
// null, gets the integer sums of codes 0-15 and 16-31.
template <bool kNibbleOrder>
inline void quantize_group(const float* x, int8_t* q, float* d, float* s, int32_t* halves) {
  const float scale = group_max(x) / 127.f;
  float first, second;
  group_codes<kNibbleOrder>(x, scale > 0.f ? 1.f / scale : 0.f, q, &first, &second);
  *d = scale;
  *s = scale * (first + second);  // whole numbers below 2^12: exact, as any order of summing them
  if (halves != nullptr) {
    halves[0] = static_cast<int32_t>(first);
    halves[1] = static_cast<int32_t>(second);
  }
}

// A super-block of 256 activations quantized as llama.cpp's q8_K quantizes them for its K-quant dot
// products: one d = max|x| / 127 for all 256, codes in nibble order (`group_codes`), and each pair
// of groups' integer sums (|sum| <= 32 · 127) packed as int16s into an int32: group 2p's in the low
// half, 2p + 1's in the high (the K-quant kernel's vpmaddwd operand, q4k_rows.cpp).
inline void quantize_superblock(const float* x, int8_t* q, float* d, int32_t* pair_sums) {
  float amax = 0.f;
  for (int g = 0; g < 8; ++g) amax = std::max(amax, group_max(x + g * kActivationGroup));
  const float scale = amax / 127.f, inverse = scale > 0.f ? 1.f / scale : 0.f;
  *d = scale;
  for (int p = 0; p < 4; ++p) {
    int32_t sums[2];
    for (int h = 0; h < 2; ++h) {
      const int g = 2 * p + h;
      float first, second;
      group_codes<true>(x + g * kActivationGroup, inverse, q + g * kActivationGroup, &first, &second);
      sums[h] = static_cast<int32_t>(first + second);
    }
    pair_sums[p] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(sums[0])) |
                                        (static_cast<uint32_t>(static_cast<uint16_t>(sums[1])) << 16));
  }
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

namespace mohawk {

// Row m's codes q [M, K] (nibble order), super-block scales d [M, K/256] and pair sums [M, K/64]
// (`quantize_superblock`); each row alone.
inline void quantize_rows_superblocks(const float* x, int64_t M, int64_t K, int8_t* q, float* d, int32_t* pair_sums,
                                      int num_threads) {
  const int64_t S = K / 256;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (M * K >= 65536)
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < S; ++b)
      quantize_superblock(x + m * K + b * 256, q + m * K + b * 256, d + m * S + b, pair_sums + (m * S + b) * 4);
}

}  // namespace mohawk

// The vector types and operations the matmul kernels (int4_rows.cpp, int8_rows.cpp) write their
// tiles in: 16 lanes of 32 bits on AVX-512, 8 on AVX2, chosen by the build's flags. Loads of code
// words and fp16 tables are aligned (the Python side packs into torch's 64-byte aligned memory).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace mohawk::lanes {

#ifdef __AVX512F__
using Int = __m512i;
using Float = __m512;
constexpr int kLanes = 16;
inline Int load_codes(const uint32_t* p) { return _mm512_load_si512(p); }
inline void store_codes(uint32_t* p, Int v) { _mm512_store_si512(p, v); }
inline Int broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}
inline Int zero_int() { return _mm512_setzero_si512(); }
inline Int set_int(int32_t v) { return _mm512_set1_epi32(v); }
inline Int add_int(Int a, Int b) { return _mm512_add_epi32(a, b); }
inline Int sub_int(Int a, Int b) { return _mm512_sub_epi32(a, b); }
// kLanes int8 values, sign-extended to a lane each
inline Int widen_int8(const int8_t* p) { return _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(p))); }
inline Float to_float(Int v) { return _mm512_cvtepi32_ps(v); }
inline Float zero_float() { return _mm512_setzero_ps(); }
inline Float broadcast(float v) { return _mm512_set1_ps(v); }
inline Float half_to_float(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p)));
}
inline Float mul(Float a, Float b) { return _mm512_mul_ps(a, b); }
inline Float fma(Float a, Float b, Float c) { return _mm512_fmadd_ps(a, b, c); }
inline void store(float* p, Float v) { _mm512_storeu_ps(p, v); }
#else
using Int = __m256i;
using Float = __m256;
constexpr int kLanes = 8;
inline Int load_codes(const uint32_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
inline void store_codes(uint32_t* p, Int v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); }
inline Int broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}
inline Int zero_int() { return _mm256_setzero_si256(); }
inline Int set_int(int32_t v) { return _mm256_set1_epi32(v); }
inline Int add_int(Int a, Int b) { return _mm256_add_epi32(a, b); }
inline Int sub_int(Int a, Int b) { return _mm256_sub_epi32(a, b); }
inline Int widen_int8(const int8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline Float to_float(Int v) { return _mm256_cvtepi32_ps(v); }
inline Float zero_float() { return _mm256_setzero_ps(); }
inline Float broadcast(float v) { return _mm256_set1_ps(v); }
inline Float half_to_float(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
}
inline Float mul(Float a, Float b) { return _mm256_mul_ps(a, b); }
inline Float fma(Float a, Float b, Float c) { return _mm256_fmadd_ps(a, b, c); }
inline void store(float* p, Float v) { _mm256_storeu_ps(p, v); }
#endif

constexpr int kPerBlock = 16 / kLanes;  // registers a column block of 16 takes

// Integer products without VNNI: vpmaddubsw gives an int16 lane the sum of two products of an
// unsigned code and a signed activation; the kernels add such pairs in int16 lanes for as many
// inputs as cannot saturate, then widen them once (vpmaddwd) rather than every 4 inputs.
#ifdef __AVX512F__
inline Int pair_products(Int codes, Int q) { return _mm512_maddubs_epi16(codes, q); }
inline Int add_int16(Int a, Int b) { return _mm512_add_epi16(a, b); }
// per int32 lane, the sum of its two int16 lanes times `weight`
inline Int widen_pairs(Int pairs, int16_t weight) { return _mm512_madd_epi16(pairs, _mm512_set1_epi16(weight)); }
inline Int low_nibbles(Int w) { return _mm512_and_si512(w, _mm512_set1_epi8(0x0F)); }
inline Int high_nibbles(Int w) { return _mm512_and_si512(_mm512_srli_epi32(w, 4), _mm512_set1_epi8(0x0F)); }
#else
inline Int pair_products(Int codes, Int q) { return _mm256_maddubs_epi16(codes, q); }
inline Int add_int16(Int a, Int b) { return _mm256_add_epi16(a, b); }
inline Int widen_pairs(Int pairs, int16_t weight) { return _mm256_madd_epi16(pairs, _mm256_set1_epi16(weight)); }
inline Int low_nibbles(Int w) { return _mm256_and_si256(w, _mm256_set1_epi8(0x0F)); }
inline Int high_nibbles(Int w) { return _mm256_and_si256(_mm256_srli_epi32(w, 4), _mm256_set1_epi8(0x0F)); }
#endif

// Q6_K's codes held in 6 bits (int8_rows.cpp's layout): `low` a code word's low 4 bits a byte (the
// low or high nibbles of its nibble word), `highs` the word whose bytes hold their top 2 bits at
// bits 2t and 2t + 1: the code word, a byte a code as the byte layout holds it.
#ifdef __AVX512F__
inline Int six_bit_codes(Int low, Int highs, int t) {
  const Int placed = t == 0   ? _mm512_slli_epi32(highs, 4)
                     : t == 1 ? _mm512_slli_epi32(highs, 2)
                     : t == 2 ? highs
                              : _mm512_srli_epi32(highs, 2);
  return _mm512_ternarylogic_epi32(placed, _mm512_set1_epi8(0x30), low, 0xEA);  // (placed & 0x30) | low
}
#else
inline Int six_bit_codes(Int low, Int highs, int t) {
  const Int placed = t == 0   ? _mm256_slli_epi32(highs, 4)
                     : t == 1 ? _mm256_slli_epi32(highs, 2)
                     : t == 2 ? highs
                              : _mm256_srli_epi32(highs, 2);
  return _mm256_or_si256(_mm256_and_si256(placed, _mm256_set1_epi8(0x30)), low);
}
#endif

// A register the compiler must hold as it is here: without it GCC reassociates a run of int16 adds,
// computes all of a group's products first and spills them (measured slower than widening each).
inline Int kept(Int v) {
  asm("" : "+v"(v));  // any vector register: ymm on AVX2, zmm on AVX-512
  return v;
}

// A group's dot products are summed in a "partial" register a lane each: with VNNI, int32 lanes
// (vpdpbusd); without, int16 lanes that vpmaddubsw's pairs are added into across the whole group
// and widened once at its end (vpmaddwd), not once every 8 inputs: each int16 lane then holds 16
// products of a code (<= 15) and an activation (|q| <= 127), at most 16 * 15 * 127 = 30480 <
// 32767 in magnitude, so neither the pairs nor their sums saturate and the group's integer dot
// product is the same as vpdpbusd's. Per group and row, 13 instructions instead of 20 on AVX2.
// partial + per lane, its codes times the activations, 8 inputs (lo: the first 4, hi: the last)
inline Int dot2(Int partial, Int lo, Int qlo, Int hi, Int qhi) {
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(partial, lo, qlo), hi, qhi);
#else
  return kept(add_int16(partial, add_int16(pair_products(lo, qlo), pair_products(hi, qhi))));
#endif
}

// a group's partial -> its int32 dot products, a lane per column
inline Int group_dot(Int partial) {
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
  return partial;
#else
  return widen_pairs(partial, 1);
#endif
}

// Group g's integer dot products for R rows of int8 activations (q, K a row, each 8 in nibble order)
// and V column vectors of 4-bit codes (words as int4_rows.cpp lays them out, `cstride` words a
// column block): acc[r][v] as dot2 leaves it (VNNI's int32 lanes, else int16 pairs). Shared by the
// group-scaled 4-bit kernel and the Q4_K one (q4k_rows.cpp).
template <int R, int V>
__attribute__((always_inline)) inline void nibble_group_dots(Int (&acc)[R][V], const int8_t* __restrict q, int64_t K,
                                                             int64_t g, const uint32_t* __restrict codes,
                                                             int64_t cstride) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) acc[r][v] = zero_int();
#pragma GCC unroll 4
  for (int kb = 0; kb < 4; ++kb) {
    const int64_t word = (g * 4 + kb) * 16;
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) {
      const Int w = load_codes(codes + (v / kPerBlock) * cstride + word + (v % kPerBlock) * kLanes);
      const Int lo = low_nibbles(w), hi = high_nibbles(w);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const int8_t* qk = q + r * K + g * 32 + kb * 8;
        acc[r][v] = dot2(acc[r][v], lo, broadcast4(qk), hi, broadcast4(qk + 4));
      }
    }
  }
}

// Helpers of the K-quant 4-bit kernel (q4k_rows.cpp): its 6-bit scales and minimums as int16 pairs
// for vpmaddwd, int32 lanes multiplied (low 32 bits), and c - a·b.
#ifdef __AVX512F__
// kLanes bytes p[c] -> lane c holds the int16 pair (p[c], p[c])
inline Int scale_pairs(const uint8_t* p) {
  const Int mask = _mm512_set_epi32(0x800F800F, 0x800E800E, 0x800D800D, 0x800C800C, 0x800B800B, 0x800A800A,
                                    0x80098009, 0x80088008, 0x80078007, 0x80068006, 0x80058005, 0x80048004,
                                    0x80038003, 0x80028002, 0x80018001, 0x80008000);
  // every 128-bit lane holds the 16 bytes; lane j picks columns 4j..4j + 3 (vpshufb zeroes 0x80's)
  return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), mask);
}
// 2 · kLanes bytes, lane c's pair at p[2c], p[2c + 1] -> lane c holds the int16 pair
inline Int byte_pairs(const uint8_t* p) {
  return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline Int widen_uint8(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline Int mul_int(Int a, Int b) { return _mm512_mullo_epi32(a, b); }
inline Int pair_dot(Int a, Int b) { return _mm512_madd_epi16(a, b); }
inline Float fnma(Float a, Float b, Float c) { return _mm512_fnmadd_ps(a, b, c); }
inline Float load_float(const float* p) { return _mm512_loadu_ps(p); }
#else
inline Int scale_pairs(const uint8_t* p) {
  const Int mask = _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,  // each 128-bit half
                                    4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1);  // of the 8 bytes
  int64_t eight;
  std::memcpy(&eight, p, 8);
  return _mm256_shuffle_epi8(_mm256_set1_epi64x(eight), mask);
}
inline Int byte_pairs(const uint8_t* p) {
  return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline Int widen_uint8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline Int mul_int(Int a, Int b) { return _mm256_mullo_epi32(a, b); }
inline Int pair_dot(Int a, Int b) { return _mm256_madd_epi16(a, b); }
inline Float fnma(Float a, Float b, Float c) { return _mm256_fnmadd_ps(a, b, c); }
inline Float load_float(const float* p) { return _mm256_loadu_ps(p); }
#endif

}  // namespace mohawk::lanes

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

}  // namespace mohawk::lanes

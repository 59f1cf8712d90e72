// A CPU 4-bit groupwise matmul over blocks of rows: fp32 activations in, fp32 out, AVX2 + FMA.
// Built and loaded by int4_rows.py (plain C ABI: no torch headers, a few seconds to compile).
//
// Batch invariant by construction: every output (m, n) is the same sequence of fp32 operations
// whatever the number of rows M, wherever row m sits in the call and however many threads run,
// so a row's bits never depend on the other rows of its step (see tile()).
//
// Weight layout (int4_rows.py `pack`, once at load):
//   N a multiple of 16 (a column block); threads take superblocks of up to SB = 4 blocks
//   codes  uint32 [NB, K/8, 16]   NB = N/16; word [b][kb][c] holds 8 nibbles,
//                                 nibble j = code[b*16 + c][kb*8 + j]
//   scales fp16   [NB, G, 16]     G = K/32 (GGUF's own scales are fp16: exact)
//   mins   fp16   [NB, G, 16]
// y[m, n] = sum_g scale[g,n] * (sum_{k in g} x[m,k] * code[n,k]) + min[g,n] * (sum_{k in g} x[m,k])
#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {

constexpr int GS = 32;  // group size: GGUF Q4_0, Q4_1 and the K-quants' sub-blocks
constexpr int SB = 4;   // column blocks (of 16) per superblock: a thread's unit of work

// R rows x CB column blocks of 16. Per (row, column), for each group g in order:
//   acc = 0; for k in the group in order: acc = fma(xs[k], w[k], acc);
//   t = (g == 0 ? 0 : t); t = fma(acc, scale, t); t = fma(xsum_g, min, t).
// Nothing depends on R, CB or the row's position, so the result is the same bits for any M.
// xs[k] = x[k] * 2^-(4*(k%8)) (exact) and w[k] = code * 2^(4*(k%8)) (exact: the nibble masked in
// place), so xs[k] * w[k] == x[k] * code exactly (barring a subnormal xs, below 2^-102 or so).
template <int R, int CB>
inline void tile(const float* __restrict xs, const float* __restrict xsum, int64_t K, int64_t G,
                 const uint32_t* __restrict codes, const uint16_t* __restrict sc,
                 const uint16_t* __restrict mn, float* y, int64_t ldy) {
  constexpr bool kFloatTrick = R == 1;  // one row: the convert unit is the bottleneck
  constexpr int V = 2 * CB;
  const int64_t cstride = (K / 8) * 16, sstride = G * 16;
  for (int64_t g = 0; g < G; ++g) {
    __m256 acc[R][V];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int kb = 0; kb < 4; ++kb) {
      __m256i cv[V];
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v)
        cv[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(
            codes + (v / 2) * cstride + (g * 4 + kb) * 16 + (v % 2) * 8));
      const float* xk = xs + g * GS + kb * 8;
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        __m256 w[V];
#pragma GCC unroll 16
        for (int v = 0; v < V; ++v) {
          if (kFloatTrick && j < 5) {
            // 2^23 + code*16^j as float bits (the nibble lies inside the mantissa), minus 2^23:
            // the same exact value code*16^j as the conversion below, without the convert unit
            __m256i q = _mm256_or_si256(_mm256_and_si256(cv[v], _mm256_set1_epi32(0xF << (4 * j))),
                                        _mm256_set1_epi32(0x4B000000));
            w[v] = _mm256_sub_ps(_mm256_castsi256_ps(q), _mm256_set1_ps(8388608.f));
          } else {
            __m256i q = j < 7 ? _mm256_and_si256(cv[v], _mm256_set1_epi32(0xF << (4 * j)))
                              : _mm256_srli_epi32(cv[v], 28);
            w[v] = _mm256_cvtepi32_ps(q);
          }
        }
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          __m256 xb = _mm256_broadcast_ss(xk + r * K + j);
#pragma GCC unroll 16
          for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(xb, w[v], acc[r][v]);
        }
      }
    }
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) {
      const int64_t at = (v / 2) * sstride + g * 16 + (v % 2) * 8;
      const __m256 s = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(sc + at)));
      const __m256 m = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(mn + at)));
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        float* yp = y + r * ldy + v * 8;
        __m256 t = g == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(yp);
        t = _mm256_fmadd_ps(acc[r][v], s, t);
        t = _mm256_fmadd_ps(_mm256_broadcast_ss(xsum + r * G + g), m, t);
        _mm256_storeu_ps(yp, t);
      }
    }
  }
}

#ifdef __AVX512F__
// The same arithmetic as tile() with 16 columns a register: per (row, column) the same fp32
// operations in the same order, so the AVX-512 build gives the AVX2 build's bits.
template <int R, int CB>
inline void tile512(const float* __restrict xs, const float* __restrict xsum, int64_t K, int64_t G,
                    const uint32_t* __restrict codes, const uint16_t* __restrict sc,
                    const uint16_t* __restrict mn, float* y, int64_t ldy) {
  // few rows: the unpacking is the bottleneck, so each nibble becomes its weight by one lookup
  // (vpermps reads an index's low 4 bits) in a table of code * 16^j, the exact value below
  constexpr bool kLookup = R <= 2;
  __m512 table[8];
  for (int j = 0; j < 8; ++j) {
    const float step = j < 7 ? static_cast<float>(1 << (4 * j)) : 1.0f;
    table[j] = _mm512_mul_ps(_mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                             _mm512_set1_ps(step));
  }
  const int64_t cstride = (K / 8) * 16, sstride = G * 16;
  for (int64_t g = 0; g < G; ++g) {
    __m512 acc[R][CB];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < CB; ++v) acc[r][v] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int kb = 0; kb < 4; ++kb) {
      __m512i cv[CB];
#pragma GCC unroll 16
      for (int v = 0; v < CB; ++v) cv[v] = _mm512_load_si512(codes + v * cstride + (g * 4 + kb) * 16);
      const float* xk = xs + g * GS + kb * 8;
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        __m512 w[CB];
#pragma GCC unroll 16
        for (int v = 0; v < CB; ++v) {
          if (kLookup) {
            w[v] = _mm512_permutexvar_ps(j == 0 ? cv[v] : _mm512_srli_epi32(cv[v], 4 * j), table[j]);
          } else {
            __m512i q = j < 7 ? _mm512_and_si512(cv[v], _mm512_set1_epi32(0xF << (4 * j)))
                              : _mm512_srli_epi32(cv[v], 28);
            w[v] = _mm512_cvtepi32_ps(q);
          }
        }
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          __m512 xb = _mm512_set1_ps(xk[r * K + j]);
#pragma GCC unroll 16
          for (int v = 0; v < CB; ++v) acc[r][v] = _mm512_fmadd_ps(xb, w[v], acc[r][v]);
        }
      }
    }
#pragma GCC unroll 16
    for (int v = 0; v < CB; ++v) {
      const int64_t at = v * sstride + g * 16;
      const __m512 s = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(sc + at)));
      const __m512 m = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(mn + at)));
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        float* yp = y + r * ldy + v * 16;
        __m512 t = g == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(yp);
        t = _mm512_fmadd_ps(acc[r][v], s, t);
        t = _mm512_fmadd_ps(_mm512_set1_ps(xsum[r * G + g]), m, t);
        _mm512_storeu_ps(yp, t);
      }
    }
  }
}
#endif

#ifdef __AVX512F__
#define MOHAWK_TILE tile512
// rows a tall tile takes, and column blocks a tile of R rows takes at once (index R): as many
// accumulators as the registers hold (32 of 16 floats; AVX2 has 16 of 8)
constexpr int kTallRows = 8, kTallBlocks = 2;
constexpr int kBlocksOf[5] = {0, 4, 4, 4, 4};
#else
#define MOHAWK_TILE tile
constexpr int kTallRows = 5, kTallBlocks = 1;
constexpr int kBlocksOf[5] = {0, 4, 2, 1, 1};
#endif

// One superblock (`blocks` column blocks of 16, SB of them but at the end of N) for R rows, CB
// blocks at a time where it is whole, one at a time where it is not.
template <int R, int CB>
inline void superblock(const float* xs, const float* xsum, int64_t K, int64_t G,
                       const uint32_t* codes, const uint16_t* sc, const uint16_t* mn, float* y,
                       int64_t ldy, int64_t blocks) {
  const int64_t cstride = (K / 8) * 16, sstride = G * 16;
  if (blocks == SB) {
    for (int b = 0; b < SB; b += CB)
      MOHAWK_TILE<R, CB>(xs, xsum, K, G, codes + b * cstride, sc + b * sstride, mn + b * sstride,
                         y + b * 16, ldy);
  } else {
    for (int64_t b = 0; b < blocks; ++b)
      MOHAWK_TILE<R, 1>(xs, xsum, K, G, codes + b * cstride, sc + b * sstride, mn + b * sstride,
                        y + b * 16, ldy);
  }
}

}  // namespace

extern "C" {

// The layout version int4_rows.py packs for; it refuses a library that answers otherwise.
int mohawk_int4_rows_version() { return 2; }

// y [M, N] = x [M, K] times the packed weight; K a multiple of 32, N of 16.
void mohawk_int4_rows_mm(const float* x, int64_t M, int64_t K, const uint32_t* codes,
                         const uint16_t* scales, const uint16_t* mins, int64_t N, float* y,
                         int num_threads) {
  const int64_t G = K / GS, NB = N / 16, NS = (NB + SB - 1) / SB;
  // per row alone, in a fixed order: pre-scaled activations and each group's sum
  float* xs = static_cast<float*>(std::aligned_alloc(64, ((M * K + M * G) * 4 + 63) / 64 * 64));
  float* xsum = xs + M * K;
  static const float kPow[8] = {1.f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f, 0x1p-24f, 1.f};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      float s = 0.f;
      for (int k = 0; k < GS; ++k) {
        const float v = x[m * K + g * GS + k];
        s += v;
        xs[m * K + g * GS + k] = v * kPow[k % 8];
      }
      xsum[m * G + g] = s;
    }
  const int64_t cstride = (K / 8) * 16, sstride = G * 16;
  // threads split the columns, never a reduction: the same bits on any number of threads
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t s = 0; s < NS; ++s) {
    const uint32_t* c = codes + s * SB * cstride;
    const uint16_t* sc = scales + s * SB * sstride;
    const uint16_t* mn = mins + s * SB * sstride;
    float* ys = y + s * SB * 16;
    const int64_t blocks = NB - s * SB < SB ? NB - s * SB : SB;
    int64_t m = 0;
    // tiles of the most rows that fit the registers, then the rest in one smaller tile: the
    // per-row arithmetic of every tile shape is the same (tile())
    for (; m + kTallRows <= M; m += kTallRows)
      superblock<kTallRows, kTallBlocks>(xs + m * K, xsum + m * G, K, G, c, sc, mn, ys + m * N, N, blocks);
    for (; m + 4 <= M; m += 4)
      superblock<4, kBlocksOf[4]>(xs + m * K, xsum + m * G, K, G, c, sc, mn, ys + m * N, N, blocks);
    const float* xr = xs + m * K;
    const float* xsr = xsum + m * G;
    float* yr = ys + m * N;
    switch (M - m) {
      case 1: superblock<1, kBlocksOf[1]>(xr, xsr, K, G, c, sc, mn, yr, N, blocks); break;
      case 2: superblock<2, kBlocksOf[2]>(xr, xsr, K, G, c, sc, mn, yr, N, blocks); break;
      case 3: superblock<3, kBlocksOf[3]>(xr, xsr, K, G, c, sc, mn, yr, N, blocks); break;
      default: break;
    }
  }
  std::free(xs);
}

}  // extern "C"

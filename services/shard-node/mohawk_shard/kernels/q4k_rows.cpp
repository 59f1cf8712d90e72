// A CPU matmul over Q4_K weights held as the file holds them: 4-bit codes, each group of 32's 6-bit
// scale and minimum as integers, each super-block of 256's fp16 d and dmin (w = d·sc·code −
// dmin·m). fp32 activations in, quantized a row's super-block of 256 at a time to int8 (llama.cpp's
// q8_K), fp32 out. Built and loaded by q4k_rows.py.
//
// Design. The group-scaled 4-bit kernel (int4_rows.cpp) applies each group's scales in fp32: per
// row, column and group a convert, a multiply and two FMAs beside the integer dot products, which
// share their pipes. Here the whole super-block stays in integers, as llama.cpp's
// `vec_dot_q4_K_q8_K` keeps it: a group's dot product is multiplied by the group's 6-bit scale in
// int32 (without VNNI the int16 pairs vpmaddubsw leaves are widened by vpmaddwd against the scale
// instead of against 1, so the multiply is free), the minimums' term is the activations' group
// sums times the 6-bit minimums (vpmaddwd over pairs of groups), and fp32 comes in once a
// super-block. On a Zen 3 (AVX2), paired timings of the 1.7B's gate/up and qkv shapes at 32 rows:
// 1.07-1.10x the group-scaled kernel (dropping its fp32 epilogue altogether, the bound, 1.26-1.28x);
// at 1 row, with fewer bytes to read, 1.01-1.09x; at 256 rows 1.11-1.12x.
//
// Batch invariant by construction: a row's codes, its super-block scales and group sums depend on
// that row alone; the integer sums are exact whatever order sums them (|isum| <= 8 · 32 · 15 · 127 ·
// 63 < 2^31, |imin| <= 8 · 32 · 127 · 63); and every output (m, n) gets the same sequence of fp32
// operations whatever M, the row's place in the call, the thread count and the instruction set:
//   for each super-block S in order: t = float(isum) · d[S, n]; t = t − float(imin) · dmin[S, n];
//                                    y = fma(da[m, S], t, y)          (y starts at 0)
//
// Weight layout (repack_blocks.cpp, layout 5, once at load):
//   codes  uint32 [NB, K/8, 16]   as int4_rows.cpp's: NB = N/16, word [b][kb][c] holds 8 nibbles
//   subs   uint8  [NB, G/2, 64]   G = K/32: per pair of groups (2p, 2p + 1), the 16 columns' 6-bit
//                                 scales of group 2p, then of 2p + 1, then their minimums in pairs:
//                                 byte 32 + 2c + h = m[2p + h][c]
//   supers fp16   [NB, K/256, 32] per super-block, 16 columns' d, then their dmin (the file's bits)
// 0.578 bytes a weight, against 0.5625 in the file and 0.625 in the group-scaled layout.
#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <cstdlib>

#include "fetch_ahead.h"
#include "int8_activations.h"
#include "simd_lanes.h"
#include "unit_ranges.h"

namespace {

constexpr int GS = 32;  // a group: Q4_K's sub-block
constexpr int SG = 8;   // groups a super-block
constexpr int SB = 4;   // column blocks (of 16) per superblock of columns: a thread's unit of work

using namespace mohawk::lanes;

// a group's dot products (dot2's partial: VNNI's int32 lanes, else int16 pairs) times each column's
// 6-bit scale (kLanes bytes at p), as int32 lanes
inline Int scaled(Int partial, const uint8_t* p) {
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
  return mul_int(partial, widen_uint8(p));
#else
  return pair_dot(partial, scale_pairs(p));  // both int16s of the pair times the scale
#endif
}

// R rows x CB column blocks of 16 over all of K. A super-block's integer sums stay in registers; the
// minimums' term is summed after its groups, and y itself accumulates the fp32 outputs (touched once
// a super-block: in registers they spilled on AVX2, measured slower).
template <int R, int CB>
inline void tile(const int8_t* __restrict q, const float* __restrict da, const int32_t* __restrict pairs, int64_t K,
                 const uint32_t* __restrict codes, const uint8_t* __restrict subs, const uint16_t* __restrict supers,
                 float* y, int64_t ldy, mohawk::Spread ahead) {
  constexpr int V = CB * kPerBlock;
  const int64_t S = K / 256, G = K / GS;
  const int64_t cstride = (K / 8) * 16, gstride = G * 32, sstride = S * 32;
  for (int64_t sb = 0; sb < S; ++sb) {
    Int isum[R][V];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) isum[r][v] = zero_int();
    for (int gl = 0; gl < SG; ++gl) {
      const int64_t g = sb * SG + gl;
      if (ahead.fetches(g)) {  // these columns' group g in the next superblock of columns
#pragma GCC unroll 4
        for (int b = SB; b < SB + CB; ++b) {
          mohawk::fetch_lines(codes + b * cstride + g * 64, 256);
          if (g % 2 == 0) mohawk::fetch_lines(subs + b * gstride + g * 32, 64);  // a pair's line
          if (gl == 0) mohawk::fetch_lines(supers + b * sstride + sb * 32, 64);
        }
      }
      Int acc[R][V];
      nibble_group_dots<R, V>(acc, q, K, g, codes, cstride);
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) {
        const uint8_t* sc = subs + (v / kPerBlock) * gstride + (g / 2) * 64 + (g % 2) * 16 + (v % kPerBlock) * kLanes;
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) isum[r][v] = add_int(isum[r][v], scaled(acc[r][v], sc));
      }
    }
    // the minimums' term, two groups a vpmaddwd: int16 pairs (m[2p], m[2p + 1]) against the rows'
    // (sum[2p], sum[2p + 1])
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) {
      const uint8_t* m = subs + (v / kPerBlock) * gstride + sb * SG * 32 + 32 + (v % kPerBlock) * 2 * kLanes;
      const uint16_t* sup = supers + (v / kPerBlock) * sstride + sb * 32 + (v % kPerBlock) * kLanes;
      const Float d = half_to_float(sup), dmin = half_to_float(sup + 16);
      Int imin[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) imin[r] = zero_int();
#pragma GCC unroll 4
      for (int p = 0; p < SG / 2; ++p) {
        const Int mins = byte_pairs(m + p * 64);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) imin[r] = add_int(imin[r], pair_dot(mins, set_int(pairs[(r * S + sb) * 4 + p])));
      }
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const Float t = fnma(to_float(imin[r]), dmin, mul(to_float(isum[r][v]), d));
        float* at = y + r * ldy + v * kLanes;
        store(at, fma(broadcast(da[r * S + sb]), t, sb == 0 ? zero_float() : load_float(at)));
      }
    }
  }
}

// rows a tall tile takes and column blocks each tile shape takes (index R): integer partials and
// super-block sums, 2 * R * CB * kPerBlock registers, within the register file (32 on AVX-512, 16
// on AVX2) with room for the codes. On AVX2 three rows ran as fast as four (within the noise of
// paired timings) and spill less.
#ifdef __AVX512F__
constexpr int kTallRows = 4, kTallBlocks = 2;
constexpr int kBlocksOf[4] = {0, 4, 2, 2};
#else
constexpr int kTallRows = 3, kTallBlocks = 1;
constexpr int kBlocksOf[4] = {0, 2, 1, 1};
#endif

// One superblock of columns (`blocks` column blocks of 16, SB but at the end of N) for R rows.
template <int R, int CB>
inline void columns(const int8_t* q, const float* da, const int32_t* pairs, int64_t K, const uint32_t* codes,
                    const uint8_t* subs, const uint16_t* supers, float* y, int64_t ldy, int64_t blocks,
                    mohawk::Spread ahead) {
  const int64_t cstride = (K / 8) * 16, gstride = (K / GS) * 32, sstride = (K / 256) * 32;
  if (blocks == SB) {
    for (int b = 0; b < SB; b += CB)
      tile<R, CB>(q, da, pairs, K, codes + b * cstride, subs + b * gstride, supers + b * sstride, y + b * 16, ldy,
                  ahead);
  } else {
    for (int64_t b = 0; b < blocks; ++b)
      tile<R, 1>(q, da, pairs, K, codes + b * cstride, subs + b * gstride, supers + b * sstride, y + b * 16, ldy,
                 ahead);
  }
}

}  // namespace

extern "C" {

// y [M, N] = x [M, K] times the Q4_K weight in layout 5; K a multiple of 256, N of 16.
void mohawk_q4k_rows_mm(const float* x, int64_t M, int64_t K, const uint32_t* codes, const uint8_t* subs,
                        const uint16_t* supers, int64_t N, float* y, int num_threads) {
  const int64_t S = K / 256, NB = N / 16, NS = (NB + SB - 1) / SB;
  const size_t bytes = (static_cast<size_t>(M * K) + static_cast<size_t>(M * S) * 20 + 63) / 64 * 64;
  float* da = static_cast<float*>(std::aligned_alloc(64, bytes));
  int32_t* pairs = reinterpret_cast<int32_t*>(da + M * S);
  int8_t* q = reinterpret_cast<int8_t*>(pairs + M * S * 4);
  mohawk::quantize_rows_superblocks(x, M, K, q, da, pairs, num_threads);
  const int64_t cstride = (K / 8) * 16, gstride = (K / GS) * 32, sstride = S * 32;
  // threads split the columns, never a reduction: the same bits on any number of threads
  mohawk::for_each_unit(NS, num_threads, [&](int64_t b, bool has_next) {
    const uint32_t* c = codes + b * SB * cstride;
    const uint8_t* sub = subs + b * SB * gstride;
    const uint16_t* sup = supers + b * SB * sstride;
    float* ys = y + b * SB * 16;
    const int64_t blocks = NB - b * SB < SB ? NB - b * SB : SB;
    const int64_t passes = (M + kTallRows - 1) / kTallRows;
    int64_t m = 0;
    for (; m + kTallRows <= M; m += kTallRows)
      columns<kTallRows, kTallBlocks>(q + m * K, da + m * S, pairs + m * S * 4, K, c, sub, sup, ys + m * N, N, blocks,
                                      mohawk::Spread::of(m / kTallRows, passes, has_next));
    const int8_t* qr = q + m * K;
    const float* dr = da + m * S;
    const int32_t* pr = pairs + m * S * 4;
    float* yr = ys + m * N;
    const mohawk::Spread last = mohawk::Spread::of(m / kTallRows, passes, has_next);
    switch (M - m) {
      case 1: columns<1, kBlocksOf[1]>(qr, dr, pr, K, c, sub, sup, yr, N, blocks, last); break;
      case 2: columns<2, kBlocksOf[2]>(qr, dr, pr, K, c, sub, sup, yr, N, blocks, last); break;
      case 3: columns<3, kBlocksOf[3]>(qr, dr, pr, K, c, sub, sup, yr, N, blocks, last); break;
      default: break;
    }
  });
  std::free(da);
}

}  // extern "C"

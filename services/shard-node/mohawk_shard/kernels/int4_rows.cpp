// A CPU 4-bit groupwise matmul over blocks of rows: fp32 activations in, quantized per row and per
// group of 32 to int8 (as llama.cpp's q8 activations), integer dot products against the 4-bit
// codes (AVX-512 VNNI's vpdpbusd: 64 multiply-adds an instruction; vpmaddubsw + vpmaddwd where
// VNNI is missing), and an fp32 epilogue a group; fp32 out. Built and loaded by int4_rows.py.
//
// Batch invariant by construction: a row's int8 codes, its group scales and sums depend on that
// row alone; a group's integer dot product is exact whatever order or instructions sum it (at most
// 32 * 15 * 127 in magnitude); and the epilogue gives every output (m, n) the same sequence of fp32
// operations whatever the number of rows M, wherever row m sits in the call, however many threads
// run and whichever instruction set (AVX2, AVX-512, VNNI) the library was built for.
//
// Weight layout (int4_rows.py `pack`, once at load):
//   N a multiple of 16 (a column block); threads take superblocks of up to SB = 4 blocks
//   codes  uint32 [NB, K/8, 16]   NB = N/16; word [b][kb][c] holds 8 nibbles,
//                                 nibble j = code[b*16 + c][kb*8 + j]
//   scales fp16   [NB, G, 16]     G = K/32 (GGUF's own scales are fp16: exact)
//   mins   fp16   [NB, G, 16]
// Activations (quantize_rows, per call): per row m and group g, d = max|x| / 127 and
//   q[k] = round(x[k] / d) in [-127, 127], s = d * (sum of q[k]). A word's byte i holds
//   the codes of k = 2i (low nibble) and 2i + 1 (high nibble), so a block of 8 activations is
//   stored as q0 q2 q4 q6 q1 q3 q5 q7: the low nibbles meet the first four, the high the last.
// y[m, n] = sum over g in order of: t = fma(float(dot_g) * d[m,g], scale[g,n], t);
//                                   t = fma(s[m,g], min[g,n], t)           (t starts at 0)
#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "fetch_ahead.h"
#include "int8_activations.h"
#include "simd_lanes.h"
#include "unit_ranges.h"

namespace {

constexpr int GS = 32;  // group size: GGUF Q4_0, Q4_1 and the K-quants' sub-blocks
constexpr int SB = 4;   // column blocks (of 16) per superblock: a thread's unit of work

using namespace mohawk::lanes;

// R rows x CB column blocks of 16: V = CB * kPerBlock registers a row, each holding its integer
// dot products (a group) and its fp32 outputs (all groups) in registers. Per (row, column) the
// epilogue is the file header's, group by group in order: nothing depends on R, CB or the row's
// place in the call.
template <int R, int CB>
inline void tile(const int8_t* __restrict q, const float* __restrict d, const float* __restrict s, int64_t K,
                 int64_t G, const uint32_t* __restrict codes, const uint16_t* __restrict sc,
                 const uint16_t* __restrict mn, float* y, int64_t ldy, mohawk::Spread ahead) {
  constexpr int V = CB * kPerBlock;
  const int64_t cstride = (K / 8) * 16, sstride = G * 16;
  Float out[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) out[r][v] = zero_float();
  for (int64_t g = 0; g < G; ++g) {
    if (ahead.fetches(g)) {  // these columns' group g in the next superblock (fetch_ahead.h)
#pragma GCC unroll 4
      for (int b = SB; b < SB + CB; ++b) {
        mohawk::fetch_lines(codes + b * cstride + g * 64, 256);
        if (g % 2 == 0) {  // a line holds two groups' scales (or mins)
          mohawk::fetch_lines(sc + b * sstride + g * 16, 64);
          mohawk::fetch_lines(mn + b * sstride + g * 16, 64);
        }
      }
    }
    Int acc[R][V];
    nibble_group_dots<R, V>(acc, q, K, g, codes, cstride);
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) {
      const int64_t at = (v / kPerBlock) * sstride + g * 16 + (v % kPerBlock) * kLanes;
      const Float scale = half_to_float(sc + at), minimum = half_to_float(mn + at);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        out[r][v] = fma(mul(to_float(group_dot(acc[r][v])), broadcast(d[r * G + g])), scale, out[r][v]);
        out[r][v] = fma(broadcast(s[r * G + g]), minimum, out[r][v]);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) store(y + r * ldy + v * kLanes, out[r][v]);
}

// rows a tall tile takes, and column blocks a tile of R rows takes at once (index R): integer and
// fp32 accumulators, 2 * R * CB * kPerBlock registers, within the register file (32 on AVX-512,
// 16 on AVX2) with room for the codes and scales. On AVX2 four rows fill all 16 and spill a few,
// yet ran 131-141 GMAC/s at 32 rows on a Zen 3 against 116-119 for three (a scratch timing of
// the 1.7B's four layer shapes).
#ifdef __AVX512F__
constexpr int kTallRows = 4, kTallBlocks = 2;
constexpr int kBlocksOf[4] = {0, 4, 4, 2};
#else
constexpr int kTallRows = 4, kTallBlocks = 1;
constexpr int kBlocksOf[4] = {0, 2, 1, 1};
#endif

// One superblock (`blocks` column blocks of 16, SB of them but at the end of N) for R rows, CB
// blocks at a time where it is whole, one at a time where it is not; `ahead`: which of the next
// superblock's groups its tiles fetch (fetch_ahead.h).
template <int R, int CB>
inline void superblock(const int8_t* q, const float* d, const float* s, int64_t K, int64_t G, const uint32_t* codes,
                       const uint16_t* sc, const uint16_t* mn, float* y, int64_t ldy, int64_t blocks,
                       mohawk::Spread ahead) {
  const int64_t cstride = (K / 8) * 16, sstride = G * 16;
  if (blocks == SB) {
    for (int b = 0; b < SB; b += CB)
      tile<R, CB>(q, d, s, K, G, codes + b * cstride, sc + b * sstride, mn + b * sstride, y + b * 16, ldy, ahead);
  } else {
    for (int64_t b = 0; b < blocks; ++b)
      tile<R, 1>(q, d, s, K, G, codes + b * cstride, sc + b * sstride, mn + b * sstride, y + b * 16, ldy, ahead);
  }
}

}  // namespace

extern "C" {

// The layout version int4_rows.py packs for; it refuses a library that answers otherwise.
int mohawk_int4_rows_version() { return 2; }

// y [M, N] = x [M, K] times the packed weight; K a multiple of 32, N of 16.
void mohawk_int4_rows_mm(const float* x, int64_t M, int64_t K, const uint32_t* codes, const uint16_t* scales,
                         const uint16_t* mins, int64_t N, float* y, int num_threads) {
  const int64_t G = K / GS, NB = N / 16, NS = (NB + SB - 1) / SB;
  const size_t bytes = (static_cast<size_t>(M * K) + static_cast<size_t>(M * G) * 8 + 63) / 64 * 64;
  float* d = static_cast<float*>(std::aligned_alloc(64, bytes));
  float* s = d + M * G;
  int8_t* q = reinterpret_cast<int8_t*>(s + M * G);
  mohawk::quantize_rows<true>(x, M, K, q, d, s, nullptr, num_threads);
  const int64_t cstride = (K / 8) * 16, sstride = G * 16;
  // threads split the columns, never a reduction: the same bits on any number of threads
  mohawk::for_each_unit(NS, num_threads, [&](int64_t b, bool has_next) {
    const uint32_t* c = codes + b * SB * cstride;
    const uint16_t* sc = scales + b * SB * sstride;
    const uint16_t* mn = mins + b * SB * sstride;
    float* ys = y + b * SB * 16;
    const int64_t blocks = NB - b * SB < SB ? NB - b * SB : SB;
    const int64_t passes = (M + kTallRows - 1) / kTallRows;
    int64_t m = 0;
    // tiles of the most rows that fit the registers, then the rest in one smaller tile: the
    // per-row arithmetic of every tile shape is the same (tile())
    for (; m + kTallRows <= M; m += kTallRows)
      superblock<kTallRows, kTallBlocks>(q + m * K, d + m * G, s + m * G, K, G, c, sc, mn, ys + m * N, N, blocks,
                                         mohawk::Spread::of(m / kTallRows, passes, has_next));
    const int8_t* qr = q + m * K;
    const float* dr = d + m * G;
    const float* sr = s + m * G;
    float* yr = ys + m * N;
    const mohawk::Spread last = mohawk::Spread::of(m / kTallRows, passes, has_next);
    switch (M - m) {
      case 1: superblock<1, kBlocksOf[1]>(qr, dr, sr, K, G, c, sc, mn, yr, N, blocks, last); break;
      case 2: superblock<2, kBlocksOf[2]>(qr, dr, sr, K, G, c, sc, mn, yr, N, blocks, last); break;
      case 3: superblock<3, kBlocksOf[3]>(qr, dr, sr, K, G, c, sc, mn, yr, N, blocks, last); break;
      default: break;
    }
  });
  std::free(d);
}

}  // extern "C"

// A CPU groupwise matmul over GGUF's 5-, 6- and 8-bit codes (Q5_0, Q5_1, Q5_K, Q6_K, Q8_0), the
// 4-bit kernel's sibling: fp32 activations in, quantized per row and group of 32 to int8
// (int8_activations.h), integer dot products against the file's codes held a byte each (AVX-512
// VNNI's vpdpbusd; without VNNI, vpmaddubsw's pairs summed in int16 lanes for as many words as
// cannot saturate, `Format::run`, then widened by vpmaddwd), an fp32 epilogue a group; fp32 out.
// Built and loaded by library.py, packed and called by int8_rows.py.
//
// The codes are held unsigned, as stored or shifted up by `offset` (Q8_0's signed codes + 128,
// Q5_0's q as stored with offset 16, Q6_K's q with offset 32), so that an unsigned-by-signed
// instruction multiplies them; the offset is taken back in integers, from the activations'
// integer sums: sum((c - offset) * a) = sum(c * a) - offset * sum(a), exact. Q6_K's two half
// groups (its sub-blocks of 16) each keep their exact integer dot product, which meets its
// sub-block scale times the super-block scale (int8 times fp16: exact in fp32) in the epilogue.
// Every weight is the file's; nothing is unpacked to floats. (Multiplying the sub-block scales in
// integers, as llama.cpp's vec_dot_q6_K does, took two vpmulld a column vector and row: at 32
// rows the epilogue cost as much as the dot products, 151 GMAC/s against Q8_0's 211.)
//
// Batch invariant by construction, as int4_rows.cpp: a row's int8 codes and sums depend on that
// row alone; the integer dot products are exact whatever sums them (at most 2 * 128 * 16 * 32 *
// 127 < 2^24 in magnitude, so exact as floats too); and each output (m, n) gets the same sequence
// of fp32 operations whatever the number of rows, their place, the threads or the instruction set.
//
// Weight layout (int8_rows.py `pack`, once at load), N a multiple of 16, K of 32 (256 for Q6_K):
//   codes  uint32 [NB, K/4, 16]  NB = N/16; byte j of word [b][w][c] is the code of output
//                                b*16 + c and input w*4 + j
//          Q6_K: [NB, K/8 + K/16, 16], its codes in 6 bits (0.75 bytes a weight, the file's):
//                                first K/8 nibble words, byte j of word [b][p][c] holding input
//                                8p + j's low 4 bits low and 8p + 4 + j's high; then K/16 words
//                                of top bits, byte j of word [b][K/8 + h][c] holding those of
//                                inputs 16h + j, 16h + 4 + j, 16h + 8 + j, 16h + 12 + j at bits
//                                0-1, 2-3, 4-5, 6-7; the tile rebuilds a byte a code in registers
//                                (six_bit_codes), so the arithmetic is the byte layout's
//   scales fp16   [NB, G, 16]    G = K/32; Q6_K: [NB, K/256, 16], its super-block scales
//   mins   fp16   [NB, G, 16]    Q5_1, Q5_K only
//   subs   int8   [NB, K/16, 16] Q6_K only: the sub-block scales
// y[m, n] = sum over g in order of (t starts at 0):
//   without sub-block scales: t = fma(float(dot_g - offset * sum_g) * d[m,g], scale[g,n], t)
//                             t = fma(s[m,g], min[g,n], t)                          (with mins)
//   Q6_K, halves ' and '':    t = fma(fma(float(dot' - offset * sum'), sub'·super,
//                                         float(dot'' - offset * sum'') * sub''·super), d[m,g], t)
#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <cstdlib>

#include "fetch_ahead.h"
#include "int8_activations.h"
#include "simd_lanes.h"
#include "unit_ranges.h"

namespace {

using namespace mohawk::lanes;

constexpr int GS = mohawk::kActivationGroup;
constexpr int SB = 4;  // column blocks (of 16) per superblock: a thread's unit of work
constexpr int kWordsPerGroup = GS / 4;
constexpr int kGroupsPerSuper = 8;  // Q6_K: 256 inputs a super-block scale

// What a format asks of the tile: Q6_K's sub-block scales, Q5_1/Q5_K's minimums, Q8_0's 8 bits.
// Without VNNI, `run` is how many code words' pairs an int16 lane sums before it is widened: 2 a
// word's lane, so 2 * run products of a code and an activation (|q| <= 127) that must stay within
// 32767: Q6_K's codes reach 63 (2 words: 32004), Q5's 31 (4 words: 31496), and Q8_0's, split in
// nibbles of at most 15 (the high ones widened times 16), a whole group of 8 words (30480).
// kSix: Q6_K's codes read in 6 bits and rebuilt in registers (else a byte a code, as stored or as
// a first pass wrote them); kStore: that first pass, which also writes the rebuilt bytes out.
template <bool kSub, bool kMin, bool kWide, bool kSix = false, bool kStore = false>
struct Format {
  static constexpr bool sub = kSub, min = kMin, wide = kWide, six = kSix, store = kStore;
  static constexpr int run = kWide ? 8 : kSub ? 2 : 4;
};

struct Weight {  // one column block's tables; strides between column blocks
  const uint32_t* codes;
  const uint16_t* scales;
  const uint16_t* mins;
  const int8_t* subs;
  int64_t code_stride, scale_stride, table_stride, sub_stride;
  int32_t offset;
  int64_t highs;  // Q6_K in 6 bits: where a column block's top-bit words start (K/8 * 16); else 0

  Weight at(int64_t block) const {
    Weight w = *this;
    w.codes += block * code_stride;
    w.scales += block * scale_stride;
    if (mins != nullptr) w.mins += block * table_stride;
    if (subs != nullptr) w.subs += block * sub_stride;
    return w;
  }

  // this column block's lines of group g into L2: its codes, and every other group (a line
  // holds two groups' scales, mins or sub-block scales) the tables'
  void fetch(int64_t g) const {
    if (highs != 0) {  // Q6_K in 6 bits: a group's nibble words, then its top-bit words
      mohawk::fetch_lines(codes + g * (kWordsPerGroup / 2) * 16, kWordsPerGroup / 2 * 64);
      mohawk::fetch_lines(codes + highs + g * (kWordsPerGroup / 4) * 16, kWordsPerGroup / 4 * 64);
    } else {
      mohawk::fetch_lines(codes + g * kWordsPerGroup * 16, kWordsPerGroup * 64);
    }
    if (g % 2 != 0) return;
    mohawk::fetch_lines(scales + (subs != nullptr ? (g / kGroupsPerSuper) * 16 : g * 16), 64);
    if (mins != nullptr) mohawk::fetch_lines(mins + g * 16, 64);
    if (subs != nullptr) mohawk::fetch_lines(subs + 2 * g * 16, 64);
  }
};

struct Rows {  // quantized activations of the tile's first row
  const int8_t* q;
  const float* d;
  const float* s;
  const int32_t* halves;
  int64_t K, G;

  Rows at(int64_t m) const { return {q + m * K, d + m * G, s + m * G, halves + m * G * 2, K, G}; }
};

// R rows x CB column blocks of 16: V = CB * kPerBlock registers a row, each holding its integer
// dot products (a group, or a half group each with sub-block scales) and its fp32 outputs.
// `source`: the weight as held, whose next superblock the tile fetches (w itself, or what w's
// bytes were rebuilt from); `sink`: where a storing pass writes the bytes it rebuilds.
template <class F, int R, int CB>
inline void tile(const Rows& rows, const Weight& w, const Weight& source, const Weight& sink, float* y,
                 int64_t ldy, mohawk::Spread ahead) {
  constexpr int V = CB * kPerBlock;
  Float out[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) out[r][v] = zero_float();
  for (int64_t g = 0; g < rows.G; ++g) {
    if (ahead.fetches(g)) {  // these columns' group g in the next superblock (fetch_ahead.h)
#pragma GCC unroll 4
      for (int b = SB; b < SB + CB; ++b) source.at(b).fetch(g);
    }
    Int acc[R][V], second[R][V];  // second: the half group's, with sub-block scales
    Int pairs[R][V], high[R][V];  // without VNNI: int16 sums of a run's pairs (high: Q8_0's high nibbles)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) acc[r][v] = second[r][v] = pairs[r][v] = high[r][v] = zero_int();
#pragma GCC unroll 8
    for (int kw = 0; kw < kWordsPerGroup; ++kw) {
      const int64_t word = (g * kWordsPerGroup + kw) * 16;
      const bool later = F::sub && kw >= kWordsPerGroup / 2, opens = kw % F::run == 0,
                 closes = kw % F::run == F::run - 1;
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) {
        const uint32_t* column = w.codes + (v / kPerBlock) * w.code_stride + (v % kPerBlock) * kLanes;
        Int codes;
        if constexpr (F::six) {  // Q6_K's 6-bit layout: the code word rebuilt, a byte a code
          const int64_t at = g * kWordsPerGroup + kw;  // the code word's index along K
          const Int nibbles = load_codes(column + (at / 2) * 16);
          codes = six_bit_codes(at % 2 == 0 ? low_nibbles(nibbles) : high_nibbles(nibbles),
                                load_codes(column + w.highs + (at / 4) * 16), static_cast<int>(at % 4));
          if constexpr (F::store)
            store_codes(const_cast<uint32_t*>(sink.codes) + (v / kPerBlock) * sink.code_stride + word +
                            (v % kPerBlock) * kLanes,
                        codes);
        } else {
          codes = load_codes(column + word);
        }
#if !(defined(__AVX512F__) && defined(__AVX512VNNI__))
        const Int low = low_nibbles(codes), upper = high_nibbles(codes);  // Q8_0's, once for every row
#endif
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const Int q = broadcast4(rows.q + r * rows.K + g * GS + kw * 4);
          Int& target = later ? second[r][v] : acc[r][v];
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
          // per 32-bit lane, the sum of its four u8 codes times the four s8 activations, exact
          target = _mm512_dpbusd_epi32(target, codes, q);
#else
          if constexpr (F::wide) {
            const Int lo = pair_products(low, q), hi = pair_products(upper, q);
            pairs[r][v] = kept(opens ? lo : add_int16(pairs[r][v], lo));
            high[r][v] = kept(opens ? hi : add_int16(high[r][v], hi));
            if (closes) target = add_int(target, add_int(widen_pairs(pairs[r][v], 1), widen_pairs(high[r][v], 16)));
          } else {
            const Int products = pair_products(codes, q);
            pairs[r][v] = kept(opens ? products : add_int16(pairs[r][v], products));
            if (closes) target = add_int(target, widen_pairs(pairs[r][v], 1));
          }
#endif
        }
      }
    }
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) {
      const int64_t lane = (v % kPerBlock) * kLanes, block = v / kPerBlock;
      const int64_t at = block * w.table_stride + g * 16 + lane;
      if constexpr (F::sub) {  // Q6_K: each half group's float scale sc·d, exact in fp32
        const Float super = half_to_float(w.scales + block * w.scale_stride + (g / kGroupsPerSuper) * 16 + lane);
        const int8_t* subs = w.subs + block * w.sub_stride + (2 * g) * 16 + lane;
        const Float scale_first = mul(to_float(widen_int8(subs)), super),
                    scale_second = mul(to_float(widen_int8(subs + 16)), super);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const int32_t* halves = rows.halves + (r * rows.G + g) * 2;
          const Float first = to_float(sub_int(acc[r][v], set_int(w.offset * halves[0]))),
                      later = to_float(sub_int(second[r][v], set_int(w.offset * halves[1])));
          out[r][v] = fma(fma(first, scale_first, mul(later, scale_second)), broadcast(rows.d[r * rows.G + g]),
                          out[r][v]);
        }
      } else {
        const Float scale = half_to_float(w.scales + at);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const int32_t* halves = rows.halves + (r * rows.G + g) * 2;
          const Int exact = sub_int(acc[r][v], set_int(w.offset * (halves[0] + halves[1])));
          out[r][v] = fma(mul(to_float(exact), broadcast(rows.d[r * rows.G + g])), scale, out[r][v]);
          if constexpr (F::min)
            out[r][v] = fma(broadcast(rows.s[r * rows.G + g]), half_to_float(w.mins + at), out[r][v]);
        }
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) store(y + r * ldy + v * kLanes, out[r][v]);
}

// rows a tall tile takes, and column blocks a tile of R rows takes at once (index R): integer
// accumulators (two sets with sub-block scales) and fp32 outputs within the register file. On
// AVX2 (16 registers) four rows spill a little yet ran faster than two at 32 rows on a Zen 3
// (Q6_K 96-106 against 85-93 GMAC/s, Q5_K 113-128 against 97-108, a scratch timing of the 1.7B's
// shapes); Q8_0's nibble pairs take twice the registers and two rows ran faster there (82 against
// 59-75).
#ifdef __AVX512F__
template <class F>
constexpr int kTallRows = 4;
constexpr int kTallBlocks = 2;
constexpr int kBlocksOf[4] = {0, 4, 2, 2};
#else
template <class F>
constexpr int kTallRows = F::wide ? 2 : 4;
constexpr int kTallBlocks = 1;
constexpr int kBlocksOf[4] = {0, 2, 1, 1};
#endif

// One superblock (`blocks` column blocks of 16: SB, or fewer at the end of N, or a run of CB of
// them) for R rows; `ahead`: which of the next superblock's groups its tiles fetch.
template <class F, int R, int CB>
inline void superblock(const Rows& rows, const Weight& w, const Weight& source, const Weight& sink, float* y,
                       int64_t ldy, int64_t blocks, mohawk::Spread ahead) {
  if (blocks % CB == 0) {
    for (int b = 0; b < blocks; b += CB)
      tile<F, R, CB>(rows, w.at(b), source.at(b), sink.at(b), y + b * 16, ldy, ahead);
  } else {
    for (int64_t b = 0; b < blocks; ++b) tile<F, R, 1>(rows, w.at(b), source.at(b), sink.at(b), y + b * 16, ldy, ahead);
  }
}

// Rows m0.. of one superblock (`blocks` column blocks from w), tall tiles then the rest.
template <class F>
void rows_of_superblock(const Rows& all, const Weight& w, const Weight& source, int64_t m0, int64_t M, int64_t N,
                        float* ys, int64_t blocks, bool has_next) {
  const int64_t passes = (M + kTallRows<F> - 1) / kTallRows<F>;
  int64_t m = m0;
  for (; m + kTallRows<F> <= M; m += kTallRows<F>)
    superblock<F, kTallRows<F>, kTallBlocks>(all.at(m), w, source, w, ys + m * N, N, blocks,
                                             mohawk::Spread::of(m / kTallRows<F>, passes, has_next));
  const mohawk::Spread last = mohawk::Spread::of(m / kTallRows<F>, passes, has_next);
  switch (M - m) {
    case 1: superblock<F, 1, kBlocksOf[1]>(all.at(m), w, source, w, ys + m * N, N, blocks, last); break;
    case 2: superblock<F, 2, kBlocksOf[2]>(all.at(m), w, source, w, ys + m * N, N, blocks, last); break;
    case 3: superblock<F, 3, kBlocksOf[3]>(all.at(m), w, source, w, ys + m * N, N, blocks, last); break;
    default: break;
  }
}

template <class F>
void matmul(const Rows& all, const Weight& weight, int64_t M, int64_t N, float* y, int num_threads) {
  const int64_t NB = N / 16, NS = (NB + SB - 1) / SB, K = all.K;
  // Q6_K with rows for more than one pass: each superblock's bytes rebuilt once, by its first pass,
  // into the thread's scratch (L2), rather than in registers in every pass (8% slower at 32 rows)
  const bool unpack = F::six && M > kTallRows<F>;
  // threads split the columns, never a reduction: the same bits on any number of threads
  static thread_local uint32_t* scratch = nullptr;
  static thread_local int64_t scratch_words = 0;
  mohawk::for_each_unit(NS, num_threads, [&](int64_t b, bool has_next) {
    if (unpack && scratch_words < SB * 4 * K) {
      std::free(scratch);
      scratch_words = SB * 4 * K;
      scratch = static_cast<uint32_t*>(std::aligned_alloc(64, static_cast<size_t>(scratch_words) * 4));
    }
    const Weight w = weight.at(b * SB);
    float* ys = y + b * SB * 16;
    const int64_t blocks = NB - b * SB < SB ? NB - b * SB : SB;
    if (unpack) {  // the first pass rebuilds the bytes in registers and writes them; the rest read them
      Weight bytes = w;
      bytes.codes = scratch;
      bytes.code_stride = (K / 4) * 16;
      bytes.highs = 0;
      const int64_t passes = (M + kTallRows<F> - 1) / kTallRows<F>;
      superblock<Format<F::sub, F::min, F::wide, true, true>, kTallRows<F>, kTallBlocks>(
          all, w, w, bytes, ys, N, blocks, mohawk::Spread::of(0, passes, has_next));
      rows_of_superblock<Format<F::sub, F::min, F::wide>>(all, bytes, w, kTallRows<F>, M, N, ys, blocks, has_next);
    } else {
      rows_of_superblock<F>(all, w, w, 0, M, N, ys, blocks, has_next);
    }
  });
}

}  // namespace

extern "C" {

// y [M, N] = x [M, K] times the packed weight (header). `mins` and `subs` may be null; with
// `subs`, K is a multiple of 256 and `mins` null; an offset of 128 or more means codes up to 255,
// without minimums or sub-block scales. Returns 0, or -1 for a combination no format has.
int mohawk_int8_rows_mm(const float* x, int64_t M, int64_t K, const uint32_t* codes, const uint16_t* scales,
                        const uint16_t* mins, const int8_t* subs, int32_t offset, int64_t N, float* y,
                        int num_threads) {
  const bool sub = subs != nullptr, with_mins = mins != nullptr, wide = offset >= 128;
  if ((sub && (with_mins || wide || K % 256 != 0)) || (wide && with_mins) || K % GS != 0 || N % 16 != 0) return -1;
  const int64_t G = K / GS;
  const size_t bytes = (static_cast<size_t>(M * K) + static_cast<size_t>(M * G) * 16 + 63) / 64 * 64;
  float* d = static_cast<float*>(std::aligned_alloc(64, bytes));
  float* s = d + M * G;
  int32_t* halves = reinterpret_cast<int32_t*>(s + M * G);
  int8_t* q = reinterpret_cast<int8_t*>(halves + M * G * 2);
  mohawk::quantize_rows<false>(x, M, K, q, d, s, halves, num_threads);
  const Rows rows{q, d, s, halves, K, G};
  const int64_t code_words = sub ? K / 8 + K / 16 : K / 4;  // a column's words: Q6_K's 6 bits, or a byte a code
  const Weight weight{codes,  scales, mins, subs, code_words * 16, (sub ? K / 256 : G) * 16, G * 16, (K / 16) * 16,
                      offset, sub ? (K / 8) * 16 : 0};
  if (sub)
    matmul<Format<true, false, false, true>>(rows, weight, M, N, y, num_threads);
  else if (with_mins)
    matmul<Format<false, true, false>>(rows, weight, M, N, y, num_threads);
  else if (wide)
    matmul<Format<false, false, true>>(rows, weight, M, N, y, num_threads);
  else
    matmul<Format<false, false, false>>(rows, weight, M, N, y, num_threads);
  std::free(d);
  return 0;
}

}  // extern "C"

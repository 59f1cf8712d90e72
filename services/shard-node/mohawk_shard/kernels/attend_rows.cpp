// Attention one query at a time in one fixed order: batch invariant by construction.
// Built with the other kernels into one library (library.py); called by kernels/attend_rows.py.
//
// For every (sequence, query, head) the same arithmetic, whatever else the call holds (other
// sequences, a prompt chunk's other queries, how far the keys were padded):
//   keys seen: [first, last] = the first and last key whose mask is finite (the mask is the
//              query's own: causal, its sequence's length, its window), so padding adds nothing;
//   score_j  = fma chain over d = 0..D-1 of (q_d * scale) * k_jd, plus mask_j;
//   m        = max_j score_j (exact in any order);
//   p_j      = exp(score_j - m) by the polynomial below, lane by lane;
//   sum      = 16 lane sums (lane j % 16, in order of j) added in a fixed tree;
//   out_d    = (fma chain over j = first..last of p_j * v_jd) / sum.
// The code works on 16-lane vectors (one AVX-512 register, or two AVX2 registers doing the same
// per-lane operations), so both builds give the same bits. Queries are taken in tiles of rows
// (a row: one query's head) that share a KV head: the keys of a block of 16 are transposed once
// and read by every row of the tile, which is where the speed comes from; a row's own operations
// do not depend on the tile it lands in.
#include <immintrin.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "fetch_ahead.h"

namespace {

constexpr int LANES = 16;
constexpr int TILE = 4;  // rows (query heads) sharing each transposed key block
#ifdef __AVX512F__
constexpr int KEY_BLOCKS = 4;  // key blocks scored at once: TILE x KEY_BLOCKS accumulators
#else
constexpr int KEY_BLOCKS = 2;  // (AVX2 has half the registers, each V two of them)
#endif

#ifdef __AVX512F__
struct V {
  __m512 r;
};
inline V load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void store(float* p, V a) { _mm512_storeu_ps(p, a.r); }
inline V splat(float x) { return {_mm512_set1_ps(x)}; }
inline V fma(V a, V b, V c) { return {_mm512_fmadd_ps(a.r, b.r, c.r)}; }
inline V add(V a, V b) { return {_mm512_add_ps(a.r, b.r)}; }
inline V sub(V a, V b) { return {_mm512_sub_ps(a.r, b.r)}; }
inline V mul(V a, V b) { return {_mm512_mul_ps(a.r, b.r)}; }
inline V vmax(V a, V b) { return {_mm512_max_ps(a.r, b.r)}; }
// round to nearest even, the float as an int shifted into the exponent, and a select
inline V round_nearest(V a) { return {_mm512_roundscale_ps(a.r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
inline V pow2(V n) {
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n.r), _mm512_set1_epi32(127)), 23);
  return {_mm512_castsi512_ps(e)};
}
inline V above_or_zero(V x, float bound, V value) {
  return {_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x.r, _mm512_set1_ps(bound), _CMP_GT_OQ), value.r)};
}
// bit l set where p[l] is not -inf
inline uint32_t finite_bits(const float* p) {
  return _mm512_cmp_ps_mask(_mm512_loadu_ps(p), _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
}
#else
struct V {
  __m256 lo, hi;
};
inline V load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void store(float* p, V a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline V splat(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline V fma(V a, V b, V c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline V add(V a, V b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline V sub(V a, V b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline V mul(V a, V b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline V vmax(V a, V b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline V round_nearest(V a) {
  constexpr int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(a.lo, mode), _mm256_round_ps(a.hi, mode)};
}
inline __m256 pow2_half(__m256 n) {
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_castsi256_ps(e);
}
inline V pow2(V n) { return {pow2_half(n.lo), pow2_half(n.hi)}; }
inline V above_or_zero(V x, float bound, V value) {
  const __m256 b = _mm256_set1_ps(bound);
  return {_mm256_and_ps(_mm256_cmp_ps(x.lo, b, _CMP_GT_OQ), value.lo),
          _mm256_and_ps(_mm256_cmp_ps(x.hi, b, _CMP_GT_OQ), value.hi)};
}
inline uint32_t finite_bits(const float* p) {
  const __m256 inf = _mm256_set1_ps(-INFINITY);
  const uint32_t lo = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(p), inf, _CMP_NEQ_OQ));
  const uint32_t hi = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(p + 8), inf, _CMP_NEQ_OQ));
  return lo | hi << 8;
}
#endif

// Keys and values as the cache stores them: fp32, or fp16 (half the bytes a decode step reads;
// the widening is exact, so the arithmetic below sees the same floats either way).
using Half = uint16_t;
inline float to_float(float x) { return x; }
inline float to_float(Half h) { return _cvtsh_ss(h); }
inline V load(const Half* p) {
#ifdef __AVX512F__
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
#else
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
#endif
}

// The first and last key a mask row [L] leaves visible (first = L where it leaves none), 16 keys
// at a time: a prompt chunk's row is mostly masked past its query.
inline void visible_range(const float* mask, int64_t L, int64_t* first, int64_t* last) {
  const int64_t whole = L / LANES * LANES;
  *first = L;
  for (int64_t j = 0; j < whole && *first == L; j += LANES)
    if (const uint32_t bits = finite_bits(mask + j)) *first = j + __builtin_ctz(bits);
  for (int64_t j = whole; j < L && *first == L; ++j)
    if (!std::isinf(mask[j])) *first = j;
  *last = *first;
  if (*first == L) return;
  for (int64_t j = L - 1; j >= whole; --j)
    if (!std::isinf(mask[j])) {
      *last = j;
      return;
    }
  for (int64_t j = whole - LANES; j >= 0; j -= LANES)
    if (const uint32_t bits = finite_bits(mask + j)) {
      *last = j + 31 - __builtin_clz(bits);
      return;
    }
}

// exp(x) for x <= 0 (or -inf), lane by lane: x = n ln2 + r, |r| <= ln2/2, exp(r) by a degree-6
// polynomial (Cephes' expf coefficients), times 2^n through the exponent bits; 0 below -87.
inline V exp_nonpositive(V x) {
  const V clamped = vmax(x, splat(-87.0f));
  const V n = round_nearest(mul(clamped, splat(1.44269504088896341f)));
  V r = fma(n, splat(-0.693359375f), clamped);
  r = fma(n, splat(2.12194440e-4f), r);
  V p = splat(1.9875691500e-4f);
  p = fma(p, r, splat(1.3981999507e-3f));
  p = fma(p, r, splat(8.3334519073e-3f));
  p = fma(p, r, splat(4.1665795894e-2f));
  p = fma(p, r, splat(1.6666665459e-1f));
  p = fma(p, r, splat(5.0000001201e-1f));
  p = fma(p, mul(r, r), r);
  p = add(p, splat(1.0f));
  return above_or_zero(x, -87.0f, mul(p, pow2(n)));
}

struct Row {
  const float* q;     // [D], already times the scale
  const float* mask;  // [L]
  float* out;         // [D]
  int64_t first, last;
};

#ifdef __AVX512F__
// dst[c * 16 + r] = src[r][c] for a 16 x 16 block (src[r] null: a row of zeros): unpacking pairs
// of 32-bit, then of 64-bit elements, then a 4 x 4 transpose of 128-bit lanes. Moves, no arithmetic.
template <typename KV>
inline void transpose16(const KV* const* src, float* dst) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = src[i] != nullptr ? load(src[i]).r : _mm512_setzero_ps();
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // r[i + c], lane q: column 4q + c of rows i .. i + 3
    const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
    const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int c = 0; c < 4; ++c) {
    const __m512 u0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44), u1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xEE);
    const __m512 u2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44);
    const __m512 u3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xEE);
    _mm512_storeu_ps(dst + (0 + c) * 16, _mm512_shuffle_f32x4(u0, u2, 0x88));
    _mm512_storeu_ps(dst + (4 + c) * 16, _mm512_shuffle_f32x4(u0, u2, 0xDD));
    _mm512_storeu_ps(dst + (8 + c) * 16, _mm512_shuffle_f32x4(u1, u3, 0x88));
    _mm512_storeu_ps(dst + (12 + c) * 16, _mm512_shuffle_f32x4(u1, u3, 0xDD));
  }
}
#endif

// `count` keys, key l at pool + slots[l] * stride -> kt [D][16] (zero past `count`): data moves
// only, so the scores computed from it are the same bits however it is done.
template <typename KV>
void transpose_block(const KV* pool, const int64_t* slots, int64_t stride, int64_t count, int64_t D, float* kt) {
  const KV* keys[LANES];
  for (int l = 0; l < LANES; ++l) keys[l] = l < count ? pool + slots[l] * stride : nullptr;
  int64_t d0 = 0;
#ifdef __AVX512F__
  for (; d0 + LANES <= D; d0 += LANES) {
    const KV* rows[LANES];
    for (int l = 0; l < LANES; ++l) rows[l] = keys[l] != nullptr ? keys[l] + d0 : nullptr;
    transpose16(rows, kt + d0 * LANES);
  }
#endif
  for (int64_t d = d0; d < D; ++d)
    for (int l = 0; l < LANES; ++l) kt[d * LANES + l] = keys[l] != nullptr ? to_float(keys[l][d]) : 0.0f;
}

constexpr int CHUNKS = 4;  // blocks of 16 of d a pass over the values takes

// out[d0 .. d0 + 64) of N rows: for each row the fma chain over j = lo..hi of p_j * v_jd (p_j its
// scores' exp, 0 outside its range), divided by its sum; N known at compile time, so the N x 4
// accumulators stay in registers. The same operations per row as the general loop below.
template <int N, typename KV>
inline void weigh_values(Row* rows, const KV* values, const int64_t* slots, int64_t stride, int64_t d0,
                         int64_t lo, int64_t hi, const float* scores, int64_t ldsc) {
  V acc[N][CHUNKS];
#pragma GCC unroll 16
  for (int r = 0; r < N; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < CHUNKS; ++c) acc[r][c] = splat(0.0f);
  for (int64_t j = lo; j <= hi; ++j) {
    const KV* vrow = values + slots[j] * stride + d0;
    V v[CHUNKS];
#pragma GCC unroll 4
    for (int c = 0; c < CHUNKS; ++c) v[c] = load(vrow + c * LANES);
#pragma GCC unroll 16
    for (int r = 0; r < N; ++r) {
      const V p = splat(scores[r * ldsc + j]);
#pragma GCC unroll 4
      for (int c = 0; c < CHUNKS; ++c) acc[r][c] = fma(p, v[c], acc[r][c]);
    }
  }
  for (int r = 0; r < N; ++r) {
    const float sum = scores[r * ldsc + ldsc - 1];
    for (int c = 0; c < CHUNKS; ++c) {
      float out[LANES];
      store(out, acc[r][c]);
      for (int l = 0; l < LANES; ++l) rows[r].out[d0 + c * LANES + l] = out[l] / sum;
    }
  }
}

// Scores of N rows for keys lo .. hi (whole blocks of 16): one fma chain over d per (row, key),
// KEY_BLOCKS blocks at once, so that enough chains run side by side to hide the fma's latency and
// a broadcast serves several; N known at compile time, so the accumulators stay in registers.
template <int N>
inline void score_blocks(const Row* rows, int64_t lo, int64_t hi, int64_t D, const float* kt, float* scores,
                         int64_t ldsc) {
  const int64_t last_block = hi / LANES;
  for (int64_t b = lo / LANES; b <= last_block; b += KEY_BLOCKS) {
    const int blocks = static_cast<int>(last_block - b + 1 < KEY_BLOCKS ? last_block - b + 1 : KEY_BLOCKS);
    const float* block = kt + b * D * LANES;
    V acc[N][KEY_BLOCKS];
#pragma GCC unroll 16
    for (int r = 0; r < N; ++r)
#pragma GCC unroll 4
      for (int c = 0; c < KEY_BLOCKS; ++c) acc[r][c] = splat(0.0f);
    for (int64_t d = 0; d < D; ++d) {
      V k[KEY_BLOCKS];
#pragma GCC unroll 4
      for (int c = 0; c < KEY_BLOCKS; ++c) k[c] = load(block + ((c < blocks ? c : 0) * D + d) * LANES);
#pragma GCC unroll 16
      for (int r = 0; r < N; ++r) {
        const V qd = splat(rows[r].q[d]);
#pragma GCC unroll 4
        for (int c = 0; c < KEY_BLOCKS; ++c) acc[r][c] = fma(qd, k[c], acc[r][c]);
      }
    }
    for (int r = 0; r < N; ++r)
      for (int c = 0; c < blocks; ++c) store(scores + r * ldsc + (b + c) * LANES, acc[r][c]);
  }
}

// One tile of rows sharing a sequence's KV head: value j at values + slots[j] * stride, `kt` its
// keys transposed in blocks of 16; `scores` TILE rows of scratch, each the row's scores then its sum.
template <typename KV>
void attend_tile(Row* rows, int n, const KV* values, const int64_t* slots, int64_t stride, int64_t D,
                 const float* kt, float* scores, int64_t ldsc) {
  int64_t lo = rows[0].first, hi = rows[0].last;
  for (int r = 1; r < n; ++r) {
    lo = rows[r].first < lo ? rows[r].first : lo;
    hi = rows[r].last > hi ? rows[r].last : hi;
  }
  // scores, 16 keys at a time: one fma chain over d per (row, key)
  switch (n) {
    case 1: score_blocks<1>(rows, lo, hi, D, kt, scores, ldsc); break;
    case 2: score_blocks<2>(rows, lo, hi, D, kt, scores, ldsc); break;
    case 3: score_blocks<3>(rows, lo, hi, D, kt, scores, ldsc); break;
    default: score_blocks<TILE>(rows, lo, hi, D, kt, scores, ldsc); break;
  }
  for (int r = 0; r < n; ++r) {
    const Row& row = rows[r];
    float* s = scores + r * ldsc;
    // blocks of 16 keys aligned on key 0: the score plus the mask inside [first, last], -inf outside
    const int64_t begin = row.first / LANES * LANES, end = row.last / LANES * LANES + LANES;
    V top = splat(-INFINITY);
    for (int64_t j = begin; j < end; j += LANES) {
      V x;
      if (j >= row.first && j + LANES - 1 <= row.last) {
        x = add(load(s + j), load(row.mask + j));
      } else {
        float block[LANES];
        for (int l = 0; l < LANES; ++l) {
          const int64_t key = j + l;
          block[l] = key >= row.first && key <= row.last ? s[key] + row.mask[key] : -INFINITY;
        }
        x = load(block);
      }
      store(s + j, x);
      top = vmax(top, x);
    }
    float lanes[LANES];
    store(lanes, top);
    float m = -INFINITY;
    for (int l = 0; l < LANES; ++l) m = lanes[l] > m ? lanes[l] : m;  // a max: exact in any order
    // p_j = exp(score_j - m) (0 outside the range), summed in 16 lanes, the lanes in a fixed tree
    V sums = splat(0.0f);
    for (int64_t j = begin; j < end; j += LANES) {
      const V p = exp_nonpositive(sub(load(s + j), splat(m)));
      sums = add(sums, p);
      store(s + j, p);
    }
    store(lanes, sums);
    for (int width = LANES / 2; width >= 1; width /= 2)
      for (int l = 0; l < width; ++l) lanes[l] = lanes[l] + lanes[l + width];
    s[ldsc - 1] = lanes[0];  // the row's sum, in its scratch's last slot
    // the tile's other keys weigh exactly 0 for this row: fma(0, v, acc) is acc for finite v
    for (int64_t j = lo; j < begin; ++j) s[j] = 0.0f;
    for (int64_t j = end; j <= hi; ++j) s[j] = 0.0f;
  }
  // out_d = fma chain over j of p_j * v_jd, up to 64 of d at a time (a row's zeros change nothing)
  for (int64_t d0 = 0; d0 < D; d0 += CHUNKS * LANES) {
    if (d0 + CHUNKS * LANES <= D) {  // whole chunks: the accumulators stay in registers
      switch (n) {
        case 1: weigh_values<1>(rows, values, slots, stride, d0, lo, hi, scores, ldsc); continue;
        case 2: weigh_values<2>(rows, values, slots, stride, d0, lo, hi, scores, ldsc); continue;
        case 3: weigh_values<3>(rows, values, slots, stride, d0, lo, hi, scores, ldsc); continue;
        default: weigh_values<TILE>(rows, values, slots, stride, d0, lo, hi, scores, ldsc); continue;
      }
    }
    const int chunks = static_cast<int>((D - d0 + LANES - 1) / LANES < CHUNKS ? (D - d0 + LANES - 1) / LANES : CHUNKS);
    V acc[TILE][CHUNKS];
    for (int r = 0; r < TILE; ++r)
      for (int c = 0; c < CHUNKS; ++c) acc[r][c] = splat(0.0f);
    float tail[LANES] = {};
    for (int64_t j = lo; j <= hi; ++j) {
      const KV* vrow = values + slots[j] * stride + d0;
      V v[CHUNKS];
      for (int c = 0; c < chunks; ++c) {
        if (d0 + (c + 1) * LANES <= D) {
          v[c] = load(vrow + c * LANES);
        } else {
          for (int64_t l = 0; l < D - d0 - c * LANES; ++l) tail[l] = to_float(vrow[c * LANES + l]);
          v[c] = load(tail);
        }
      }
      for (int r = 0; r < n; ++r) {
        const V p = splat(scores[r * ldsc + j]);
        for (int c = 0; c < chunks; ++c) acc[r][c] = fma(p, v[c], acc[r][c]);
      }
    }
    for (int r = 0; r < n; ++r) {
      const float sum = scores[r * ldsc + ldsc - 1];
      for (int c = 0; c < chunks; ++c) {
        float out[LANES];
        store(out, acc[r][c]);
        for (int64_t l = 0; l < LANES && d0 + c * LANES + l < D; ++l) rows[r].out[d0 + c * LANES + l] = out[l] / sum;
      }
    }
  }
}

// One call's shapes and tensors (mohawk_attend_rows's arguments, and what follows from them).
template <typename KV>
struct Call {
  const float* q;
  const KV *k, *v;
  const float* mask;
  const int64_t* slots;
  float* out;
  float scale;
  int64_t B, Q, H, D, KVH, L, sh, sl;
  int64_t group, per_kv, tiles_per_kv, blocks, ldsc;
};

// Rows row0 .. row0 + TILE - 1 of (sequence b, KV head g) against `kt`, its keys transposed;
// `visible` each query's first and last visible key (`visible_range`).
template <typename KV>
void attend_unit_tile(const Call<KV>& c, int64_t b, int64_t g, int64_t row0, const int64_t* visible, const float* kt,
                      float* qs, float* scores) {
  Row rows[TILE];
  int n = 0;
  for (int64_t x = row0; x < row0 + TILE && x < c.per_kv; ++x) {
    const int64_t i = x / c.group, h = g * c.group + x % c.group;
    const float* mrow = c.mask + (b * c.Q + i) * c.L;
    float* o = c.out + ((b * c.Q + i) * c.H + h) * c.D;
    const int64_t first = visible[2 * (b * c.Q + i)], last = visible[2 * (b * c.Q + i) + 1];
    if (first >= c.L) {  // a query that sees no key (a padding row): zeros, dropped by the caller
      for (int64_t d = 0; d < c.D; ++d) o[d] = 0.0f;
      continue;
    }
    const float* qrow = c.q + ((b * c.Q + i) * c.H + h) * c.D;
    float* scaled = qs + n * c.D;
    for (int64_t d = 0; d < c.D; ++d) scaled[d] = qrow[d] * c.scale;
    rows[n++] = Row{scaled, mrow, o, first, last};
  }
  if (n > 0) attend_tile(rows, n, c.v + g * c.sh, c.slots + b * c.L, c.sl, c.D, kt, scores, c.ldsc);
}

// (sequence b, KV head g)'s keys lo .. hi transposed, in the blocks of 16 that hold them, into kt
// (block k at kt + k * D * 16, as `score_blocks` reads it); nothing outside those blocks is read,
// so a short sequence beside a long one costs its own keys. Its keys and values are first asked
// for into L2, all at once: a block of 16 keys is a page of its own in the pool, too short a run
// for the hardware prefetchers to keep ahead of the reads.
template <typename KV>
void transpose_unit(const Call<KV>& c, int64_t b, int64_t g, int64_t lo, int64_t hi, float* kt) {
  const int64_t* slots = c.slots + b * c.L;
  const int bytes = static_cast<int>(c.D * sizeof(KV));
  const int64_t first_block = lo / LANES, end_block = hi / LANES + 1;
  const int64_t end_key = end_block * LANES < c.L ? end_block * LANES : c.L;
  for (int64_t j = first_block * LANES; j < end_key; ++j) {
    mohawk::fetch_lines(c.k + g * c.sh + slots[j] * c.sl, bytes);
    mohawk::fetch_lines(c.v + g * c.sh + slots[j] * c.sl, bytes);
  }
  for (int64_t block = first_block; block < end_block; ++block) {
    const int64_t first = block * LANES, count = c.L - first < LANES ? c.L - first : LANES;
    transpose_block(c.k + g * c.sh, slots + first, c.sl, count, c.D, kt + block * c.D * LANES);
  }
}

// The keys the rows of (sequence b, KV head g) see, lo .. hi over its queries (lo = L: none).
template <typename KV>
void unit_range(const Call<KV>& c, int64_t b, const int64_t* visible, int64_t* lo, int64_t* hi) {
  *lo = c.L, *hi = -1;
  for (int64_t i = 0; i < c.Q; ++i) {
    const int64_t first = visible[2 * (b * c.Q + i)], last = visible[2 * (b * c.Q + i) + 1];
    if (first >= c.L) continue;
    *lo = first < *lo ? first : *lo;
    *hi = last > *hi ? last : *hi;
  }
}

template <typename T>
T* sized(std::vector<T>& scratch, size_t size) {  // scratch kept between calls, grown as needed
  if (scratch.size() < size) scratch.resize(size);
  return scratch.data();
}

// The call for keys and values stored as KV (float or Half): mohawk_attend_rows's contract.
template <typename KV>
void attend_all(const float* q, int64_t B, int64_t Q, int64_t H, int64_t D, const KV* k, const KV* v, int64_t KVH,
                int64_t L, int64_t sh, int64_t sl, const int64_t* slots, const float* mask, float scale, float* out,
                int num_threads) {
  Call<KV> c{q, k, v, mask, slots, out, scale, B, Q, H, D, KVH, L, sh, sl, 0, 0, 0, 0, 0};
  c.group = H / KVH;
  c.per_kv = Q * c.group;  // rows sharing a (sequence, KV head)
  c.tiles_per_kv = (c.per_kv + TILE - 1) / TILE;
  c.blocks = (L + LANES - 1) / LANES;
  c.ldsc = c.blocks * LANES + 1;  // a row's scores, then its sum
  const size_t unit_kt = static_cast<size_t>(c.blocks * D * LANES);
  // scratch kept between calls (a decode step's calls are small: allocating each time cost more
  // than the arithmetic); every element used is written before it is read
  static thread_local std::vector<int64_t> ranges;  // each query's first and last visible key
  int64_t* const visible = sized(ranges, static_cast<size_t>(2 * B * Q));  // (the pool's threads
  // each have their own thread_locals: this one is the calling thread's, shared below)
  if (c.tiles_per_kv == 1) {
    // one tile a (sequence, KV head), as in every decode step: a thread transposes the keys the
    // unit's rows see into its own small buffer and attends at once, while they are in its cache
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(static)
      for (int64_t t = 0; t < B * Q; ++t) visible_range(mask + t * L, L, &visible[2 * t], &visible[2 * t + 1]);
      static thread_local std::vector<float> own_kt, qs, scores;
      float* kt = sized(own_kt, unit_kt);
      float* qbuf = sized(qs, static_cast<size_t>(TILE * D));
      float* sbuf = sized(scores, static_cast<size_t>(TILE * c.ldsc));
#pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < B * KVH; ++t) {
        int64_t lo, hi;
        unit_range(c, t / KVH, visible, &lo, &hi);
        if (lo < L) transpose_unit(c, t / KVH, t % KVH, lo, hi, kt);
        attend_unit_tile(c, t / KVH, t % KVH, 0, visible, kt, qbuf, sbuf);
      }
    }
    return;
  }
  // prompt chunks: every (sequence, KV head)'s keys transposed first, shared by its many tiles
  static thread_local std::vector<float> kt;
  const size_t need = static_cast<size_t>(B * KVH) * unit_kt;
  if (kt.size() > 4 * need && kt.size() > (size_t{1} << 20)) std::vector<float>().swap(kt);  // after a long prompt
  float* const transposed = sized(kt, need);
#pragma omp parallel num_threads(num_threads)
  {
#pragma omp for schedule(static) nowait
    for (int64_t t = 0; t < B * Q; ++t) visible_range(mask + t * L, L, &visible[2 * t], &visible[2 * t + 1]);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < B * KVH * c.blocks; ++t) {  // block by block: a lone prompt has few units
      const int64_t b = t / (KVH * c.blocks), g = (t / c.blocks) % KVH, first = t % c.blocks * LANES;
      transpose_block(k + g * sh, slots + b * L + first, sl, L - first < LANES ? L - first : LANES, D,
                      transposed + t * D * LANES);
    }
    static thread_local std::vector<float> qs, scores;
    float* qbuf = sized(qs, static_cast<size_t>(TILE * D));
    float* sbuf = sized(scores, static_cast<size_t>(TILE * c.ldsc));
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < B * KVH * c.tiles_per_kv; ++t) {
      const int64_t unit = t / c.tiles_per_kv;
      attend_unit_tile(c, unit / KVH, unit % KVH, (t % c.tiles_per_kv) * TILE, visible, transposed + unit * unit_kt,
                       qbuf, sbuf);
    }
  }
}


}  // namespace

extern "C" {

// q [B, Q, H, D]; k and v pools [KVH, S, D] with strides (sh, sl) in elements (a key's D values
// contiguous), read where the cache holds them: key j of sequence b is slot slots[b * L + j];
// mask [B, Q, L] (0 or -inf) -> out [B, Q, H, D]. A masked key's slot is read too (its score is
// replaced by -inf, its weight is exactly 0), so it must lie inside the pool like any other.
void mohawk_attend_rows(const float* q, int64_t B, int64_t Q, int64_t H, int64_t D, const float* k, const float* v,
                        int64_t KVH, int64_t L, int64_t sh, int64_t sl, const int64_t* slots, const float* mask,
                        float scale, float* out, int num_threads) {
  attend_all(q, B, Q, H, D, k, v, KVH, L, sh, sl, slots, mask, scale, out, num_threads);
}

// The same with keys and values stored as fp16 (their bits, uint16): widened exactly as read.
void mohawk_attend_rows_f16(const float* q, int64_t B, int64_t Q, int64_t H, int64_t D, const uint16_t* k,
                            const uint16_t* v, int64_t KVH, int64_t L, int64_t sh, int64_t sl, const int64_t* slots,
                            const float* mask, float scale, float* out, int num_threads) {
  attend_all(q, B, Q, H, D, k, v, KVH, L, sh, sl, slots, mask, scale, out, num_threads);
}

}  // extern "C"

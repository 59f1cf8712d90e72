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
#include <cstring>
#include <vector>

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

// `count` keys, key l at pool + slots[l] * stride -> kt [D][16] (zero past `count`). The rows are
// first copied whole into `rows` [16][D] (independent contiguous reads, which the memory system
// overlaps; reading them a column at a time waited on each), then transposed from there.
void transpose_block(const float* pool, const int64_t* slots, int64_t stride, int64_t count, int64_t D, float* rows,
                     float* kt) {
  for (int64_t l = 0; l < count; ++l) std::memcpy(rows + l * D, pool + slots[l] * stride, D * sizeof(float));
  for (int64_t d = 0; d < D; ++d)
    for (int l = 0; l < LANES; ++l) kt[d * LANES + l] = l < count ? rows[l * D + d] : 0.0f;
}

// One tile of rows sharing a sequence's KV head: value j at values + slots[j] * stride, `kt` its
// keys transposed in blocks of 16; `scores` TILE rows of scratch, each the row's scores then its sum.
void attend_tile(Row* rows, int n, const float* values, const int64_t* slots, int64_t stride, int64_t D,
                 const float* kt, float* scores, int64_t ldsc) {
  int64_t lo = rows[0].first, hi = rows[0].last;
  for (int r = 1; r < n; ++r) {
    lo = rows[r].first < lo ? rows[r].first : lo;
    hi = rows[r].last > hi ? rows[r].last : hi;
  }
  // scores, 16 keys at a time: one fma chain over d per (row, key); KEY_BLOCKS blocks at once, so
  // that enough chains run side by side to hide the fma's latency and a broadcast serves several
  const int64_t last_block = hi / LANES;
  for (int64_t b = lo / LANES; b <= last_block; b += KEY_BLOCKS) {
    const int blocks = static_cast<int>(last_block - b + 1 < KEY_BLOCKS ? last_block - b + 1 : KEY_BLOCKS);
    const float* block = kt + b * D * LANES;
    V acc[TILE][KEY_BLOCKS];
    for (int r = 0; r < TILE; ++r)
      for (int c = 0; c < KEY_BLOCKS; ++c) acc[r][c] = splat(0.0f);
    for (int64_t d = 0; d < D; ++d) {
      V k[KEY_BLOCKS];
      for (int c = 0; c < KEY_BLOCKS; ++c) k[c] = load(block + ((c < blocks ? c : 0) * D + d) * LANES);
      for (int r = 0; r < n; ++r) {
        const V qd = splat(rows[r].q[d]);
        for (int c = 0; c < KEY_BLOCKS; ++c) acc[r][c] = fma(qd, k[c], acc[r][c]);
      }
    }
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < blocks; ++c) store(scores + r * ldsc + (b + c) * LANES, acc[r][c]);
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
  constexpr int CHUNKS = 4;
  for (int64_t d0 = 0; d0 < D; d0 += CHUNKS * LANES) {
    const int chunks = static_cast<int>((D - d0 + LANES - 1) / LANES < CHUNKS ? (D - d0 + LANES - 1) / LANES : CHUNKS);
    V acc[TILE][CHUNKS];
    for (int r = 0; r < TILE; ++r)
      for (int c = 0; c < CHUNKS; ++c) acc[r][c] = splat(0.0f);
    float tail[LANES] = {};
    for (int64_t j = lo; j <= hi; ++j) {
      const float* vrow = values + slots[j] * stride + d0;
      V v[CHUNKS];
      for (int c = 0; c < chunks; ++c) {
        if (d0 + (c + 1) * LANES <= D) {
          v[c] = load(vrow + c * LANES);
        } else {
          for (int64_t l = 0; l < D - d0 - c * LANES; ++l) tail[l] = vrow[c * LANES + l];
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

}  // namespace

extern "C" {

// q [B, Q, H, D]; k and v pools [KVH, S, D] with strides (sh, sl) in elements (a key's D values
// contiguous), read where the cache holds them: key j of sequence b is slot slots[b * L + j];
// mask [B, Q, L] (0 or -inf) -> out [B, Q, H, D]. A masked key's slot is read too (its score is
// replaced by -inf, its weight is exactly 0), so it must lie inside the pool like any other.
void mohawk_attend_rows(const float* q, int64_t B, int64_t Q, int64_t H, int64_t D,
                        const float* k, const float* v, int64_t KVH, int64_t L, int64_t sh,
                        int64_t sl, const int64_t* slots, const float* mask, float scale, float* out,
                        int num_threads) {
  const int64_t group = H / KVH, per_kv = Q * group;  // rows sharing a (sequence, KV head)
  const int64_t tiles_per_kv = (per_kv + TILE - 1) / TILE, blocks = (L + LANES - 1) / LANES;
  const int64_t ldsc = blocks * LANES + 1;  // a row's scores, then its sum
  // every (sequence, KV head)'s keys transposed in blocks of 16, shared by its tiles
  // scratch kept between calls (a decode step's calls are small: allocating each time cost more
  // than the arithmetic); every element used is written before it is read
  static thread_local std::vector<float> kt;
  static thread_local std::vector<int64_t> ranges;  // each query's first and last visible key
  const size_t need = static_cast<size_t>(B * KVH * blocks * D * LANES);
  if (kt.size() > 4 * need && kt.size() > (size_t{1} << 20)) std::vector<float>().swap(kt);  // after a long prompt
  if (kt.size() < need) kt.resize(need);
  if (ranges.size() < static_cast<size_t>(2 * B * Q)) ranges.resize(2 * B * Q);
  float* const transposed = kt.data();  // (the pool's threads each have their own thread_locals)
  int64_t* const visible = ranges.data();
#pragma omp parallel num_threads(num_threads)
  {
#pragma omp for schedule(static) nowait
    for (int64_t t = 0; t < B * Q; ++t) visible_range(mask + t * L, L, &visible[2 * t], &visible[2 * t + 1]);
    static thread_local std::vector<float> block_rows;
    if (block_rows.size() < static_cast<size_t>(LANES * D)) block_rows.resize(LANES * D);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < B * KVH * blocks; ++t) {
      const int64_t b = t / (KVH * blocks), g = (t / blocks) % KVH, block = t % blocks;
      const int64_t first = block * LANES, count = L - first < LANES ? L - first : LANES;
      transpose_block(k + g * sh, slots + b * L + first, sl, count, D, block_rows.data(), transposed + t * D * LANES);
    }
    static thread_local std::vector<float> qs, scores;
    if (qs.size() < static_cast<size_t>(TILE * D)) qs.resize(TILE * D);
    if (scores.size() < static_cast<size_t>(TILE * ldsc)) scores.resize(TILE * ldsc);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < B * KVH * tiles_per_kv; ++t) {
      const int64_t b = t / (KVH * tiles_per_kv), g = (t / tiles_per_kv) % KVH;
      const int64_t row0 = (t % tiles_per_kv) * TILE;
      Row rows[TILE];
      int n = 0;
      for (int64_t x = row0; x < row0 + TILE && x < per_kv; ++x) {
        const int64_t i = x / group, h = g * group + x % group;
        const float* mrow = mask + (b * Q + i) * L;
        float* o = out + ((b * Q + i) * H + h) * D;
        const int64_t first = visible[2 * (b * Q + i)], last = visible[2 * (b * Q + i) + 1];
        if (first >= L) {  // a query that sees no key (a padding row): zeros, dropped by the caller
          for (int64_t d = 0; d < D; ++d) o[d] = 0.0f;
          continue;
        }
        const float* qrow = q + ((b * Q + i) * H + h) * D;
        float* scaled = qs.data() + n * D;
        for (int64_t d = 0; d < D; ++d) scaled[d] = qrow[d] * scale;
        rows[n++] = Row{scaled, mrow, o, first, last};
      }
      if (n == 0) continue;
      attend_tile(rows, n, v + g * sh, slots + b * L, sl, D, transposed + (b * KVH + g) * blocks * D * LANES,
                  scores.data(), ldsc);
    }
  }
}

}  // extern "C"

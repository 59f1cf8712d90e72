// Attention one query at a time in one fixed order: batch invariant by construction.
// Built with int4_rows.cpp into one library (library.py); called by fixed_chunk_attention.py.
//
// For every (sequence, query, head) the same arithmetic, whatever else the call holds (other
// sequences, a prompt chunk's other queries, how far the keys were padded):
//   keys seen: [first, last] = the first and last key whose mask is finite (the mask is the
//              query's own: causal, its sequence's length, its window), so padding adds nothing;
//   score_j  = sum_d (q_d * scale) * k_jd over d in 16 lanes (lane d % 16, in order of d), the
//              lanes added in a fixed tree, plus mask_j;
//   m        = max_j score_j (exact in any order);
//   p_j      = exp(score_j - m) by the polynomial below (the same bits in any build);
//   out_d    = (sum_j p_j * v_jd in order of j) / (sum_j p_j in order of j).
// No intrinsics: plain loops over arrays of 16, which the compiler may vectorize at any width
// without changing a lane's operations (built with -ffp-contract=off; every fused multiply-add is
// an explicit std::fma), so the AVX2 and AVX-512 builds give the same bits.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

constexpr int LANES = 16;

// exp(x) for x <= 0: x = n ln2 + r, |r| <= ln2/2, exp(r) by a degree-6 polynomial (Cephes' expf
// coefficients), scaled by 2^n through the exponent bits. exp(-inf) and anything below -87 is 0.
inline float exp_nonpositive(float x) {
  if (!(x > -87.0f)) return 0.0f;
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(n, -0.693359375f, x);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r);
  p = p + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

inline float dot(const float* __restrict q, const float* __restrict k, int64_t D) {
  float acc[LANES] = {};
  int64_t d = 0;
  for (; d + LANES <= D; d += LANES)
    for (int l = 0; l < LANES; ++l) acc[l] = std::fma(q[d + l], k[d + l], acc[l]);
  for (int l = 0; d + l < D; ++l) acc[l] = std::fma(q[d + l], k[d + l], acc[l]);
  for (int width = LANES / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] = acc[l] + acc[l + width];
  return acc[0];
}

}  // namespace

extern "C" {

// q [B, Q, H, D], k and v [KVH, B, L, D], mask [B, Q, L] (0 or -inf) -> out [B, Q, H, D].
// scratch: num_threads * (D + L) floats.
void mohawk_attend_rows(const float* q, int64_t B, int64_t Q, int64_t H, int64_t D,
                        const float* k, const float* v, int64_t KVH, int64_t L,
                        const float* mask, float scale, float* out, int num_threads) {
  const int64_t group = H / KVH, total = B * Q * H;
#pragma omp parallel num_threads(num_threads)
  {
    float* qs = new float[D];
    float* p = new float[L > 0 ? L : 1];
#pragma omp for schedule(static)
    for (int64_t t = 0; t < total; ++t) {
      const int64_t b = t / (Q * H), i = (t / H) % Q, h = t % H, g = h / group;
      const float* qrow = q + ((b * Q + i) * H + h) * D;
      const float* mrow = mask + (b * Q + i) * L;
      const float* keys = k + (g * B + b) * L * D;
      const float* values = v + (g * B + b) * L * D;
      float* o = out + ((b * Q + i) * H + h) * D;
      int64_t first = 0, last = L - 1;
      while (first < L && std::isinf(mrow[first])) ++first;
      while (last > first && std::isinf(mrow[last])) --last;
      if (first >= L) {  // a query that sees no key (a padding row): zeros, dropped by the caller
        for (int64_t d = 0; d < D; ++d) o[d] = 0.0f;
        continue;
      }
      for (int64_t d = 0; d < D; ++d) qs[d] = qrow[d] * scale;
      float m = -INFINITY;
      for (int64_t j = first; j <= last; ++j) {
        p[j] = dot(qs, keys + j * D, D) + mrow[j];
        m = p[j] > m ? p[j] : m;
      }
      float sum = 0.0f;
      for (int64_t j = first; j <= last; ++j) {
        p[j] = exp_nonpositive(p[j] - m);
        sum = sum + p[j];
      }
      for (int64_t d = 0; d < D; ++d) o[d] = 0.0f;
      for (int64_t j = first; j <= last; ++j) {
        const float pj = p[j];
        const float* vrow = values + j * D;
        for (int64_t d = 0; d < D; ++d) o[d] = std::fma(pj, vrow[d], o[d]);
      }
      for (int64_t d = 0; d < D; ++d) o[d] = o[d] / sum;
    }
    delete[] qs;
    delete[] p;
  }
}

}  // extern "C"

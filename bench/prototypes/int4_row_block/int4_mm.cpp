// CPU 4-bit groupwise matmul, fp32 activations in, fp32 out, AVX2 + FMA.
// Batch invariant by construction: every output (m, n) is produced by the same sequence of
// fp32 operations over k whatever M is and wherever row m sits (see notes in tile()).
//
// Weight layout (made once by int4_pack):
//   N padded to a multiple of 64 (a "superblock" of 4 column blocks of 16).
//   codes  uint32 [NB, K/8, 16]   NB = Npad/16; word [b][kb][c] holds 8 nibbles,
//                                 nibble j = code[b*16 + c][kb*8 + j]
//   scales float  [NB, G, 16]     G = K/32
//   mins   float  [NB, G, 16]
// y[m, n] = sum_g  scale[g,n] * (sum_{k in g} x[m,k] * code[n,k]) + min[g,n] * (sum_{k in g} x[m,k])
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cstdint>

static constexpr int GS = 32;  // group size
static constexpr int SB = 4;
#ifndef MAGIC_MAX_R
#define MAGIC_MAX_R 1
#endif   // column blocks (of 16) per superblock

std::vector<torch::Tensor> int4_pack(torch::Tensor codes, torch::Tensor scales, torch::Tensor mins) {
  TORCH_CHECK(codes.dtype() == torch::kUInt8 && codes.dim() == 2);
  codes = codes.contiguous();
  scales = scales.to(torch::kFloat32).contiguous();
  mins = mins.to(torch::kFloat32).contiguous();
  const int64_t N = codes.size(0), K = codes.size(1);
  TORCH_CHECK(K % GS == 0, "K must be a multiple of 32");
  const int64_t G = K / GS, Npad = (N + 16 * SB - 1) / (16 * SB) * (16 * SB), NB = Npad / 16;
  auto packed = torch::zeros({NB, K / 8, 16}, torch::kInt32);
  auto sc = torch::zeros({NB, G, 16}, torch::kFloat32);
  auto mn = torch::zeros({NB, G, 16}, torch::kFloat32);
  const uint8_t* c = codes.data_ptr<uint8_t>();
  uint32_t* p = reinterpret_cast<uint32_t*>(packed.data_ptr<int32_t>());
  const float* s = scales.data_ptr<float>();
  const float* mi = mins.data_ptr<float>();
  float* so = sc.data_ptr<float>();
  float* mo = mn.data_ptr<float>();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t b = n / 16, cc = n % 16;
    for (int64_t kb = 0; kb < K / 8; ++kb) {
      uint32_t w = 0;
      for (int j = 0; j < 8; ++j) w |= uint32_t(c[n * K + kb * 8 + j] & 15) << (4 * j);
      p[(b * (K / 8) + kb) * 16 + cc] = w;
    }
    for (int64_t g = 0; g < G; ++g) {
      so[(b * G + g) * 16 + cc] = s[n * G + g];
      mo[(b * G + g) * 16 + cc] = mi[n * G + g];
    }
  }
  return {packed, sc, mn};
}

// R rows x CB column blocks of 16. Per (row, column) the operations are, for each group g in
// order: acc = 0; for k in the group in order: acc = fma(xs[k], w[k], acc); then
// t = (g == 0 ? 0 : t); t = fma(acc, scale, t); t = fma(xsum_g, min, t).
// Nothing depends on R, CB or the row's position, so the result is the same bits for any M.
// xs[k] = x[k] * 2^-(4*(k%8)) (exact), w[k] = code * 2^(4*(k%8)) for k%8 < 7 (exact), so
// xs[k]*w[k] == x[k]*code exactly (barring subnormal xs).
template <int R, int CB, bool MAGIC = (R <= MAGIC_MAX_R)>
static inline void tile(const float* __restrict xs, const float* __restrict xsum, int64_t K, int64_t G,
                        const uint32_t* __restrict codes, const float* __restrict sc, const float* __restrict mn,
                        float* y, int64_t ldy) {
  const int64_t cstride = (K / 8) * 16, sstride = G * 16;
  constexpr int V = 2 * CB;
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
        cv[v] = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes + (v / 2) * cstride + (g * 4 + kb) * 16 + (v % 2) * 8));
      const float* xk = xs + g * GS + kb * 8;
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        __m256 w[V];
#pragma GCC unroll 16
        for (int v = 0; v < V; ++v) {
          if (MAGIC && j < 5) {
            // 2^23 + code*16^j as float bits (the nibble lies inside the mantissa), minus 2^23:
            // the same exact value code*16^j as the conversion below, without the convert unit
            __m256i q = _mm256_or_si256(_mm256_and_si256(cv[v], _mm256_set1_epi32(0xF << (4 * j))), _mm256_set1_epi32(0x4B000000));
            w[v] = _mm256_sub_ps(_mm256_castsi256_ps(q), _mm256_set1_ps(8388608.f));
          } else {
            __m256i q = j < 7 ? _mm256_and_si256(cv[v], _mm256_set1_epi32(0xF << (4 * j))) : _mm256_srli_epi32(cv[v], 28);
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
      const __m256 s = _mm256_load_ps(sc + (v / 2) * sstride + g * 16 + (v % 2) * 8);
      const __m256 mm = _mm256_load_ps(mn + (v / 2) * sstride + g * 16 + (v % 2) * 8);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        float* yp = y + r * ldy + v * 8;
        __m256 t = g == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(yp);
        t = _mm256_fmadd_ps(acc[r][v], s, t);
        t = _mm256_fmadd_ps(_mm256_broadcast_ss(xsum + r * G + g), mm, t);
        _mm256_storeu_ps(yp, t);
      }
    }
  }
}

template <int R, int CB>
static inline void run_rows(const float* xs, const float* xsum, int64_t K, int64_t G, const uint32_t* codes,
                            const float* sc, const float* mn, float* y, int64_t ldy) {
  // one superblock (SB column blocks) for R rows, CB blocks at a time
  const int64_t cstride = (K / 8) * 16, sstride = G * 16;
  for (int b = 0; b < SB; b += CB)
    tile<R, CB>(xs, xsum, K, G, codes + b * cstride, sc + b * sstride, mn + b * sstride, y + b * 16, ldy);
}


torch::Tensor int4_mm(torch::Tensor x, torch::Tensor packed, torch::Tensor sc, torch::Tensor mn, int64_t N, int64_t rt) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2);
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1), G = K / GS;
  const int64_t NB = packed.size(0), Npad = NB * 16, NS = NB / SB;
  TORCH_CHECK(packed.size(1) == K / 8, "K mismatch");
  // per row: pre-scaled activations and group sums (fixed order, per row alone)
  auto xs_t = torch::empty({M, K}, torch::kFloat32);
  auto xsum_t = torch::empty({M, G}, torch::kFloat32);
  const float* xp = x.data_ptr<float>();
  float* xs = xs_t.data_ptr<float>();
  float* xsum = xsum_t.data_ptr<float>();
  static const float pw[8] = {1.f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 0x1p-16f, 0x1p-20f, 0x1p-24f, 1.f};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      float s = 0.f;
      for (int k = 0; k < GS; ++k) {
        const float v = xp[m * K + g * GS + k];
        s += v;
        xs[m * K + g * GS + k] = v * pw[k % 8];
      }
      xsum[m * G + g] = s;
    }
  auto y = torch::empty({M, Npad}, torch::kFloat32);
  float* yp = y.data_ptr<float>();
  const uint32_t* cp = reinterpret_cast<const uint32_t*>(packed.data_ptr<int32_t>());
  const float* sp = sc.data_ptr<float>();
  const float* mp = mn.data_ptr<float>();
  const int64_t cstride = (K / 8) * 16, sstride = G * 16;
  at::parallel_for(0, NS, 1, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const uint32_t* c = cp + s * SB * cstride;
      const float* scs = sp + s * SB * sstride;
      const float* mns = mp + s * SB * sstride;
      float* ys = yp + s * SB * 16;
      int64_t m = 0;
      // full tiles of 5 rows (or 4), then the remaining rows in one smaller tile; the per-row
      // arithmetic of every tile shape is the same (see tile()).
      if (rt == 5) for (; m + 5 <= M; m += 5) run_rows<5, 1>(xs + m * K, xsum + m * G, K, G, c, scs, mns, ys + m * Npad, Npad);
      for (; m + 4 <= M; m += 4) run_rows<4, 1>(xs + m * K, xsum + m * G, K, G, c, scs, mns, ys + m * Npad, Npad);
      const int64_t rem = M - m;
      const float* xr = xs + m * K;
      const float* xsr = xsum + m * G;
      float* yr = ys + m * Npad;
      switch (rem) {
        case 0: break;
        case 1: run_rows<1, 4>(xr, xsr, K, G, c, scs, mns, yr, Npad); break;
        case 2: run_rows<2, 2>(xr, xsr, K, G, c, scs, mns, yr, Npad); break;
        case 3: run_rows<3, 1>(xr, xsr, K, G, c, scs, mns, yr, Npad); break;
      }
    }
  });
  return Npad == N ? y : y.narrow(1, 0, N).contiguous();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int4_pack", &int4_pack);
  m.def("int4_mm", &int4_mm, py::arg("x"), py::arg("packed"), py::arg("sc"), py::arg("mn"), py::arg("N"), py::arg("rt") = 5);
}

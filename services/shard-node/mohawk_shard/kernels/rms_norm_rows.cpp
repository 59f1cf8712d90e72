// RMSNorm a row at a time: y = x / sqrt(mean(x^2) + eps) * w, each row alone in one fixed order
// (the squares summed in 16 lanes, lane d % 16 in order of d, the lanes added in a fixed tree).
// Built with the other kernels into one library (library.py); called by blocks.RMSNorm.
#include <omp.h>

#include <cmath>
#include <cstdint>

extern "C" {

// x, y [M, N] (rows contiguous), w [N].
void mohawk_rms_norm_rows(const float* x, int64_t M, int64_t N, const float* w, float eps, float* y,
                          int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static) if (M > 1)
  for (int64_t m = 0; m < M; ++m) {
    const float* row = x + m * N;
    float acc[16] = {};
    int64_t d = 0;
    for (; d + 16 <= N; d += 16)
      for (int l = 0; l < 16; ++l) acc[l] = std::fma(row[d + l], row[d + l], acc[l]);
    for (int l = 0; d + l < N; ++l) acc[l] = std::fma(row[d + l], row[d + l], acc[l]);
    for (int width = 8; width >= 1; width /= 2)
      for (int l = 0; l < width; ++l) acc[l] = acc[l] + acc[l + width];
    const float inverse = 1.0f / std::sqrt(acc[0] / static_cast<float>(N) + eps);
    float* out = y + m * N;
    for (int64_t i = 0; i < N; ++i) out[i] = row[i] * inverse * w[i];
  }
}

}  // extern "C"

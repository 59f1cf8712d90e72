// GGUF blocks -> the matmul kernels' layouts (int4_rows.cpp, int8_rows.cpp), once at load, straight
// from the memory-mapped file: llama.cpp's block layouts (ggml-common.h) decoded a row at a time
// into a thread's scratch and scattered into column blocks of 16 outputs, the threads splitting
// the column blocks (every byte of the output is written by one thread). What the numpy decoders
// (model_store/kquants.py, gguf_blocks.py) and `pack` give, bit for bit (tests/shard/kernels
// compare them): codes as the kernels hold them, scales and minimums rounded to fp16 the way
// numpy's astype rounds (to nearest even), Q6_K's int8 sub-block scales and fp16 super-block
// scales as stored. Returns -2 where a scale or minimum does not fit fp16 (the caller then keeps
// the slower path that holds them otherwise).
#include <immintrin.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

enum Type : int { kQ4_0 = 0, kQ4_1 = 1, kQ4_K = 2, kQ8_0 = 3, kQ5_0 = 4, kQ5_1 = 5, kQ5_K = 6, kQ6_K = 7 };
constexpr float kHalfMax = 65504.f;

inline float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
inline uint16_t to_half(float v) { return _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT); }

// One row decoded: codes as the kernel holds them (unsigned), a scale (and minimum) a group of 32
// in fp32, or Q6_K's int8 sub-block scales and fp16 super-block scales.
struct Row {
  std::vector<uint8_t> codes;
  std::vector<float> scales, mins;
  std::vector<int8_t> subs;
  std::vector<uint16_t> supers;
  std::vector<uint8_t> k_scales, k_mins;  // Q4_K/Q5_K: each group's 6-bit scale and minimum
  std::vector<uint16_t> k_d, k_dmin;      // and each super-block's fp16 d and dmin, as stored
};

// Q4_K/Q5_K: sub-block s's 6-bit scale and minimum from the 12 packed bytes
inline void k_scale_min(const uint8_t* q, int s, int* sc, int* m) {
  if (s < 4) {
    *sc = q[s] & 63;
    *m = q[s + 4] & 63;
  } else {
    *sc = (q[s + 4] & 0x0F) | ((q[s - 4] >> 2) & 0x30);
    *m = (q[s + 4] >> 4) | ((q[s] >> 2) & 0x30);
  }
}

void decode_row(const uint8_t* b, int type, int64_t K, Row& row) {
  switch (type) {
    case kQ4_0:
    case kQ4_1:
    case kQ8_0:
    case kQ5_0:
    case kQ5_1:
      for (int64_t g = 0; g < K / 32; ++g) {
        const float d = half(b);
        uint8_t* c = row.codes.data() + g * 32;
        if (type == kQ4_0 || type == kQ4_1) {
          const uint8_t* qs = b + (type == kQ4_0 ? 2 : 4);
          for (int j = 0; j < 16; ++j) c[j] = qs[j] & 0x0F, c[j + 16] = qs[j] >> 4;
          row.scales[g] = d;
          row.mins[g] = type == kQ4_0 ? -8.f * d : half(b + 2);
          b += type == kQ4_0 ? 18 : 20;
        } else if (type == kQ8_0) {
          for (int j = 0; j < 32; ++j) c[j] = static_cast<uint8_t>(b[2 + j] ^ 0x80);  // q + 128
          row.scales[g] = d;
          b += 34;
        } else {
          const int head = type == kQ5_0 ? 2 : 4;
          uint32_t qh;
          std::memcpy(&qh, b + head, 4);
          const uint8_t* qs = b + head + 4;
          for (int j = 0; j < 16; ++j) {
            c[j] = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
            c[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
          }
          row.scales[g] = d;
          if (type == kQ5_1) row.mins[g] = half(b + 2);
          b += type == kQ5_0 ? 22 : 24;
        }
      }
      break;
    case kQ4_K:
    case kQ5_K:
      for (int64_t sb = 0; sb < K / 256; ++sb) {
        const float d = half(b), dmin = half(b + 2);
        std::memcpy(&row.k_d[sb], b, 2);
        std::memcpy(&row.k_dmin[sb], b + 2, 2);
        const uint8_t* packed = b + 4;
        const uint8_t* qh = b + 16;
        const uint8_t* qs = b + (type == kQ4_K ? 16 : 48);
        for (int s = 0; s < 8; ++s) {
          int sc, m;
          k_scale_min(packed, s, &sc, &m);
          row.k_scales[sb * 8 + s] = static_cast<uint8_t>(sc);
          row.k_mins[sb * 8 + s] = static_cast<uint8_t>(m);
          row.scales[sb * 8 + s] = d * static_cast<float>(sc);
          row.mins[sb * 8 + s] = -(dmin * static_cast<float>(m));
          uint8_t* c = row.codes.data() + sb * 256 + s * 32;
          const int shift = 4 * (s % 2);
          for (int i = 0; i < 32; ++i) {
            c[i] = (qs[(s / 2) * 32 + i] >> shift) & 0x0F;
            if (type == kQ5_K) c[i] |= ((qh[i] >> s) & 1) << 4;
          }
        }
        b += type == kQ4_K ? 144 : 176;
      }
      break;
    case kQ6_K:
      for (int64_t sb = 0; sb < K / 256; ++sb) {
        const uint8_t* ql = b;
        const uint8_t* qh = b + 128;
        uint8_t* c = row.codes.data() + sb * 256;
        // weight h*128 + part*32 + i: its low nibble from ql[h*64 + (part % 2)*32 + i] (high
        // nibble for parts 2 and 3), its top two bits from qh[h*32 + i] at bit 2*part
        for (int h = 0; h < 2; ++h)
          for (int part = 0; part < 4; ++part) {
            const uint8_t* low = ql + h * 64 + (part % 2) * 32;
            const uint8_t* high = qh + h * 32;
            uint8_t* out = c + h * 128 + part * 32;
            const int low_shift = 4 * (part / 2), high_shift = 2 * part;
            for (int i = 0; i < 32; ++i)  // q, held with offset 32
              out[i] = static_cast<uint8_t>(((low[i] >> low_shift) & 0x0F) | (((high[i] >> high_shift) & 3) << 4));
          }
        std::memcpy(row.subs.data() + sb * 16, b + 192, 16);
        std::memcpy(row.supers.data() + sb, b + 208, 2);
        b += 210;
      }
      break;
    default:
      break;
  }
}

bool fits(const std::vector<float>& v) {
  for (float x : v)
    if (!(std::fabs(x) <= kHalfMax)) return false;
  return true;
}

}  // namespace

extern "C" {

// Rows of a GGUF tensor (`raw`, `row_bytes` a row; output row n is source row rows[n], or n where
// `rows` is null) -> N outputs of K inputs in the 4-bit kernel's layout (layout 4: codes
// uint32 [N/16, K/8, 16], scales and mins fp16 [N/16, K/32, 16]), the Q4_K kernel's (layout 5,
// q4k_rows.cpp: codes as layout 4's, `subs` uint8 [N/16, K/64, 64] the 6-bit scales and minimums,
// `scales` fp16 [N/16, K/256, 32] the super-blocks' d and dmin) or the 5-to-8-bit kernel's
// (layout 8: codes [N/16, K/4, 16], Q6_K's [N/16, K/8 + K/16, 16] in 6 bits, scales fp16
// [N/16, K/32 or K/256, 16], mins where the type has them, subs int8 [N/16, K/16, 16] for Q6_K).
// Returns 0, -1 for a type the layout does not take, -2 where a table does not fit fp16.
int mohawk_repack_blocks(const uint8_t* raw, int64_t row_bytes, const int64_t* rows, int64_t N, int64_t K, int type,
                         int layout, uint32_t* codes, uint16_t* scales, uint16_t* mins, int8_t* subs,
                         int num_threads) {
  const bool k_four = layout == 5;
  const bool four = type == kQ4_0 || type == kQ4_1 || type == kQ4_K;
  if (k_four ? type != kQ4_K : (layout == 4) != four) return -1;
  if (N % 16 != 0 || K % 32 != 0) return -1;
  if ((type == kQ4_K || type == kQ5_K || type == kQ6_K) && K % 256 != 0) return -1;
  const int64_t NB = N / 16, G = K / 32;
  const bool with_mins = four || type == kQ5_1 || type == kQ5_K;
  int status = 0;
#pragma omp parallel num_threads(num_threads)
  {
    Row row;
    row.codes.resize(K);
    row.scales.resize(G);
    row.mins.resize(G);
    row.subs.resize(K / 16);
    row.supers.resize(K / 256 + 1);
    row.k_scales.resize(G);
    row.k_mins.resize(G);
    row.k_d.resize(K / 256 + 1);
    row.k_dmin.resize(K / 256 + 1);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < NB; ++b) {
      for (int c = 0; c < 16; ++c) {
        const int64_t n = b * 16 + c;
        decode_row(raw + (rows != nullptr ? rows[n] : n) * row_bytes, type, K, row);
        if (type != kQ6_K && !k_four && (!fits(row.scales) || (with_mins && !fits(row.mins)))) {
#pragma omp atomic write
          status = -2;
        }
        if (four) {
          uint32_t* words = codes + b * (K / 8) * 16 + c;
          for (int64_t kb = 0; kb < K / 8; ++kb) {
            uint32_t word = 0;
            for (int j = 0; j < 8; ++j) word |= static_cast<uint32_t>(row.codes[kb * 8 + j]) << (4 * j);
            words[kb * 16] = word;
          }
        } else if (type == kQ6_K) {  // 6 bits a code (int8_rows.cpp): nibble words, then top-bit words
          uint32_t* words = codes + b * (K / 8 + K / 16) * 16 + c;
          for (int64_t p = 0; p < K / 8; ++p) {
            uint32_t word = 0;
            for (int j = 0; j < 4; ++j)
              word |= static_cast<uint32_t>((row.codes[p * 8 + j] & 15) | (row.codes[p * 8 + 4 + j] & 15) << 4) << (8 * j);
            words[p * 16] = word;
          }
          for (int64_t h = 0; h < K / 16; ++h) {
            uint32_t word = 0;
            for (int j = 0; j < 4; ++j)
              for (int t = 0; t < 4; ++t)
                word |= static_cast<uint32_t>(row.codes[h * 16 + 4 * t + j] >> 4 & 3) << (8 * j + 2 * t);
            words[(K / 8 + h) * 16] = word;
          }
        } else {
          uint32_t* words = codes + b * (K / 4) * 16 + c;
          for (int64_t w = 0; w < K / 4; ++w) std::memcpy(&words[w * 16], row.codes.data() + w * 4, 4);
        }
        if (k_four) {  // the file's integers and fp16 bits, laid out for q4k_rows.cpp
          uint8_t* sub = reinterpret_cast<uint8_t*>(subs) + b * G * 32;
          for (int64_t g = 0; g < G; ++g) {
            sub[(g / 2) * 64 + (g % 2) * 16 + c] = row.k_scales[g];
            sub[(g / 2) * 64 + 32 + 2 * c + g % 2] = row.k_mins[g];
          }
          for (int64_t s = 0; s < K / 256; ++s) {
            scales[(b * (K / 256) + s) * 32 + c] = row.k_d[s];
            scales[(b * (K / 256) + s) * 32 + 16 + c] = row.k_dmin[s];
          }
          continue;
        }
        if (type == kQ6_K) {
          for (int64_t s = 0; s < K / 16; ++s) subs[(b * (K / 16) + s) * 16 + c] = row.subs[s];
          for (int64_t s = 0; s < K / 256; ++s) std::memcpy(&scales[(b * (K / 256) + s) * 16 + c], &row.supers[s], 2);
          continue;
        }
        for (int64_t g = 0; g < G; ++g) {
          scales[(b * G + g) * 16 + c] = to_half(row.scales[g]);
          if (with_mins) mins[(b * G + g) * 16 + c] = to_half(row.mins[g]);
        }
      }
    }
  }
  return status;
}

// A Q8_0 table's rows -> the split head's halves (model/split_head.py): each code's u = q + 128
// split into its high nibble, held in the 4-bit kernel's layout (codes uint32 [N/16, K/8, 16];
// scales 16·d and minimums (7.5 − 128)·d, fp16 [N/16, K/32, 16]), and its low nibble, two a byte
// in `low` (uint8 [N, K/2], even column in the low half); `d` (fp16 [N, K/32]) gets the file's
// scales as stored. Returns 0, or -2 where 16·d or the minimum does not fit fp16.
int mohawk_split_q8_blocks(const uint8_t* raw, int64_t row_bytes, const int64_t* rows, int64_t N, int64_t K,
                           uint32_t* codes, uint16_t* scales, uint16_t* mins, uint8_t* low, uint16_t* d,
                           int num_threads) {
  if (N % 16 != 0 || K % 32 != 0) return -1;
  const int64_t NB = N / 16, G = K / 32;
  int status = 0;
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t b = 0; b < NB; ++b) {
    for (int c = 0; c < 16; ++c) {
      const int64_t n = b * 16 + c;
      const uint8_t* block = raw + (rows != nullptr ? rows[n] : n) * row_bytes;
      uint32_t* words = codes + b * (K / 8) * 16 + c;
      uint8_t* lows = low + n * (K / 2);
      for (int64_t g = 0; g < G; ++g, block += 34) {
        std::memcpy(&d[n * G + g], block, 2);
        const float scale = half(block);
        const float high_scale = 16.f * scale, high_min = (7.5f - 128.f) * scale;
        if (!(std::fabs(high_scale) <= kHalfMax) || !(std::fabs(high_min) <= kHalfMax)) {
#pragma omp atomic write
          status = -2;
        }
        scales[(b * G + g) * 16 + c] = to_half(high_scale);
        mins[(b * G + g) * 16 + c] = to_half(high_min);
        const uint8_t* q = block + 2;
        for (int w = 0; w < 4; ++w) {  // eight codes a word
          uint32_t word = 0;
          for (int j = 0; j < 8; ++j) word |= static_cast<uint32_t>((q[w * 8 + j] ^ 0x80) >> 4) << (4 * j);
          words[(g * 4 + w) * 16] = word;
        }
        for (int j = 0; j < 16; ++j)
          lows[g * 16 + j] = static_cast<uint8_t>(((q[2 * j] ^ 0x80) & 0x0F) | (((q[2 * j + 1] ^ 0x80) & 0x0F) << 4));
      }
    }
  }
  return status;
}

}  // extern "C"

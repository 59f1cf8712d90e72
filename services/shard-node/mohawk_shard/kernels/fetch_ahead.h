// Fetching a thread's next superblock of weights into L2 while it computes the current one.
//
// A superblock's weights come from DRAM once, in the first pass of its rows (a tile of up to four
// rows); the other passes read them from L2. Left to the hardware prefetchers, that first pass
// waited on DRAM: 32 rows of the 1.7B's gate/up ran at 344 GMAC/s with the weights of 24 layers
// against 403 with one layer's, always cached (a scratch timing on a Xeon with AVX-512 VNNI).
// So each pass also fetches a share of the next superblock's lines: pass p of P fetches the
// groups g with g % P == p, which spreads the fetches over all of the superblock's time (fetching
// it all in the first pass gained half as much: 355; with one row, 1 pass fetches everything).
// Prefetches change no arithmetic: the same bits.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace mohawk {

struct Spread {
  int64_t part = 0, parts = 0;  // parts == 0: no next superblock, nothing to fetch

  // pass `pass` over a superblock whose rows take `passes` passes; `has_next`: the thread has one
  static Spread of(int64_t pass, int64_t passes, bool has_next) { return {pass, has_next ? passes : 0}; }
  bool fetches(int64_t g) const { return parts != 0 && g % parts == part; }
};

// every 64-byte line of [p, p + bytes), into L2 (also attention's keys and values: attend_rows.cpp)
inline void fetch_lines(const void* p, int bytes) {
  const char* at = static_cast<const char*>(p);
#pragma GCC unroll 8
  for (int line = 0; line < bytes; line += 64) _mm_prefetch(at + line, _MM_HINT_T1);
}

}  // namespace mohawk

// Threads sharing a matmul's units of work (superblocks of columns): each runs a contiguous range
// of them in order, and a thread done with its own takes units from the far end of another's.
//
// A static split (OpenMP's schedule(static)) waits at its end for its slowest thread, and on a
// host whose cores other processes also use (the stages, NATS and the gateway of `mohawk up` on
// one machine) a thread loses its core for a fraction of a millisecond now and then: the whole
// call waited for it. A lone decode on the bundled model ran 15% slower beside a process that
// spun 0.6 ms every 4.6 ms (137.6 against 161.1 tok/s, in-process, two threads). OpenMP's
// schedule(dynamic, 1) lets the other thread take over but hands out units in no order per
// thread, which the next-superblock prefetches (fetch_ahead.h) and the hardware prefetchers rely
// on: 25% slower with nothing beside it. So each thread runs its own range front to back and then
// takes units one at a time from the back of the range with the most left. A range is one 64-bit
// word (next, end) changed by compare-and-swap, so an owner and a thief never take the same unit.
// Which thread computes a unit changes no arithmetic: the same bits on any number of threads.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace mohawk {

namespace unit_ranges {

constexpr int kMaxOwners = 256;

struct alignas(64) Range {
  std::atomic<uint64_t> word;  // next unit in the low 32 bits, end in the high 32
};

inline uint64_t pack(int64_t next, int64_t end) {
  return static_cast<uint64_t>(next) | (static_cast<uint64_t>(end) << 32);
}
inline int64_t next_of(uint64_t word) { return static_cast<int64_t>(word & 0xffffffffu); }
inline int64_t end_of(uint64_t word) { return static_cast<int64_t>(word >> 32); }

}  // namespace unit_ranges

// fn(unit, has_next) for every unit of [0, n), each exactly once, on `num_threads` threads;
// has_next: the calling thread will take unit + 1 next (a hint for its prefetches). n < 2^31.
template <class Fn>
void for_each_unit(int64_t n, int num_threads, Fn&& fn) {
  using namespace unit_ranges;
  if (n <= 0) return;
  Range ranges[kMaxOwners];
  constexpr auto order = std::memory_order_acq_rel;
#pragma omp parallel num_threads(num_threads)
  {
    const int t = omp_get_thread_num();
    const int owners = std::min(omp_get_num_threads(), kMaxOwners);
    if (t < owners) ranges[t].word.store(pack(n * t / owners, n * (t + 1) / owners), std::memory_order_relaxed);
#pragma omp barrier
    if (t < owners) {  // its own range, front to back
      Range& own = ranges[t];
      uint64_t word = own.word.load(std::memory_order_relaxed);
      while (next_of(word) < end_of(word)) {
        const int64_t unit = next_of(word), end = end_of(word);
        if (own.word.compare_exchange_weak(word, pack(unit + 1, end), order)) {
          fn(unit, unit + 1 < end);
          word = own.word.load(std::memory_order_relaxed);
        }
      }
    }
    for (;;) {  // then the others', one unit at a time from the back of the one with the most left
      int victim = -1;
      int64_t most = 0;
      for (int v = 0; v < owners; ++v) {
        const uint64_t word = ranges[v].word.load(std::memory_order_relaxed);
        if (end_of(word) - next_of(word) > most) most = end_of(word) - next_of(word), victim = v;
      }
      if (victim < 0) break;
      uint64_t word = ranges[victim].word.load(std::memory_order_relaxed);
      const int64_t next = next_of(word), end = end_of(word);
      if (next < end && ranges[victim].word.compare_exchange_strong(word, pack(next, end - 1), order))
        fn(end - 1, false);
    }
  }
}

}  // namespace mohawk

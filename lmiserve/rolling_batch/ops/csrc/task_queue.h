// Tasks of uneven cost over torch's threads: each thread takes the next task when it finishes one
// (at::parallel_for alone hands each thread a fixed share up front, so the thread with the longer
// sequences decides when the call ends).

#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace lmiserve {

// Calls run(next) once per thread, where next() returns the index of a task not yet taken
// (0 .. count-1, each exactly once over all threads) or -1 when none is left. `run` sets up its
// thread's scratch space once, then loops over next().
template <typename Run>
void for_each_task(int64_t count, const Run& run) {
  if (count <= 0) return;
  std::atomic<int64_t> taken{0};
  auto next = [&]() -> int64_t {
    const int64_t i = taken.fetch_add(1, std::memory_order_relaxed);
    return i < count ? i : -1;
  };
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), count);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) run(next);
  });
}

}  // namespace lmiserve

// Work over torch's threads that no thread waits for: at::parallel_for alone hands each thread a
// fixed share up front, so the thread with the longer sequences, or the one the operating system
// stopped, decides when the call ends. for_each_task: tasks of uneven cost, each thread taking the
// next when it finishes one. for_each_unit: units of equal cost in order, shares taken over.

#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

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

// A unit of work a thread has taken (-1: none left), and the end of the run of units it takes next
// unless another thread takes them first (units unit + 1 .. end - 1; none for a unit taken from
// another thread's share): the units whose memory it may request ahead.
struct Taken {
  int64_t unit, end;
};

// Units 0..count-1 of equal cost over torch's threads: each thread owns a contiguous share and
// takes it in order from the front; a thread whose share is done takes units from the back of
// the share with the most left. When the operating system stops a thread for a while (another
// process on its core), the other threads finish its share, where a fixed split would have them
// wait; each thread still walks its own weights in order and may request the next unit ahead.
// Calls run(take) once per share; take() returns a Taken. Which thread computes a unit never
// changes the unit's result.
template <typename Run>
void for_each_unit(int64_t count, const Run& run) {
  if (count <= 0) return;
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), count);
  // a share as (front << 32) | back: both ends move by compare-and-swap on one word
  auto pack = [](int64_t front, int64_t back) { return (static_cast<uint64_t>(front) << 32) | static_cast<uint64_t>(back); };
  auto front = [](uint64_t s) { return static_cast<int64_t>(s >> 32); };
  auto back = [](uint64_t s) { return static_cast<int64_t>(s & 0xffffffffu); };
  struct alignas(64) Share {  // a cache line each: one thread's taking does not slow another's
    std::atomic<uint64_t> ends;
  };
  std::unique_ptr<Share[]> slots(new Share[threads]);
  auto shares = [&](int64_t t) -> std::atomic<uint64_t>& { return slots[t].ends; };
  for (int64_t t = 0; t < threads; ++t) shares(t).store(pack(count * t / threads, count * (t + 1) / threads));
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      auto take = [&]() -> Taken {
        uint64_t s = shares(t).load(std::memory_order_relaxed);
        while (front(s) < back(s)) {
          if (shares(t).compare_exchange_weak(s, pack(front(s) + 1, back(s)), std::memory_order_relaxed))
            return {front(s), back(s)};
        }
        for (;;) {  // this share is done: the last unit of the share with the most left
          int64_t richest = -1, most = 0;
          for (int64_t u = 0; u < threads; ++u) {
            const uint64_t v = shares(u).load(std::memory_order_relaxed);
            if (back(v) - front(v) > most) most = back(v) - front(v), richest = u;
          }
          if (richest < 0) return {-1, 0};
          uint64_t v = shares(richest).load(std::memory_order_relaxed);
          if (front(v) < back(v) &&
              shares(richest).compare_exchange_weak(v, pack(front(v), back(v) - 1), std::memory_order_relaxed))
            return {back(v) - 1, back(v)};
        }
      };
      run(take);
    }
  });
}

}  // namespace lmiserve

// A kernel compiled for each count from 1 to N (rows of a tile, query heads of a KV head), picked
// by the count known at run time.

#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

namespace lmiserve {

// fn(std::integral_constant<int, n>{}) for 1 <= n <= N and its result; for any other n, fn is
// not called and the result is its type's default (nullptr for a kernel's address).
template <int N, typename Fn>
inline auto for_count(int64_t n, Fn&& fn) {
  using R = decltype(fn(std::integral_constant<int, 1>{}));
  return [&]<int... I>(std::integer_sequence<int, I...>) -> R {
    if constexpr (std::is_void_v<R>) {
      (void)((n == I + 1 && (fn(std::integral_constant<int, I + 1>{}), true)) || ...);
    } else {
      R result{};
      (void)((n == I + 1 && ((result = fn(std::integral_constant<int, I + 1>{})), true)) || ...);
      return result;
    }
  }(std::make_integer_sequence<int, N>{});
}

}  // namespace lmiserve

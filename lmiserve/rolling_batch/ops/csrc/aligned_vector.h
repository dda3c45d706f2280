// std::vector with 64-byte aligned storage: scratch that AMX tile loads read. A tile row that
// straddles two cache lines costs two loads; malloc only promises 16-byte alignment.

#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace lmiserve {

template <typename T, std::size_t Align = 64>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U, Align>&) noexcept {}
  template <typename U>
  struct rebind {
    using other = AlignedAllocator<U, Align>;
  };
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(Align))); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t(Align)); }
  template <typename U>
  bool operator==(const AlignedAllocator<U, Align>&) const noexcept { return true; }
  template <typename U>
  bool operator!=(const AlignedAllocator<U, Align>&) const noexcept { return false; }
};

template <typename T>
using aligned_vector = std::vector<T, AlignedAllocator<T>>;

}  // namespace lmiserve

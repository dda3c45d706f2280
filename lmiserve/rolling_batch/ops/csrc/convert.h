// Conversions between fp32 and the storage types, written so compilers can vectorize them.
// (c10's BFloat16 conversion handles NaN with a branch, which keeps loops scalar; the kernels
// are built with -ffast-math and never see NaN.)

#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

namespace lmiserve {

inline float to_f32(float v) { return v; }
inline float to_f32(double v) { return static_cast<float>(v); }
inline float to_f32(c10::Half v) { return static_cast<float>(v); }
inline float to_f32(c10::BFloat16 v) {
  uint32_t bits = static_cast<uint32_t>(v.x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

template <typename T>
inline T from_f32(float v) {
  return static_cast<T>(v);
}

template <>
inline c10::Half from_f32<c10::Half>(float v) { return static_cast<c10::Half>(v); }

template <>
inline c10::BFloat16 from_f32<c10::BFloat16>(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // round to nearest even
  c10::BFloat16 out;
  out.x = static_cast<uint16_t>(bits >> 16);
  return out;
}

// v rounded to T's precision, kept as fp32
template <typename T>
inline float round_to(float v) {
  return to_f32(from_f32<T>(v));
}

}  // namespace lmiserve

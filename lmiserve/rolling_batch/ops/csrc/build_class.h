// The CPU class this build of the kernels is compiled for, as its flags' macros say, by the names
// of lmiserve/cpu_isa.py: "avx512_bf16", "avx512", "avx2" or "portable".

#pragma once

namespace lmiserve {

inline const char* build_class() {
#if defined(__AVX512BF16__)
  return "avx512_bf16";
#elif defined(__AVX512F__)
  return "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
  return "avx2";
#else
  return "portable";
#endif
}

}  // namespace lmiserve

// How the kernel sources register their ops with torch: each op by one line after its function,
//
//   LMISERVE_OP(swiglu, "(Tensor gate_up) -> Tensor");          // run for CPU tensors
//   LMISERVE_ANY_OP(linear_bf16_isa, "() -> str");               // no tensors: whatever the key
//
// the op named as its function, in the kernels' namespace: lmiserve_cpu, or the one
// LMISERVE_OPS_NS names (the tests that build a few sources for another CPU class give them a
// namespace of their own).

#pragma once

#include <torch/library.h>

#ifndef LMISERVE_OPS_NS
#define LMISERVE_OPS_NS lmiserve_cpu
#endif
// in two steps, so that LMISERVE_OPS_NS is expanded before TORCH_LIBRARY_FRAGMENT pastes it
#define LMISERVE_OPS_IN(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)
#define LMISERVE_OP_WITH(key, fn, signature) \
  LMISERVE_OPS_IN(LMISERVE_OPS_NS, m) { m.def(#fn signature, torch::dispatch(c10::DispatchKey::key, &fn)); }
#define LMISERVE_OP(fn, signature) LMISERVE_OP_WITH(CPU, fn, signature)
#define LMISERVE_ANY_OP(fn, signature) LMISERVE_OP_WITH(CatchAll, fn, signature)

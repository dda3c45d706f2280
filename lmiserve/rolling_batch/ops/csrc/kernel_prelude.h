// torch's headers that the kernel sources include, compiled once per build into a precompiled
// header and put before each source (kernel_build.py): parsing them is most of a source's
// compile time. A source still includes what it uses itself; this adds nothing it lacks.

#ifndef LMISERVE_KERNEL_PRELUDE_H
#define LMISERVE_KERNEL_PRELUDE_H

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#endif

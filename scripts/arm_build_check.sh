#!/usr/bin/env bash
# Cross-compile every C++ kernel source (lmiserve/rolling_batch/ops/csrc/*.cpp) for each Arm CPU
# class (lmiserve.cpu_isa.COMPILE_FLAGS: neon, neon_bf16), with the flags load_kernels() adds
# (-O3 -fopenmp -ffast-math) and the ones torch.utils.cpp_extension passes (-std=c++20, -fPIC,
# -DTORCH_API_INCLUDE_EXTENSION_H), to object files. Fails on any compile error.
#
# Needs: aarch64-linux-gnu-g++ (Debian/Ubuntu: g++-aarch64-linux-gnu). Torch's headers come from
# ARM_TORCH (an unpacked aarch64 torch wheel: the directory holding torch/) when set, else from
# the torch installed in PYTHON (the headers are the same across architectures). Python's headers
# (torch/extension.h includes Python.h) come from PYTHON's sysconfig.
#
#   scripts/arm_build_check.sh                 # objects under build/arm/<class>/
#   ARM_TORCH=/tmp/armtorch scripts/arm_build_check.sh
#
# Environment: CXX (default aarch64-linux-gnu-g++), PYTHON (default .venv/bin/python or python3),
# OUT (default build/arm), ARM_CLASSES (default: the Arm classes, neon and neon_bf16).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
CXX=${CXX:-aarch64-linux-gnu-g++}
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
OUT=${OUT:-build/arm}

if ! command -v "$CXX" >/dev/null 2>&1; then
  echo "arm_build_check: $CXX not found (install g++-aarch64-linux-gnu); skipped" >&2
  exit 77
fi

if [ -n "${ARM_TORCH:-}" ]; then
  torch_inc="$ARM_TORCH/torch/include"
else
  torch_inc=$("$PYTHON" -c 'import torch.utils.cpp_extension as c; print(c.include_paths()[0])')
fi
py_inc=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
classes=${ARM_CLASSES:-$(PYTHONPATH="$root" "$PYTHON" -c \
  'from lmiserve.cpu_isa import COMPILE_FLAGS as F, ARM_CLASSES as A; print(" ".join(c for c in F if c in A and c != "portable"))')}

common=(-DTORCH_EXTENSION_NAME=lmiserve_cpu_kernels_arm -DTORCH_API_INCLUDE_EXTENSION_H
  -isystem "$torch_inc" -isystem "$torch_inc/torch/csrc/api/include" -isystem "$py_inc"
  -fPIC -std=c++20 -O3 -fopenmp -ffast-math)

"$CXX" --version | head -1
echo "torch headers: $torch_inc"
failed=0
for cls in $classes; do
  flags=$(PYTHONPATH="$root" "$PYTHON" -c "from lmiserve.cpu_isa import COMPILE_FLAGS; print(' '.join(COMPILE_FLAGS['$cls']))")
  mkdir -p "$OUT/$cls"
  echo "== $cls: $flags"
  for src in lmiserve/rolling_batch/ops/csrc/*.cpp; do
    obj="$OUT/$cls/$(basename "${src%.cpp}").o"
    log="$OUT/$cls/$(basename "${src%.cpp}").log"
    # shellcheck disable=SC2086
    if "$CXX" "${common[@]}" $flags -c "$src" -o "$obj" >"$log" 2>&1; then
      echo "ok    $cls $src"
    else
      echo "FAIL  $cls $src (log: $log)"
      grep -m 20 'error' "$log" || tail -20 "$log"
      failed=1
    fi
  done
done
if [ "$failed" != 0 ]; then
  echo "arm_build_check: compile errors" >&2
  exit 1
fi
echo "arm_build_check: every source compiled for: $classes"

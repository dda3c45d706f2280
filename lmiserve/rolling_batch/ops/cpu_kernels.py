"""The CPU ops' C++ kernels: building and loading them, and what this CPU can run.

The kernels (``csrc/``) are compiled on first use for the CPU class in use (``lmiserve.cpu_isa``:
the CPU's own, or a lower one forced by ``LMISERVE_CPU_ISA``) and cached (:mod:`.kernel_build`);
the probes below say which linear-layer path a bf16 weight takes here: oneDNN's packed layout, or
the C++ kernel's own on its vector code or on AMX tiles.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os

import torch

from ...cpu_isa import compile_flags, describe, isa_class
from .kernel_build import CSRC, build_library, sources_digest

log = logging.getLogger("lmiserve.ops")

_SOURCES = [
    CSRC / name
    for name in (
        "paged_attention.cpp",
        "prefill_attention.cpp",
        "prefill_attention_bf16.cpp",
        "prefill_attention_amx.cpp",
        "kv_write.cpp",
        "sampling.cpp",
        "fused.cpp",
        "lora.cpp",
        "linear.cpp",
        "linear_fma.cpp",
        "linear_amx.cpp",
        "lora_amx.cpp",
        "gguf_pack.cpp",
        "quant_linear.cpp",
        "quant_linear_avx2.cpp",
        "quant_linear_amx.cpp",
        "quant_linear_int8.cpp",
        "moe.cpp",
    )
]
PACK_BATCH_HINT = 32
"""The batch size oneDNN's blocked weight layout is chosen for."""


def kernel_cflags(cls: str) -> list[str]:
    """The C++ kernels' compile flags for a CPU class."""
    return ["-O3", "-fopenmp", "-ffast-math", *compile_flags(cls)]


def library_name(flags: list[str]) -> str:
    """The kernels' op library built with ``flags``. The name carries a hash of every source and
    header, of the flags and of where the sources are, so an edit, or a switch between two CPU
    classes, always rebuilds, and two copies of the sources (two installs, two checkouts) keep a
    build each instead of rebuilding the shared one in turn (its build file names the sources'
    paths)."""
    digest = hashlib.sha256(f"{sources_digest()} {' '.join(flags)} {CSRC}".encode()).hexdigest()[:10]
    return f"lmiserve_cpu_kernels_{digest}"


@functools.cache
def load_kernels() -> bool:
    """Compile (first time only) and load the C++ kernels; False if that is not possible."""
    if os.environ.get("LMISERVE_DISABLE_CPU_KERNELS") == "1":
        return False
    cls = isa_class()  # a forced class this CPU lacks is refused here, not turned into a fallback
    log.info("%s", describe())
    try:
        flags = kernel_cflags(cls)
        log.info("loading the CPU kernels (compiled on first use: about a minute on two cores)")
        build_library(library_name(flags), _SOURCES, flags, ldflags=["-fopenmp"])
        return hasattr(torch.ops.lmiserve_cpu, "paged_attention_decode")
    except Exception as exc:  # noqa: BLE001 - no compiler, no headers: use the reference ops
        log.warning("CPU attention kernels unavailable (%s); using the reference implementation", exc)
        return False


@functools.cache
def bf16_packing_supported() -> bool:
    """Whether oneDNN runs bf16 matrix products on this CPU (AVX512 BW/VL/DQ or AVX-NE-CONVERT);
    where it does not (an AVX2-only CPU), bf16 weights stay unpacked and ``F.linear`` runs them."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        supported = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # an older or newer torch without the probe: try it
        try:
            torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), PACK_BATCH_HINT)
            supported = True
        except RuntimeError:
            supported = False
    if not supported:
        log.info("this CPU has no oneDNN bf16 matrix products; bf16 weights are not prepacked for oneDNN")
    return supported


def can_pack(weight: torch.Tensor) -> bool:
    return weight.dtype == torch.bfloat16 and bf16_packing_supported()


@functools.cache
def bf16_linear_kernel() -> bool:
    """Whether the C++ bf16 linear kernel is built for this CPU class: AVX2+FMA, AVX-512F and
    AVX512_BF16 builds all have it (``linear_bf16_isa()`` says which path: the last multiplies
    bf16 pairs with ``vdpbf16ps``, and with FMAs where :mod:`.cpu_linear_tiles` measures them
    faster; the others widen the weights to fp32 in registers for FMAs).
    Where it is, bf16 linear layers run in it: on AMX tiles where the CPU has them and the
    operating system grants them (per forward of SmolLM2's linear layers, 5.7 ms against
    oneDNN's 5.9 at one row, 6.9 against 8.9 at 32, 90.8 against 103.2 at 1,024, 178 against 142
    at 2,048), else on its vector code (faster than oneDNN's at decode sizes)."""
    return load_kernels() and bool(torch.ops.lmiserve_cpu.linear_bf16_supported())


@functools.cache
def amx_tiles() -> bool:
    """Whether the C++ linear kernel runs on AMX tiles here (``csrc/linear_amx.cpp``): the amx
    class in use (a CPU with AMX, not forced lower) and an operating system that grants this
    process the tile state."""
    return isa_class() == "amx" and bf16_linear_kernel() and bool(torch.ops.lmiserve_cpu.linear_amx_usable())


def pack_lora_for_tiles(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A pool's A (slots, width, in) and B (slots, width, out) packed for ``lora_tiles_``: each
    slot's A, and its B^T with the width padded by zero columns to whole tiles (32), as weights of
    the linear kernel, stacked by slot."""
    slots, width, _ = a.shape
    padded = -(-width // 32) * 32
    bt = torch.zeros(slots, b.shape[2], padded, dtype=b.dtype)
    bt[:, :, :width] = b.transpose(1, 2)
    pack = torch.ops.lmiserve_cpu.pack_linear_bf16
    return torch.stack([pack(a[s]) for s in range(slots)]), torch.stack([pack(bt[s]) for s in range(slots)])

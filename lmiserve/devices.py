"""Choosing the device and the dtype a model runs with."""

from __future__ import annotations

import importlib.util
import logging

from .cpu_isa import cpu_info, isa_class

log = logging.getLogger("lmiserve.devices")

TORCH_DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
"""lmiserve's dtype names (``option.dtype``) → torch's, which vLLM also takes."""


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (``/proc/cpuinfo``'s ``flags`` on x86, ``Features`` on Arm)."""
    return cpu_info().features


def cpu_has_native_bf16() -> bool:
    """bf16 matrix multiply in hardware: AVX512_BF16 or AMX, in the CPU class in use (a class
    forced lower, ``LMISERVE_CPU_ISA=avx512`` say, has none)."""
    return isa_class() in ("avx512_bf16", "amx")


def npu_available() -> bool:
    """True when torch_npu is installed and sees a device. Imports torch_npu only if installed."""
    if importlib.util.find_spec("torch_npu") is None:
        return False
    try:
        import torch
        import torch_npu  # noqa: F401

        return bool(torch.npu.is_available())  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a broken install counts as absent
        return False


def resolve_device(spec: str) -> str:
    """``auto``/``cpu``/``cuda[:N]``/``npu[:N]`` -> a concrete torch device string."""
    import torch

    if spec == "auto":
        if npu_available():
            return "npu:0"
        if torch.cuda.is_available():
            return "cuda:0"
        return "cpu"
    if spec in ("cuda", "npu"):
        return f"{spec}:0"
    return spec


def resolve_dtype(spec: str, device: str) -> tuple[str, str]:
    """The dtype name to use (fp32/fp16/bf16) and why."""
    import torch

    if spec != "auto":
        return spec, "configured by option.dtype"
    if device.startswith("cuda"):
        if torch.cuda.is_bf16_supported():
            return "bf16", "auto: the GPU supports bf16"
        return "fp16", "auto: the GPU lacks bf16"
    if device.startswith("npu"):
        return "fp16", "auto: fp16 is the NPU's native dtype"
    if cpu_has_native_bf16():
        return "bf16", "auto: this CPU multiplies bf16 natively (AVX512_BF16/AMX)"
    return "fp32", "auto: this CPU has no native bf16"


def torch_dtype(name: str):  # type: ignore[no-untyped-def]
    import torch

    return getattr(torch, TORCH_DTYPE_NAMES[name])

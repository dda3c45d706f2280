"""The small set of device operations the models are written against.

``reference`` (plain torch, CPU and CUDA) defines what each op means; ``cpu`` is tuned for
CPUs; ``cuda`` runs Triton kernels on CUDA GPUs (and, under ``TRITON_INTERPRET=1``, on the CPU
for tests); ``npu`` runs Ascend's fused kernels through torch_npu (imported only when chosen).
Models call only these ops (plus plain tensor indexing), so a device is supported by
implementing them. :class:`.interface.Ops` is the interface every implementation and wrapper
provides; every implementation sits behind the same contract check (:mod:`.contract`).
"""

from __future__ import annotations

from .contract import CheckedOps, ContractError, limits_for
from .interface import Ops
from .metadata import AttentionMetadata, PagedAttentionInputs
from .reference import LinearWeight, ReferenceOps

__all__ = [
    "AttentionMetadata",
    "CheckedOps",
    "ContractError",
    "LinearWeight",
    "Ops",
    "PagedAttentionInputs",
    "ReferenceOps",
    "create_ops",
    "select_ops",
]

OPS_NAMES = ("auto", "reference", "cpu", "cuda", "npu")


def create_ops(
    device: str, name: str = "auto", deterministic: bool = False, dense_rows: int = 0, int8_activations: bool = False
) -> Ops:
    """The implementation for ``device``: ``auto`` picks the tuned one. ``deterministic``: prefer
    kernels whose result for a row does not depend on the other rows. ``dense_rows``: the CPU
    ops' :attr:`~.cpu.CpuOps.dense_rows`. ``int8_activations``: block weights multiply
    activations quantized to int8 (the CPU and reference ops; elsewhere a ValueError)."""
    if name not in OPS_NAMES:
        raise ValueError(f"unknown ops {name!r} (one of {', '.join(OPS_NAMES)})")
    if name == "auto":
        name = "cpu" if device == "cpu" else "npu" if device.startswith("npu") else "reference"
        if device.startswith("cuda"):
            name = _cuda_or_reference()
    if name == "cpu":
        from .cpu import CpuOps

        return CpuOps(row_invariant=deterministic, dense_rows=dense_rows, int8_activations=int8_activations)
    if int8_activations and name != "reference":
        raise ValueError(f"option.quantize_activations=int8 runs on CPUs (the C++ block kernels), not {device}")
    if name == "cuda":
        _triton_cache_dir()
        from .cuda import CudaOps
        from .triton_kernels import compiles

        compiles.install()

        return CudaOps()
    if name == "npu":
        from .npu import NpuOps

        return NpuOps()
    ops = ReferenceOps()
    ops.int8_activations = int8_activations
    return ops


def select_ops(
    device: str, name: str = "auto", deterministic: bool = False, dense_rows: int = 0, int8_activations: bool = False
) -> CheckedOps:
    """The ops for ``device``, behind the contract check (the NPU's limits for NPU ops);
    ``deterministic``: a token's result does not depend on the rest of the step."""
    ops = create_ops(device, name, deterministic, dense_rows, int8_activations)
    limits = limits_for("npu" if ops.name == "npu" else device)
    if deterministic:
        from .batch_invariant import BatchInvariantOps

        return CheckedOps(BatchInvariantOps(ops), limits)
    return CheckedOps(ops, limits)


def _cuda_or_reference() -> str:
    """``cuda`` where Triton is importable (it ships with CUDA builds of torch), else ``reference``."""
    import importlib.util
    import logging

    if importlib.util.find_spec("triton") is not None:
        return "cuda"
    logging.getLogger("lmiserve.ops").warning("Triton is not installed: the CUDA device runs the reference ops")
    return "reference"


TRITON_CACHE = "~/.cache/lmiserve/triton"
"""Where compiled Triton kernels are kept between starts, unless ``TRITON_CACHE_DIR`` says."""


def _triton_cache_dir() -> None:
    import os

    os.environ.setdefault("TRITON_CACHE_DIR", os.path.expanduser(TRITON_CACHE))

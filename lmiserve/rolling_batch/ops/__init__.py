"""The small set of device operations the models are written against.

``reference`` (plain torch, CPU and CUDA) defines what each op means; ``cpu`` is tuned for
CPUs. Models call only these ops (plus plain tensor indexing), so a device is supported by
implementing them.
"""

from __future__ import annotations

from .reference import LinearWeight, ReferenceOps

__all__ = ["LinearWeight", "ReferenceOps", "select_ops"]


def select_ops(device: str, name: str = "auto") -> ReferenceOps:
    """The ops for ``device``: ``auto`` picks the tuned implementation for it."""
    if name == "reference":
        return ReferenceOps()
    if device == "cpu":
        from .cpu import CpuOps

        return CpuOps()
    if device.startswith("npu"):
        raise NotImplementedError("the NPU ops are not part of this build")
    return ReferenceOps()

"""Asking Linux for transparent huge pages on large CPU tensors (the KV cache).

Blocks of the paged cache are scattered over gigabytes; with 4 KiB pages nearly every block
read misses the TLB (and in a virtual machine each miss walks two page tables). Huge pages
make the whole cache reachable from the TLB. Works where THP is in ``madvise`` or ``always``
mode; elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import logging

import torch

log = logging.getLogger("lmiserve.engine")

MADV_HUGEPAGE = 14
HUGE = 2 * 1024 * 1024


def advise_huge_pages(tensor: torch.Tensor) -> bool:
    """madvise(MADV_HUGEPAGE) over the tensor's memory; call before the memory is first written."""
    if tensor.device.type != "cpu":
        return False
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    aligned = (start + HUGE - 1) // HUGE * HUGE
    length = (end - aligned) // HUGE * HUGE
    if length <= 0:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        ok = libc.madvise(ctypes.c_void_p(aligned), ctypes.c_size_t(length), MADV_HUGEPAGE) == 0
    except OSError:
        return False
    if not ok:
        log.debug("madvise(MADV_HUGEPAGE) failed: errno %d", ctypes.get_errno())
    return ok

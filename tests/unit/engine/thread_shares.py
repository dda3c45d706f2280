"""A kernel's outputs however torch's threads share its work."""

from __future__ import annotations

from collections.abc import Callable

import torch


def assert_same_however_shared(product: Callable[[], torch.Tensor], calls: int = 20) -> None:
    """``product()`` with more threads than cores (the system stops some while others finish
    their shares) gives, call after call, exactly what one thread computes."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = product()
        torch.set_num_threads(max(4, 2 * threads))
        for _ in range(calls):
            assert torch.equal(product(), alone)
    finally:
        torch.set_num_threads(threads)

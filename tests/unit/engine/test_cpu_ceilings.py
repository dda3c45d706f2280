"""The CPU's ceilings: each measured figure is a positive rate, and said in words."""

from __future__ import annotations

import torch

from lmiserve.rolling_batch.ops import cpu_ceilings


def test_ceilings_are_positive_rates_and_described() -> None:
    ceilings = cpu_ceilings.Ceilings(
        cpu_ceilings.read_bandwidth(8 << 20),
        {"fp32": cpu_ceilings.matmul_flops(torch.float32, (16, 64, 64))},
    )
    assert ceilings.read_bytes_per_s > 0 and ceilings.flops["fp32"] > 0
    text = ceilings.describe()
    assert text.startswith("memory reads ") and "fp32" in text and "GFLOP/s" in text

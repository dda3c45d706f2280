"""The argmax and log-sum-exp kernel (``csrc/sampling.cpp``) in each of its builds: this CPU's, and
AVX2 + FMA only and plain C++ in builds of their own (their ops under a namespace of their own),
against torch's argmax and logsumexp; a row holding a NaN or +inf gets a NaN log-sum-exp."""

from __future__ import annotations

import functools
import importlib.util
import math

import pytest
import torch

from lmiserve.devices import cpu_flags
from lmiserve.rolling_batch.ops.cpu_kernels import load_kernels

pytestmark = pytest.mark.skipif(
    not load_kernels() or importlib.util.find_spec("ninja") is None, reason="the CPU kernels do not build here"
)
BUILDS = {"avx2": ["-mavx2", "-mfma", "-mf16c"], "portable": []}


@functools.cache
def build(isa: str):  # type: ignore[no-untyped-def]
    from lmiserve.rolling_batch.ops.kernel_build import CSRC, build_library

    namespace = f"lmiserve_sampling_{isa}"
    build_library(
        f"lmiserve_sampling_kernels_{isa}",
        [CSRC / "sampling.cpp"],
        ["-O3", "-fopenmp", "-ffast-math", f"-DLMISERVE_OPS_NS={namespace}", *BUILDS[isa]],
        ldflags=["-fopenmp"],
        precompiled=False,
    )
    return getattr(torch.ops, namespace).argmax_logsumexp


@pytest.fixture(params=["native", *sorted(BUILDS)])
def kernel(request):  # type: ignore[no-untyped-def]
    if request.param == "native":
        return torch.ops.lmiserve_cpu.argmax_logsumexp
    if request.param == "avx2" and "avx2" not in cpu_flags():
        pytest.skip("this CPU has no AVX2")
    return build(request.param)


@pytest.mark.parametrize("vocab", [1, 7, 16, 1000, 49155])
def test_rows_give_torchs_argmax_and_logsumexp(kernel, vocab: int) -> None:
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(vocab)) * 8
    logits[1] = -3.0  # every value the maximum: the first wins
    if vocab > 2:
        logits[2, vocab - 1] = 100.0  # in the tail past the last whole vector
        logits[3, vocab // 2] = logits[3, vocab // 3] = 90.0  # two maxima: the first
    idx, lse = kernel(logits)
    assert idx.tolist() == logits.argmax(-1).tolist()
    torch.testing.assert_close(lse, torch.logsumexp(logits.double(), -1).float(), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.nan])
@pytest.mark.parametrize("where", [0, 21, 999])
def test_a_nan_or_inf_logit_makes_its_row_not_finite(kernel, bad: float, where: int) -> None:
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(1))
    logits[1, where] = bad
    logits[2, where] = -math.inf  # minus infinity is a token that cannot come: the row is finite
    idx, lse = kernel(logits)
    assert math.isnan(lse[1].item())
    assert math.isfinite(lse[0].item()) and math.isfinite(lse[2].item())
    assert idx[0].item() == logits[0].argmax().item() and idx[2].item() == logits[2].argmax().item()
    torch.testing.assert_close(lse[2], torch.logsumexp(logits[2].double(), -1).float(), rtol=2e-6, atol=2e-6)

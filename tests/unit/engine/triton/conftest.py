"""The Triton kernels' tests: compiled on a CUDA GPU where there is one, else on the CPU
through Triton's interpreter (``TRITON_INTERPRET=1``, set by the top-level conftest before
anything imports Triton). Without Triton they are not collected."""

import importlib.util

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    from .interpreter_patching import skip_nested_patches

    skip_nested_patches()


@pytest.fixture(scope="session")
def kernel_device() -> str:
    return "cuda:0" if torch.cuda.is_available() else "cpu"

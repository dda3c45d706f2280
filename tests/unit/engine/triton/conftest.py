"""The Triton kernels run on the CPU through Triton's interpreter in these tests.

The interpreter is chosen when a kernel is defined, so the variable is set here, before any
test module imports the kernels; without Triton the tests are skipped."""

import os

import pytest

os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")

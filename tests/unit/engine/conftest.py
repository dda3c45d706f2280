import importlib
import sys
from pathlib import Path

import pytest

FAKES = Path(__file__).resolve().parents[2] / "fakes"


@pytest.fixture
def fake_npu(monkeypatch):
    """The semantic torch_npu fake, importable for one test only."""
    monkeypatch.syspath_prepend(str(FAKES))
    sys.modules.pop("torch_npu", None)
    torch_npu = importlib.import_module("torch_npu")
    assert torch_npu.__version__.endswith("cpu-semantic-fake")
    torch_npu.CALLS.clear()
    yield torch_npu
    sys.modules.pop("torch_npu", None)

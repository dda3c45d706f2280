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


@pytest.fixture(scope="module")
def tp_models(tmp_path_factory):
    """Tiny checkpoints of the layouts tensor parallelism splits differently."""
    from . import tp_helpers

    root = tmp_path_factory.mktemp("tp-models")
    build = tp_helpers.build
    return {
        "gqa": build(root / "gqa", "llama"),  # 4 query heads, 2 KV heads
        "replicated": build(root / "replicated", "qwen2", num_key_value_heads=1),  # biases, 1 KV head
        "wide": build(root / "wide", "llama", num_attention_heads=8, num_key_value_heads=2),  # head_dim 8
        "qwen3": build(root / "qwen3", "qwen3", attention_bias=True),  # q/k norms, o_proj bias
    }


@pytest.fixture(params=["serial", "overlapped"])
def scheduling(request, monkeypatch):
    """Engines from ``make_engine`` step serially, then overlapped (``option.async_scheduling``)."""
    from . import engine_helpers

    monkeypatch.setattr(engine_helpers, "ASYNC_SCHEDULING", "true" if request.param == "overlapped" else "false")
    return request.param

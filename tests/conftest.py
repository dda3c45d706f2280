import os
from pathlib import Path

import pytest

from lmiserve.cpu_isa import apply_torch_env

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Triton kernels run through Triton's interpreter where no CUDA GPU is driven (read when Triton
# is first imported, so before any test module imports it)
if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "" or not any(
    os.path.exists(p) for p in ("/dev/nvidia0", "/dev/nvidiactl")
):
    os.environ.setdefault("TRITON_INTERPRET", "1")

# LMISERVE_CPU_ISA (a CPU class forced below this CPU's) holds torch's and oneDNN's own kernels
# to that class too: read when torch is first imported
apply_torch_env()


def pytest_sessionstart(session):
    """The engine's CPU kernels for this CPU's class, built (the first time) before any test runs, so
    that no test server's start-up waits on the compiler. Not in pytest-xdist's workers (their
    controller built them) nor in vLLM's environment (its tests do not run our engine)."""
    import importlib.util

    if hasattr(session.config, "workerinput") or importlib.util.find_spec("vllm") is not None:
        return
    from lmiserve.rolling_batch.ops.cpu_kernels import load_kernels

    load_kernels()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test's report ends with the last lines of every test server running when it
    failed or stopped during it: what the server said about a request that failed is there, not
    only the client's side."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        from tests.server_process import ServerProcess

        for server in ServerProcess.started:
            if server.stopped_at is not None and server.stopped_at < call.start:
                continue
            report.sections.append((f"server log, port {server.port} (last lines)", server.log_tail()))


@pytest.fixture(scope="session")
def run_shared_tmp_path(tmp_path_factory) -> Path:
    """A directory this test run's processes all see (pytest-xdist's workers each have a temporary
    directory of their own beside it), and no other run."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return tmp_path_factory.getbasetemp()
    shared = tmp_path_factory.getbasetemp().parent / f"run-{run}"
    shared.mkdir(exist_ok=True)
    return shared


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    from tests.tiny_models import build_model

    return build_model(tmp_path_factory.mktemp("tiny-llama") / "model", "llama")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The embedded default model as a Hugging Face directory (converted once, then cached)."""
    from lmiserve.model_store import resolve_model

    return resolve_model(None, Path("/nonexistent-model-dir"))


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict:
    """Tiny random Llama, Qwen2 and Qwen3 directories (built once per session)."""
    from tests.tiny_models import build_model

    root = tmp_path_factory.mktemp("tiny-models")
    return {arch: build_model(root / arch, arch, seed=1) for arch in ("llama", "qwen2", "qwen3")}


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _npu_available() -> bool:
    from lmiserve.devices import npu_available

    return npu_available()


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` or ``npu`` run only where that device is present."""
    checks = {"cuda": _cuda_available, "npu": _npu_available}
    present: dict[str, bool] = {}
    for item in items:
        for name, check in checks.items():
            if item.get_closest_marker(name) is None:
                continue
            if name not in present:
                present[name] = check()
            if not present[name]:
                item.add_marker(pytest.mark.skip(reason=f"needs {'an NPU' if name == 'npu' else 'a CUDA GPU'}"))

"""Starting vLLM: its CPU tuning, and its engine arguments from serving.properties (typed without
vLLM here; tests/vllm checks the same with vLLM's own parser)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from lmiserve.config import load_settings
from lmiserve.rolling_batch.process.client import EngineStartError
from lmiserve.rolling_batch.vllm.cpu import RESERVE_FROM_CPUS, cpu_tuning, find_iomp
from lmiserve.rolling_batch.vllm.engine_args import engine_kwargs, taken
from lmiserve.serving.handler_model import ModelLoadError
from lmiserve.serving.model_factory import build_model

TCMALLOC = "libtcmalloc_minimal.so.4"
IOMP = "/env/lib/libiomp5.so"


def test_cpu_tuning_on_a_small_machine():
    tuning = cpu_tuning({}, 2, TCMALLOC, IOMP, 2 * 2**30)
    assert tuning.env == {"LD_PRELOAD": f"{TCMALLOC}:{IOMP}", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert tuning.kv_cache_memory_bytes == 2 * 2**30
    assert tuning.describe() == (
        f"LD_PRELOAD tcmalloc ({TCMALLOC}) and Intel OpenMP ({IOMP}); "
        "VLLM_CPU_NUM_OF_RESERVED_CPU=0 (all 2 CPUs compute); KV cache 2.00 GiB"
    )


def test_cpu_tuning_leaves_what_the_user_set():
    environ = {"LD_PRELOAD": "/x/libjemalloc.so /x/libgomp.so", "VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}
    tuning = cpu_tuning(environ, 2, TCMALLOC, IOMP, 2**30)
    assert tuning.env == {}
    environ = {"LD_PRELOAD": "/x/libfoo.so", "VLLM_CPU_KVCACHE_SPACE": "8"}
    tuning = cpu_tuning(environ, 2, TCMALLOC, IOMP, 2**30)
    assert tuning.env["LD_PRELOAD"] == f"{TCMALLOC}:/x/libfoo.so:{IOMP}"
    assert tuning.kv_cache_memory_bytes is None  # vLLM's own variable sizes the cache


def test_cpu_tuning_on_a_large_machine_without_the_libraries():
    tuning = cpu_tuning({}, RESERVE_FROM_CPUS, None, None, None)
    assert tuning.env == {} and tuning.kv_cache_memory_bytes is None
    assert tuning.describe() == "no tcmalloc found (apt-get install libtcmalloc-minimal4)"


def test_intel_openmp_is_found_where_its_wheel_puts_it(tmp_path):
    assert find_iomp(str(tmp_path)) is None
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    assert find_iomp(str(tmp_path)) == str(tmp_path / "lib" / "libiomp5.so")


@dataclass
class Args:
    """The fields of vLLM's AsyncEngineArgs these tests use."""

    model: str = ""
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = False
    async_scheduling: bool | None = None
    seed: int = 0
    speculative_config: dict | None = None


def settings_for(tmp_path: Path, properties: str, env: dict | None = None):
    (tmp_path / "serving.properties").write_text("option.rolling_batch=vllm\n" + properties)
    return load_settings(tmp_path, env=env or {})


def test_settings_and_passed_options_become_engine_args(tmp_path):
    settings = settings_for(
        tmp_path,
        "option.pipeline_parallel_degree=2\noption.tensor_parallel_degree=4\noption.enforce_eager=true\n"
        "option.distributed_executor_backend=ray\noption.seed=3\noption.my_handler_option=x\n",
    )
    kwargs, ignored = taken(engine_kwargs(settings, tmp_path, Args), Args)
    assert kwargs == {
        "model": str(tmp_path),
        "tensor_parallel_size": 4,
        "pipeline_parallel_size": 2,
        "distributed_executor_backend": "ray",
        "enforce_eager": True,
        "seed": 3,
    }
    assert "dtype" in ignored and "my_handler_option" not in ignored
    settings = settings_for(tmp_path, "option.async_scheduling=false\n")
    assert engine_kwargs(settings, tmp_path, Args)["async_scheduling"] is False
    assert "async_scheduling" not in engine_kwargs(settings_for(tmp_path, ""), tmp_path, Args)  # auto: vLLM's default


def test_vllms_spelling_of_lmiserves_settings(tmp_path):
    settings = settings_for(tmp_path, "option.max_num_batched_tokens=1024\n")
    assert engine_kwargs(settings, tmp_path, Args)["max_num_batched_tokens"] == 1024  # lmiserve's is unset
    settings = settings_for(
        tmp_path, "option.max_num_batched_tokens=1024\noption.max_rolling_batch_prefill_tokens=512\n"
    )
    with pytest.raises(EngineStartError, match="set option.max_rolling_batch_prefill_tokens only"):
        engine_kwargs(settings, tmp_path, Args)
    settings = settings_for(tmp_path, "option.pipeline_parallel_size=2\n")
    with pytest.raises(EngineStartError, match=r"option.pipeline_parallel_size=2 disagrees with .*degree=1"):
        engine_kwargs(settings, tmp_path, Args)


def test_speculative_decoding_reaches_vllm_as_its_own_speculative_config(tmp_path):
    spec = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "adaptive": false}'
    kwargs, _ = taken(
        engine_kwargs(settings_for(tmp_path, f"option.speculative_config={spec}\n"), tmp_path, Args), Args
    )
    assert kwargs["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
    # LMI's draft model and length, as vLLM names them
    text = "option.speculative_draft_model=/drafts/small\noption.speculative_length=6\n"
    kwargs = engine_kwargs(settings_for(tmp_path, text), tmp_path, Args)
    assert kwargs["speculative_config"] == {"model": "/drafts/small", "num_speculative_tokens": 6}
    assert "speculative_config" not in engine_kwargs(settings_for(tmp_path, ""), tmp_path, Args)


def test_pipeline_parallelism_needs_the_vllm_backend(tmp_path):
    (tmp_path / "serving.properties").write_text("option.rolling_batch=lmi\noption.pipeline_parallel_degree=2\n")
    with pytest.raises(ModelLoadError, match="option.pipeline_parallel_degree=2 needs option.rolling_batch=vllm"):
        build_model(load_settings(tmp_path, env={}))

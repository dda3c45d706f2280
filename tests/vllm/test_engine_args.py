"""serving.properties → vLLM's own AsyncEngineArgs, past one machine included: lmiserve's names,
options passed through to vLLM typed by vLLM's parser, and the refusals. Nothing starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmiserve.config import load_settings
from lmiserve.rolling_batch.process.client import EngineStartError
from lmiserve.rolling_batch.vllm.engine_args import engine_kwargs, taken

from .real_vllm import needs_vllm

pytestmark = needs_vllm


def engine_args(tmp_path: Path, properties: str, env: dict | None = None):
    from vllm import AsyncEngineArgs

    (tmp_path / "serving.properties").write_text("option.rolling_batch=vllm\n" + properties)
    settings = load_settings(tmp_path, env=env or {})
    kwargs, _ = taken(engine_kwargs(settings, tmp_path, AsyncEngineArgs), AsyncEngineArgs)
    return AsyncEngineArgs(**kwargs)


def test_several_nodes_pipeline_and_tensor_parallel_over_ray(tmp_path):
    args = engine_args(
        tmp_path,
        "option.tensor_parallel_degree=8\noption.pipeline_parallel_degree=2\n"
        "option.distributed_executor_backend=ray\noption.enforce_eager=true\n"
        "option.max_rolling_batch_prefill_tokens=4096\noption.dtype=bf16\n",
    )
    assert (args.tensor_parallel_size, args.pipeline_parallel_size) == (8, 2)
    assert args.distributed_executor_backend == "ray"
    assert args.enforce_eager is True and args.max_num_batched_tokens == 4096 and args.dtype == "bfloat16"


def test_environment_variables_fill_what_the_file_leaves_unset(tmp_path):
    env = {"OPTION_PIPELINE_PARALLEL_DEGREE": "4", "OPTION_TENSOR_PARALLEL_DEGREE": "3"}
    args = engine_args(tmp_path, "option.tensor_parallel_degree=2\n", env)
    assert (args.tensor_parallel_size, args.pipeline_parallel_size) == (2, 4)


def test_passed_options_are_typed_by_vllms_parser(tmp_path):
    args = engine_args(
        tmp_path,
        "option.max_num_batched_tokens=1536\noption.enable_chunked_prefill=false\noption.seed=7\n"
        "option.cpu_offload_gb=1.5\noption.tokenizer_mode=slow\n",
    )
    assert args.max_num_batched_tokens == 1536 and args.enable_chunked_prefill is False
    assert (args.seed, args.cpu_offload_gb, args.tokenizer_mode) == (7, 1.5, "slow")


def test_vllms_name_for_one_of_lmiserves_settings_must_agree(tmp_path):
    with pytest.raises(
        EngineStartError, match=r"option.tensor_parallel_size=2 disagrees with .*tensor_parallel_degree=1"
    ):
        engine_args(tmp_path, "option.tensor_parallel_size=2\n")
    args = engine_args(tmp_path, "option.tensor_parallel_degree=2\noption.tensor_parallel_size=2\n")
    assert args.tensor_parallel_size == 2


def test_a_value_vllm_refuses_names_the_option(tmp_path):
    reason = r"option.max_num_batched_tokens=lots is not a valid vLLM engine argument: argument --max-num-batched-tokens: invalid"
    with pytest.raises(EngineStartError, match=reason):
        engine_args(tmp_path, "option.max_num_batched_tokens=lots\n")


def test_speculative_decoding_is_vllms_speculative_config(tmp_path):
    args = engine_args(tmp_path, 'option.speculative_config={"method": "ngram", "prompt_lookup_max": 4}\n')
    assert args.speculative_config == {"method": "ngram", "prompt_lookup_max": 4, "num_speculative_tokens": 5}
    args = engine_args(tmp_path, "option.speculative_draft_model=/drafts/small\noption.speculative_length=3\n")
    assert args.speculative_config == {"model": "/drafts/small", "num_speculative_tokens": 3}

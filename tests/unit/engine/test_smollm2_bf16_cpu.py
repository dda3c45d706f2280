"""The engine in bf16 on the CPU (oneDNN products, the C++ decode and prefill attention) gives
transformers' greedy tokens on the embedded SmolLM2, up to near-ties of its top two logits: from
its Q4_1 blocks, and with dense bf16 weights beside them from 2 rows on (prompt chunks and
steps of two or three decodes)."""

import pytest

from tests.bf16_reference import assert_bf16_greedy_matches_transformers


@pytest.mark.parametrize("dense_rows", [0, 2], ids=["blocks", "dense-from-2-rows"])
@pytest.mark.parametrize("step_tokens", [2048, 16], ids=["whole-prompts", "chunked-prompts"])
def test_smollm2_bf16_on_cpu_matches_transformers_up_to_near_ties(
    smollm2_dir, step_tokens, dense_rows, run_shared_tmp_path
):
    assert_bf16_greedy_matches_transformers(
        smollm2_dir, "cpu", shared=run_shared_tmp_path, max_num_batched_tokens=step_tokens, gguf_dense_rows=dense_rows
    )

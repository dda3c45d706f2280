"""The families beyond Llama and Qwen on the CUDA ops (Triton kernels, interpreted on the CPU; the
fused MoE op is the reference's there): transformers' greedy tokens, token for token, with a
prompt prefilled in chunks."""

import pytest

from lmiserve.wire import SamplingParams
from tests.tiny_models import MOE_ARCHS, build_model
from tests.unit.engine.engine_helpers import hf_greedy, make_engine, run

FAMILIES = (*MOE_ARCHS, "phi3", "olmo2", "granite")


@pytest.mark.parametrize("arch", FAMILIES)
def test_cuda_ops_give_transformers_greedy_tokens(arch, tmp_path, kernel_device):
    model_dir = build_model(tmp_path / arch, arch, seed=2)
    prompt = [5, 17, 42, 9, 100, 30, 8, 60, 61, 62, 63]  # no special ids: generate masks the pad id
    engine = make_engine(model_dir, ops="cuda", device=kernel_device, max_num_batched_tokens=8, enforce_eager=True)
    tokens, _, _ = run(engine, {0: [("a", prompt, SamplingParams(max_new_tokens=5))]})
    assert tokens["a"][0] == hf_greedy(model_dir, prompt, 5)

"""On a machine with a CUDA GPU: the engine on the CUDA ops (Triton kernels, CUDA graphs) gives
transformers' greedy tokens; in bf16, except at a near-tie of transformers' top two logits."""

import pytest

from lmiserve.wire import SamplingParams
from tests.bf16_reference import assert_bf16_greedy_matches_transformers
from tests.unit.engine.engine_helpers import hf_greedy, make_engine, run

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("eager", [True, False], ids=["eager", "graphs"])
def test_engine_on_cuda_gives_transformers_greedy_tokens(arch, eager, tiny_model_dirs, tiny_tokenizer):
    model_dir = tiny_model_dirs[arch]
    prompts = [tiny_tokenizer(p)["input_ids"] for p in ("What is Deep Learning?", "The quick brown fox " * 6, "Hi")]
    arrivals = {0: [(str(i), p, SamplingParams(max_new_tokens=10)) for i, p in enumerate(prompts)]}
    engine = make_engine(model_dir, device="cuda:0", max_num_batched_tokens=16, enforce_eager=eager)
    assert engine.runner.ops.name == "cuda"
    assert (engine.runner.graphs is None) == eager
    tokens, _, _ = run(engine, arrivals)
    for i, prompt in enumerate(prompts):
        assert tokens[str(i)][0] == hf_greedy(model_dir, prompt, 10)
    if not eager:  # decodes, and prompt chunks beside them, replayed from graphs
        assert engine.runner.graphs.replays > 0 and engine.runner.mixed_graphs.replays > 0
        assert set(engine.runner.steps) <= engine.runner.warm_keys
    assert engine.stats().kernel_compiles == 0  # nothing compiled once the engine was ready


def test_smollm2_bf16_on_cuda_matches_transformers_up_to_near_ties(smollm2_dir):
    assert_bf16_greedy_matches_transformers(smollm2_dir, "cuda:0")

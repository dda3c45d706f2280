"""On a machine with a CUDA GPU: the engine's greedy tokens equal transformers' generate."""

import pytest

from lmiserve.wire import SamplingParams
from tests.unit.engine.engine_helpers import hf_greedy, make_engine, run

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_engine_on_cuda_gives_transformers_greedy_tokens(arch, tiny_model_dirs, tiny_tokenizer):
    model_dir = tiny_model_dirs[arch]
    prompts = [tiny_tokenizer(p)["input_ids"] for p in ("What is Deep Learning?", "The quick brown fox " * 6, "Hi")]
    arrivals = {0: [(str(i), p, SamplingParams(max_new_tokens=10)) for i, p in enumerate(prompts)]}
    engine = make_engine(model_dir, device="cuda:0", max_num_batched_tokens=16)
    assert engine.runner.ops.name == "reference"
    tokens, _, _ = run(engine, arrivals)
    for i, prompt in enumerate(prompts):
        assert tokens[str(i)][0] == hf_greedy(model_dir, prompt, 10)


def test_smollm2_bf16_on_cuda_matches_transformers(smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    prompt = tok("What is Deep Learning?")["input_ids"]
    engine = make_engine(smollm2_dir, device="cuda:0", dtype="bf16", max_model_len=512)
    tokens, _, _ = run(engine, {0: [("a", prompt, SamplingParams(max_new_tokens=24))]})
    hf = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.bfloat16).to("cuda:0")
    want = hf.generate(torch.tensor([prompt], device="cuda:0"), max_new_tokens=24, do_sample=False)[0, len(prompt) :]
    assert tokens["a"][0] == want.tolist()[: len(tokens["a"][0])]

"""On a machine with a CUDA GPU: the engine on the CUDA ops (Triton kernels, CUDA graphs) gives
transformers' greedy tokens; in bf16, except at a near-tie of transformers' top two logits."""

import math

import pytest

from lmiserve.wire import SamplingParams
from tests.unit.engine.engine_helpers import hf_greedy, make_engine, run

pytestmark = pytest.mark.cuda

TIE_ULPS = 4
"""bf16 near-tie margin: transformers' top two logits within 4 bf16 steps at their magnitude
(one step is 2**(floor(log2 |logit|) - 7); at a logit of 30, 4 steps are 0.5)."""


def bf16_margin(logit: float) -> float:
    return TIE_ULPS * 2.0 ** (math.floor(math.log2(max(abs(logit), 1e-30))) - 7)


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
    if not eager:
        assert engine.runner.graphs.replays > 0


def test_smollm2_bf16_on_cuda_matches_transformers_up_to_near_ties(smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    texts = ["What is Deep Learning?", "The capital of France is", "def fibonacci(n):"]
    prompts = [tok(t)["input_ids"] for t in texts]
    engine = make_engine(smollm2_dir, device="cuda:0", dtype="bf16", max_model_len=512, max_num_seqs=8)
    arrivals = {0: [(str(i), p, SamplingParams(max_new_tokens=32, ignore_eos=True)) for i, p in enumerate(prompts)]}
    tokens, _, _ = run(engine, arrivals)
    hf = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.bfloat16).to("cuda:0")
    for i, prompt in enumerate(prompts):
        ours = tokens[str(i)][0]
        out = hf.generate(
            torch.tensor([prompt], device="cuda:0"),
            max_new_tokens=32,
            min_new_tokens=32,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        want = out.sequences[0, len(prompt) :].tolist()
        first = next((j for j, (a, b) in enumerate(zip(ours, want)) if a != b), None)
        if first is None:
            assert ours == want
            continue
        top2 = out.logits[first][0].float().topk(2)
        gap = float(top2.values[0] - top2.values[1])
        assert ours[first] in top2.indices.tolist(), (texts[i], first)
        assert gap <= bf16_margin(float(top2.values[0])), (texts[i], first, gap)

"""Every family the engine runs: the log-probabilities of its greedy tokens within 1e-4 of
transformers' (fp32, the CPU ops), one test per family."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from lmiserve.wire import SamplingParams
from tests.tiny_models import MOE_ARCHS, build_model
from tests.unit.engine.engine_helpers import make_engine, run

FAMILIES = ("llama", "qwen2", "qwen3", *MOE_ARCHS, "phi3", "olmo2", "granite")
PROMPT = [5, 17, 42, 9, 100, 30, 8, 60, 61, 62, 63, 64, 65, 66]  # no special ids


@pytest.mark.parametrize("arch", FAMILIES)
def test_greedy_logprobs_match_transformers(arch, tmp_path):
    model_dir = build_model(tmp_path / arch, arch, seed=4)
    params = SamplingParams(max_new_tokens=6, logprobs=1, ignore_eos=True)
    _, _, deltas = run(make_engine(model_dir, max_num_batched_tokens=8), {0: [("a", PROMPT, params)]})
    ids = [t for d in deltas for t in d.token_ids]
    got = torch.tensor([lp for d in deltas for lp in d.logprobs])
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = hf(torch.tensor([PROMPT + ids])).logits[0, len(PROMPT) - 1 : -1].float()
    assert ids == logits.argmax(-1).tolist()
    want = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
    assert torch.allclose(got, want, atol=1e-4), (got, want)

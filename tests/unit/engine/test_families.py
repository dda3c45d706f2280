"""Every family the engine runs (fp32, the CPU ops): the log-probabilities of its greedy tokens
within 1e-4 of transformers', its tokens in deterministic mode, and LoRA adapters against peft."""

from __future__ import annotations

import pytest
import torch

from lmiserve import wire
from lmiserve.wire import SamplingParams
from tests.lora_adapters import build_adapter, peft_greedy
from tests.tiny_models import MOE_ARCHS, build_model, reference_model
from tests.unit.engine.engine_helpers import hf_greedy, make_engine, run

FAMILIES = ("llama", "qwen2", "qwen3", *MOE_ARCHS, "phi3", "olmo2", "granite", "gemma2", "gemma3")
PROMPT = [5, 17, 42, 9, 100, 30, 8, 60, 61, 62, 63, 64, 65, 66]  # no special ids


@pytest.mark.parametrize("arch", FAMILIES)
def test_greedy_logprobs_match_transformers(arch, tmp_path):
    model_dir = build_model(tmp_path / arch, arch, seed=4)
    params = SamplingParams(max_new_tokens=6, logprobs=1, ignore_eos=True)
    _, _, deltas = run(make_engine(model_dir, max_num_batched_tokens=8), {0: [("a", PROMPT, params)]})
    ids = [t for d in deltas for t in d.token_ids]
    got = torch.tensor([lp for d in deltas for lp in d.logprobs])
    hf = reference_model(model_dir)
    with torch.no_grad():
        logits = hf(torch.tensor([PROMPT + ids])).logits[0, len(PROMPT) - 1 : -1].float()
    assert ids == logits.argmax(-1).tolist()
    want = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
    assert torch.allclose(got, want, atol=1e-4), (got, want)


@pytest.mark.parametrize("arch", FAMILIES)
def test_deterministic_mode_keeps_transformers_tokens(arch, tmp_path):
    """Batch-invariant ops, the prompt chunked, beside another request."""
    model_dir = build_model(tmp_path / arch, arch, seed=4)
    engine = make_engine(model_dir, deterministic=True, max_num_batched_tokens=8)
    arrivals = {
        0: [("a", PROMPT, SamplingParams(max_new_tokens=6))],
        1: [("b", PROMPT[3:], SamplingParams(max_new_tokens=6))],
    }
    tokens, _, _ = run(engine, arrivals)
    assert tokens["a"][0] == hf_greedy(model_dir, PROMPT, 6)
    assert tokens["b"][0] == hf_greedy(model_dir, PROMPT[3:], 6)


@pytest.mark.parametrize(
    "arch, targets",
    [("olmo2", None), ("granite", None), ("mixtral", ["q_proj", "k_proj", "v_proj", "o_proj"])],
    ids=["olmo2", "granite", "mixtral-attention"],
)
def test_lora_adapters_match_peft(arch, targets, tmp_path):
    """Adapters on the usual projections (a mixture of experts: on attention only)."""
    model_dir = build_model(tmp_path / arch, arch, seed=4)
    adapter = build_adapter(model_dir, tmp_path / "adapter", seed=7, rank=8, targets=targets)
    engine = make_engine(model_dir, enable_lora=True, max_loras=1, max_lora_rank=8)
    result = engine.adapter_command(wire.AdapterCommand(op_id=0, action="register", name="a", src=str(adapter)))
    assert result.kind is None, result
    original = engine.add_request
    engine.add_request = lambda rid, prompt, params: original(rid, prompt, params, "a" if rid == "lora" else "")
    params = SamplingParams(max_new_tokens=8)
    tokens, _, _ = run(engine, {0: [("lora", PROMPT, params), ("base", PROMPT, params)]})
    assert tokens["lora"][0] == peft_greedy(model_dir, adapter, PROMPT, 8)
    assert tokens["base"][0] == hf_greedy(model_dir, PROMPT, 8)

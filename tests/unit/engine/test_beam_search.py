"""Beam search in the engine returns what transformers' beam search returns."""

import pytest
import torch

from lmiserve.wire import SamplingParams

from .engine_helpers import _hf, make_engine, run


def hf_beams(model_dir, prompt_ids, beams, n, max_new, length_penalty=1.0, early_stopping=False):
    model = _hf(model_dir)
    out = model.generate(
        torch.tensor([prompt_ids]),
        max_new_tokens=max_new,
        num_beams=beams,
        num_return_sequences=n,
        do_sample=False,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
    )
    eos = model.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos or [])
    results = []
    for row in out[:, len(prompt_ids) :].tolist():
        for i, t in enumerate(row):
            if t in eos:
                row = row[: i + 1]
                break
        results.append(row)
    return results


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("beams,n,max_new,length_penalty", [(4, 2, 12, 1.0), (3, 3, 8, 0.0), (2, 1, 15, 2.0)])
def test_beams_match_transformers(arch, beams, n, max_new, length_penalty, tiny_model_dirs, tiny_tokenizer):
    model_dir = tiny_model_dirs[arch]
    engine = make_engine(model_dir)
    prompt = tiny_tokenizer("The quick brown fox jumps over")["input_ids"]
    params = SamplingParams(max_new_tokens=max_new, num_beams=beams, n=n, best_of=n, length_penalty=length_penalty)
    other = SamplingParams(max_new_tokens=20)  # a plain request shares the running batch
    tokens, finish, deltas = run(
        engine, {0: [("beam", prompt, params)], 2: [("plain", tiny_tokenizer("Hello")["input_ids"], other)]}
    )
    expected = hf_beams(model_dir, prompt, beams, n, max_new, length_penalty)
    assert [tokens["beam"][i] for i in range(n)] == expected
    assert engine.blocks.num_used_blocks == 0  # forks and copies released every block


def test_beam_scores_are_ordered(tiny_model_dirs, tiny_tokenizer):
    engine = make_engine(tiny_model_dirs["llama"])
    prompt = tiny_tokenizer("Numbers: 1 2 3")["input_ids"]
    _, _, deltas = run(engine, {0: [("b", prompt, SamplingParams(max_new_tokens=6, num_beams=3, n=3, best_of=3))]})
    scores = [d.cumulative_logprob for d in sorted(deltas, key=lambda d: d.index)]
    assert scores == sorted(scores, reverse=True)
    assert all(len(d.logprobs) == len(d.token_ids) for d in deltas)

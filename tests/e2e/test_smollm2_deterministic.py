"""Deterministic mode on the embedded SmolLM2 in bf16: eight greedy requests sent together give
what each gives alone, and so does a request among 31 others."""

import random

import pytest

from lmiserve.wire import SamplingParams
from tests.unit.engine.engine_helpers import make_engine, run

pytestmark = [pytest.mark.e2e, pytest.mark.serial]

COUNTS = [f"Count to {n}:" for n in range(3, 11)]


@pytest.fixture(scope="module")
def engine(smollm2_dir):
    return make_engine(
        smollm2_dir, dtype="bf16", deterministic=True, max_num_seqs=32, max_num_batched_tokens=128, max_model_len=512
    )


def _tokens(engine, prompts):
    params = SamplingParams(max_new_tokens=16)
    tokens, _, _ = run(engine, {0: [(str(i), p, params) for i, p in enumerate(prompts)]})
    return [tokens[str(i)][0] for i in range(len(prompts))]


def test_concurrent_requests_answer_as_they_do_alone(engine, smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    prompts = [tok(c)["input_ids"] for c in COUNTS]
    together = _tokens(engine, prompts)
    alone = [_tokens(engine, [p])[0] for p in prompts]
    assert together == alone
    rng = random.Random(0)
    others = [[rng.randrange(100, 40000) for _ in range(rng.randrange(5, 120))] for _ in range(31)]
    assert _tokens(engine, others + [prompts[0]])[-1] == alone[0]

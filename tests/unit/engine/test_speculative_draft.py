"""A draft model with its own KV cache proposes in the engine: greedy tokens equal those without it
(whole, chunked, beside plain sequences), and a pair built to agree keeps most proposals."""

from __future__ import annotations

import json
import random

import pytest

from lmiserve.config.speculative import parse_speculative
from lmiserve.wire import SamplingParams
from tests.tiny_draft_pair import write_pair
from tests.unit.engine.engine_helpers import make_engine


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("draft-pair")
    write_pair(root / "target", root / "draft", seed=2, hidden_size=128, target_layers=4, draft_layers=1)
    return root / "target", root / "draft"


def _generate(engine, requests):
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    tokens = {rid: [] for rid in requests}
    while engine.has_work():
        for d in engine.step():
            tokens[d.request_id] += d.token_ids
    return tokens


@pytest.mark.parametrize("budget", [256, 16])
def test_greedy_equal_with_a_draft_model(pair, budget):
    target, draft = pair
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    rng = random.Random(9)
    requests = {
        f"r{i}": (
            [rng.randrange(3, vocab) for _ in range(20 + 13 * i)],
            SamplingParams(max_new_tokens=24, speculate=i != 2),
        )
        for i in range(3)
    }
    spec = parse_speculative(json.dumps({"model": str(draft), "num_speculative_tokens": 4, "adaptive": False}))
    assert spec.method == "draft_model"
    plain = _generate(make_engine(target, max_num_batched_tokens=budget), requests)
    engine = make_engine(target, max_num_batched_tokens=budget, speculative=spec)
    assert _generate(engine, requests) == plain
    stats = engine.stats()
    assert stats.spec_drafts > 0
    assert stats.spec_accepted_tokens / stats.spec_proposed_tokens > 0.5  # built to agree
    assert 0 < engine.info["spec_cost_ratio"] < 1

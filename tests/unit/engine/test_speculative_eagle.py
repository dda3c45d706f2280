"""EAGLE and EAGLE-3 heads on random weights in the engine: greedy tokens equal those without
speculation, whole, chunked and beside plain sequences; the heads' proposals are checked."""

from __future__ import annotations

import random

import pytest

from lmiserve.config.speculative import parse_speculative
from lmiserve.wire import SamplingParams
from tests.unit.engine.eagle_helpers import write_eagle, write_eagle3
from tests.unit.engine.engine_helpers import make_engine


@pytest.fixture(scope="module")
def heads(tmp_path_factory, tiny_llama_dir):
    import json

    vocab = json.loads((tiny_llama_dir / "config.json").read_text())["vocab_size"]
    root = tmp_path_factory.mktemp("eagle-engine")
    write_eagle(root / "eagle", vocab)
    write_eagle3(root / "eagle3", vocab, sorted(random.Random(3).sample(range(vocab), 120)), [0, 1, 2])
    return {"eagle": root / "eagle", "eagle3": root / "eagle3"}, vocab


def _generate(engine, requests):
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
    tokens = {rid: [] for rid in requests}
    while engine.has_work():
        for d in engine.step():
            tokens[d.request_id] += d.token_ids
    return tokens


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@pytest.mark.parametrize("budget", [256, 20])
def test_greedy_equal_with_a_random_head(tiny_llama_dir, heads, method, budget):
    """Three requests, one opted out; a budget of 20 tokens runs the prompts in chunks beside the
    verify runs."""
    dirs, vocab = heads
    rng = random.Random(5)
    requests = {
        f"r{i}": (
            [rng.randrange(3, vocab) for _ in range(30 + 11 * i)],
            SamplingParams(max_new_tokens=20, speculate=i != 1),
        )
        for i in range(3)
    }
    config = {"method": method, "model": str(dirs[method]), "num_speculative_tokens": 3, "adaptive": False}
    import json

    plain = _generate(make_engine(tiny_llama_dir, max_num_batched_tokens=budget), requests)
    engine = make_engine(
        tiny_llama_dir, max_num_batched_tokens=budget, speculative=parse_speculative(json.dumps(config))
    )
    assert _generate(engine, requests) == plain
    stats = engine.stats()
    assert stats.spec_drafts > 0 and stats.spec_proposed_tokens >= stats.spec_accepted_tokens
    assert engine.blocks.num_used_blocks == 0

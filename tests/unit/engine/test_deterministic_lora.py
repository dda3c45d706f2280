"""Deterministic mode with adapters on the CPU ops (bf16): a request with an adapter gets the same
tokens alone as beside other adapters' and base requests, under any step budget, and when its
prefix comes from the prefix cache. Its prompt's LoRA products are runs of 40-odd rows, which the
default mode gives to oneDNN; here every run goes through the row-by-row C++ kernel."""

import pytest

from lmiserve import wire
from lmiserve.wire import SamplingParams
from tests.lora_adapters import build_adapter
from tests.unit.engine.engine_helpers import make_engine, run

TARGET = "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm afternoon sun " * 2
OTHERS = ("What is Deep Learning?", "Hi", "Paged attention keeps the cache in blocks", "One two three four")


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, tiny_model_dirs):
    root = tmp_path_factory.mktemp("lora-deterministic")
    model_dir = tiny_model_dirs["llama"]
    return {f"a{i}": build_adapter(model_dir, root / f"a{i}", seed=50 + i, rank=8) for i in range(3)}


def _engine(model_dir, adapters, budget):
    engine = make_engine(
        model_dir, dtype="bf16", deterministic=True, enable_lora=True, max_loras=3, max_lora_rank=8,
        max_num_seqs=8, max_num_batched_tokens=budget,
    )  # fmt: skip
    for i, (name, path) in enumerate(adapters.items()):
        command = wire.AdapterCommand(op_id=i, action="register", name=name, src=str(path))
        assert engine.adapter_command(command).kind is None
    return engine


def _target(engine, prompt, tokenizer, others=(), warm=False):
    params = SamplingParams(max_new_tokens=8)
    if warm:  # the same prompt and adapter first: the target finds its prefix cached
        engine.add_request("w", prompt, SamplingParams(max_new_tokens=1), "a1")
        run(engine, {0: []})
    for i, name in enumerate(others):
        engine.add_request(f"o{i}", tokenizer(OTHERS[i])["input_ids"], params, name)
    engine.add_request("t", prompt, params, "a1")
    return run(engine, {0: []})[0]["t"][0]


@pytest.mark.usefixtures("scheduling")
def test_adapter_tokens_do_not_depend_on_the_batch_budget_or_prefix_cache(tiny_model_dirs, tiny_tokenizer, adapters):
    model_dir = tiny_model_dirs["llama"]
    prompt = tiny_tokenizer(TARGET)["input_ids"]
    assert len(prompt) > 40
    alone = _target(_engine(model_dir, adapters, 512), prompt, tiny_tokenizer)
    assert len(alone) == 8
    base = _engine(model_dir, {}, 512)
    base.add_request("t", prompt, SamplingParams(max_new_tokens=8))
    assert run(base, {0: []})[0]["t"][0] != alone  # the adapter changes the tokens
    for budget in (16, 64, 512):
        engine = _engine(model_dir, adapters, budget)
        assert _target(engine, prompt, tiny_tokenizer, others=("a0", "", "a2", "a1")) == alone, budget
    engine = _engine(model_dir, adapters, 16)
    assert _target(engine, prompt, tiny_tokenizer, warm=True) == alone
    assert engine.blocks.prefix_hit_tokens > 0

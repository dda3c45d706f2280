"""The engine with LoRA adapters: its greedy tokens equal transformers + ``peft`` with the same
adapter, token for token in fp32, while the same batch runs requests for other adapters and for
the base model, with fewer device slots than adapters (requests wait for a slot) and fewer host
copies than adapters (unloaded ones are read again)."""

import pytest

from lmiserve import wire
from lmiserve.wire import SamplingParams
from tests.lora_adapters import build_adapter, peft_greedy

from .engine_helpers import make_engine, run

pytestmark = pytest.mark.usefixtures("scheduling")

PROMPTS = [
    "What is Deep Learning?",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Paged attention stores the key value cache in fixed-size blocks.",
    "Hi",
]


@pytest.fixture(scope="module")
def adapter_sets(tmp_path_factory, tiny_model_dirs):
    """Three adapters per family: every module at rank 8; q/v only at rank 4 with rsLoRA; MLP and o
    at rank 16 with a per-module rank and alpha (PEFT's rank_pattern / alpha_pattern)."""
    root = tmp_path_factory.mktemp("lora-engine")
    found = {}
    for arch, model_dir in tiny_model_dirs.items():
        found[arch] = {
            "all": build_adapter(model_dir, root / arch / "all", seed=11, rank=8),
            "qv": build_adapter(
                model_dir, root / arch / "qv", seed=12, rank=4, targets=["q_proj", "v_proj"], use_rslora=True
            ),
            "mlp": build_adapter(
                model_dir,
                root / arch / "mlp",
                seed=13,
                rank=16,
                targets=["o_proj", "gate_proj", "up_proj", "down_proj"],
                rank_pattern={"down_proj": 4},
                alpha_pattern={"up_proj": 7},
            ),
        }
    return found


def _register(engine, adapters):
    for i, (name, path) in enumerate(adapters.items()):
        result = engine.adapter_command(wire.AdapterCommand(op_id=i, action="register", name=name, src=str(path)))
        assert result.kind is None, result.error


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_mixed_adapters_in_one_batch_match_peft(arch, tiny_model_dirs, tiny_tokenizer, adapter_sets):
    model_dir, adapters = tiny_model_dirs[arch], adapter_sets[arch]
    engine = make_engine(model_dir, enable_lora=True, max_loras=2, max_lora_rank=16, max_cpu_loras=2)
    _register(engine, adapters)
    ids = [tiny_tokenizer(p)["input_ids"] for p in PROMPTS]
    plan = [("all", 0), ("", 1), ("qv", 2), ("mlp", 3), ("mlp", 0), ("", 2), ("qv", 0), ("all", 3)]
    arrivals = {0: [], 3: []}
    for i, (_, p) in enumerate(plan):
        arrivals[0 if i < 5 else 3].append((f"r{i}", ids[p], SamplingParams(max_new_tokens=16)))
    names = {f"r{i}": name for i, (name, _) in enumerate(plan)}
    original = engine.add_request
    engine.add_request = lambda rid, prompt, params: original(rid, prompt, params, names[rid])
    tokens, finish, deltas = run(engine, arrivals)
    assert not [d for d in deltas if d.error]
    for i, (name, p) in enumerate(plan):
        want = peft_greedy(model_dir, adapters[name] if name else None, ids[p], 16)
        assert tokens[f"r{i}"][0] == want, (arch, name, p)
    assert engine.lora.book.loads > len(adapters)  # two host copies for three adapters: some were read again
    assert all(a.refs == 0 and a.running == 0 for a in engine.lora.book.adapters.values())
    assert engine.blocks.num_used_blocks == 0


def test_the_prefix_cache_is_kept_apart_per_adapter(tiny_model_dirs, tiny_tokenizer, adapter_sets):
    model_dir, adapters = tiny_model_dirs["llama"], adapter_sets["llama"]
    engine = make_engine(model_dir, enable_lora=True, max_loras=2)
    _register(engine, adapters)
    prompt = tiny_tokenizer(PROMPTS[1] * 2)["input_ids"]  # several full blocks
    hits = []
    for rid, name in [("base", ""), ("a1", "all"), ("a2", "all"), ("q1", "qv")]:
        before = engine.blocks.prefix_hit_tokens
        engine.add_request(rid, prompt, SamplingParams(max_new_tokens=4), name)
        tokens, _, _ = run(engine, {0: []})
        hits.append(engine.blocks.prefix_hit_tokens - before)
    assert hits[0] == 0 and hits[1] == 0 and hits[2] > 0 and hits[3] == 0


def test_requests_wait_for_a_slot_and_unregistering_lets_running_requests_finish(
    tiny_model_dirs, tiny_tokenizer, adapter_sets
):
    model_dir, adapters = tiny_model_dirs["llama"], adapter_sets["llama"]
    engine = make_engine(model_dir, enable_lora=True, max_loras=1)
    _register(engine, adapters)
    ids = tiny_tokenizer(PROMPTS[0])["input_ids"]
    engine.add_request("x", ids, SamplingParams(max_new_tokens=8), "all")
    engine.add_request("y", ids, SamplingParams(max_new_tokens=8), "qv")
    first = engine.step()
    assert [s.request_id for s in engine.scheduler.running] == ["x"]  # one slot: "qv" waits
    result = engine.adapter_command(wire.AdapterCommand(op_id=9, action="unregister", name="all"))
    assert result.kind is None
    with pytest.raises(ValueError, match="Adapter all is not registered"):
        engine.add_request("z", ids, SamplingParams(max_new_tokens=8), "all")
    tokens, finish, _ = run(engine, {0: []})
    x_tokens = [t for d in first for t in d.token_ids] + tokens["x"][0]  # the step above ran x alone
    assert len(x_tokens) == 8 and len(tokens["y"][0]) == 8
    assert tokens["y"][0] == peft_greedy(model_dir, adapters["qv"], ids, 8)


def test_management_answers(tiny_model_dirs, adapter_sets):
    model_dir, adapters = tiny_model_dirs["llama"], adapter_sets["llama"]
    engine = make_engine(model_dir, enable_lora=True, max_loras=1)
    command = lambda **kw: engine.adapter_command(wire.AdapterCommand(op_id=1, **kw))  # noqa: E731
    assert command(action="register", name="a", src=str(adapters["all"]), pin=True).kind is None
    assert command(action="register", name="a", src=str(adapters["all"])).kind == "conflict"
    assert command(action="register", name="b", src=str(adapters["qv"]), pin=True).kind == "no_capacity"
    assert command(action="register", name="c", src=str(adapters["qv"]), preload=False, pin=True).kind == "invalid"
    assert command(action="register", name="d", src=str(model_dir)).kind == "unloadable"  # not an adapter
    assert command(action="update", name="nope").kind == "not_found"
    assert command(action="unregister", name="nope").kind == "not_found"
    off = make_engine(model_dir)
    result = off.adapter_command(wire.AdapterCommand(op_id=1, action="register", name="a", src=str(adapters["all"])))
    assert result.kind == "disabled" and result.error == "LoRA is not enabled."
    with pytest.raises(ValueError, match="LoRA is not enabled"):
        off.add_request("r", [1, 2, 3], SamplingParams(max_new_tokens=2), "a")

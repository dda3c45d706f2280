"""The engine on the CUDA ops with adapters (Triton kernels, interpreted on the CPU) and its step
graphs (the recording stand-in for CUDA graphs): four adapters beside base requests replay the
graphs a base-only step replays, give the eager engines' tokens (the CUDA ops' and the CPU
ops'), and launch the LoRA kernels only in specialisations the start-up already launched (so a
GPU compiles none while requests run)."""

import inspect

import pytest
import torch

from lmiserve import wire
from lmiserve.rolling_batch.ops.triton_kernels import lora as lora_kernels
from lmiserve.rolling_batch.runner import graphs
from lmiserve.wire import SamplingParams
from tests.lora_adapters import build_adapter
from tests.unit.engine.engine_helpers import make_engine, run
from tests.unit.engine.recording_graphs import RecordingBackend

PROMPTS = ("What is Deep Learning?", "Hi", "The quick brown fox", "A b c d", "Paged attention", "One two")
NAMES = ("a0", "", "a1", "a2", "", "a3")
LIMITS = dict(enable_lora=True, max_loras=4, max_lora_rank=8, max_num_seqs=8, max_num_batched_tokens=64,
              max_decode_step_prefill_tokens=16)  # fmt: skip


def _specialisation(kernel, args: tuple, kwargs: dict) -> tuple:
    """What Triton compiles a launch for: the constants, each tensor's dtype and 16-byte
    alignment, and whether each integer not exempted is 1 or a multiple of 16."""
    exempt = getattr(kernel, "do_not_specialize", None)
    if exempt is None:  # the interpreter keeps the decorator's arguments
        exempt = getattr(kernel, "kwargs", {}).get("do_not_specialize")
    exempt = set(exempt or ())
    names = list(inspect.signature(kernel.fn).parameters)
    key = []
    for name, arg in zip(names, args):
        if isinstance(arg, torch.Tensor):
            key.append((name, arg.dtype, arg.data_ptr() % 16 == 0))
        elif isinstance(arg, int) and name not in exempt:
            key.append((name, arg == 1, arg % 16 == 0))
    return (kernel.fn.__name__, *key, *sorted(kwargs.items()))


class _Recorded:
    """A kernel whose launches' specialisations are noted in ``seen``."""

    def __init__(self, kernel, seen: set):
        self.kernel, self.seen = kernel, seen

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.seen.add(_specialisation(self.kernel, args, kwargs))
            return self.kernel[grid](*args, **kwargs)

        return launch


@pytest.fixture(scope="module")
def four_adapters(tmp_path_factory, tiny_model_dirs):
    root = tmp_path_factory.mktemp("lora-cuda-graphs")
    model_dir = tiny_model_dirs["llama"]
    targets = (None, ["q_proj", "v_proj"], ["gate_proj", "up_proj", "down_proj"], ["o_proj", "k_proj"])
    return {f"a{i}": build_adapter(model_dir, root / f"a{i}", seed=30 + i, rank=4 + 2 * (i % 2), targets=t)
            for i, t in enumerate(targets)}  # fmt: skip


def _engine(model_dir, adapters, device, **overrides):
    engine = make_engine(model_dir, **{"ops": "cuda", "device": device, **LIMITS, **overrides})
    for i, (name, path) in enumerate(adapters.items()):
        command = wire.AdapterCommand(op_id=i, action="register", name=name, src=str(path))
        assert engine.adapter_command(command).kind is None
    return engine


def _run(engine, tokenizer, names, new_tokens=3):
    for i, name in enumerate(names):
        ids = tokenizer(PROMPTS[i])["input_ids"]
        engine.add_request(f"r{i}", ids, SamplingParams(max_new_tokens=new_tokens), name)
    return run(engine, {0: []})[0]


def test_adapters_replay_the_graphs_with_the_eager_tokens_and_no_new_specialisation(
    monkeypatch, tiny_model_dirs, tiny_tokenizer, kernel_device, four_adapters
):
    recorder = RecordingBackend()
    monkeypatch.setattr(graphs, "backend_for", lambda device: recorder)
    seen: set = set()
    for name in ("_shrink_kernel", "_expand_kernel"):
        monkeypatch.setattr(lora_kernels, name, _Recorded(getattr(lora_kernels, name), seen))
    model_dir = tiny_model_dirs["llama"]
    engine = _engine(model_dir, four_adapters, kernel_device)
    runner = engine.runner
    at_ready = set(seen)
    assert at_ready  # capture and warm-up launched the LoRA kernels
    tokens = _run(engine, tiny_tokenizer, NAMES)
    assert runner.steps[("decode", 8)] >= 2  # four adapters and two base requests decode in bucket 8
    assert runner.eager_steps <= 1  # the six prompts at once (24 prompt tokens past a bucket's 16)
    base = _run(engine, tiny_tokenizer, [""] * 6)
    assert runner.steps[("decode", 8)] >= 4  # the base-only decodes replay the same graph
    assert seen == at_ready  # no launch a GPU would compile for
    assert tokens["r1"] == base["r1"] and tokens["r4"] == base["r4"]
    assert any(tokens[f"r{i}"] != base[f"r{i}"] for i, name in enumerate(NAMES) if name)

    eager = _engine(model_dir, four_adapters, kernel_device, enforce_eager=True)
    assert eager.runner.graphs is None
    assert _run(eager, tiny_tokenizer, NAMES) == tokens
    cpu = _engine(model_dir, four_adapters, "cpu", ops="cpu", enforce_eager=True)  # matched to peft elsewhere
    assert _run(cpu, tiny_tokenizer, NAMES) == tokens


def test_deterministic_mode_adapter_tokens_do_not_depend_on_the_batch(
    monkeypatch, tiny_model_dirs, tiny_tokenizer, kernel_device, four_adapters
):
    """bf16, decodes from the graphs: a request with an adapter alone, then beside three others
    (two other adapters, one base request) under a small step budget (the prompts split across
    steps): the same tokens."""
    monkeypatch.setattr(graphs, "backend_for", lambda device: RecordingBackend())
    prompt = tiny_tokenizer("The quick brown fox jumps over the lazy dog")["input_ids"]
    params = SamplingParams(max_new_tokens=4)

    # four sequences at most (the target and three others): the start-up captures the graphs of
    # batch buckets up to 4, not 8; one engine for both runs, so they are captured once
    engine = _engine(tiny_model_dirs["llama"], four_adapters, kernel_device, dtype="bf16", deterministic=True,
                     max_num_batched_tokens=16, max_num_seqs=4)  # fmt: skip
    assert engine.runner.graphs is not None
    engine.add_request("alone", prompt, params, "a1")
    alone = run(engine, {0: []})[0]["alone"][0]
    steps = engine.runner.graph_steps
    assert steps > 0
    for i, name in enumerate(["a0", "", "a3"]):
        engine.add_request(f"o{i}", tiny_tokenizer(PROMPTS[i])["input_ids"], params, name)
    engine.add_request("t", prompt, params, "a1")
    assert run(engine, {0: []})[0]["t"][0] == alone
    assert engine.runner.graph_steps > steps

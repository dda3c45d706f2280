"""``option.quantize_activations=int8`` in the engine on the embedded SmolLM2 (Q4_1 layers): the
CPU ops' kernel gives the greedy tokens of the reference ops, which multiply by the definition
(:mod:`lmiserve.rolling_batch.quant.int8_activations`), both in fp32, whole and chunked prompts;
they may part only where the reference's top two log-probabilities are a near-tie (the two sum
the same integers' scaled products in other orders). A tied LM head runs from the embeddings'
blocks; the engine refuses the setting where no layer is in blocks."""

from __future__ import annotations

import pytest

from lmiserve.rolling_batch.quant.loading import QuantizationError
from lmiserve.wire import SamplingParams
from tests.unit.engine.engine_helpers import make_engine, run

PROMPTS = ["The capital of France is", "def fibonacci(n):", "List three colors:"]
NEW_TOKENS = 16
TIE = 1e-3
"""Near-tie margin: the reference's top two log-probabilities within this at the first difference."""


def greedy(model_dir, ops: str, step_tokens: int):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    engine = make_engine(
        model_dir, ops=ops, quantize_activations="int8", max_num_batched_tokens=step_tokens, max_model_len=128
    )
    params = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True, logprobs=2)
    arrivals = {0: [(str(i), tok(p)["input_ids"], params) for i, p in enumerate(PROMPTS)]}
    tokens, _, deltas = run(engine, arrivals)
    tops: dict[str, list] = {}
    for d in deltas:
        tops.setdefault(d.request_id, []).extend(d.top_logprobs or [])
    return {rid: by_index[0] for rid, by_index in tokens.items()}, tops, engine.runner.quantization


@pytest.mark.parametrize("step_tokens", [256, 8], ids=["whole-prompts", "chunked-prompts"])
def test_cpu_kernel_gives_the_definitions_greedy_tokens(smollm2_dir, step_tokens: int) -> None:
    got, _, described = greedy(smollm2_dir, "cpu", step_tokens)
    want, tops, _ = greedy(smollm2_dir, "reference", step_tokens)
    assert described.endswith("int8 activations")
    for rid in want:
        assert len(got[rid]) == NEW_TOKENS
        first = next((i for i, (a, b) in enumerate(zip(got[rid], want[rid])) if a != b), None)
        if first is not None:
            top = sorted((t.logprob for t in tops[rid][first]), reverse=True)
            assert top[0] - top[1] < TIE, (rid, first, top)


def test_a_tied_head_runs_from_the_embeddings_blocks(smollm2_dir) -> None:
    """SmolLM2 ties its LM head to its Q8_0 token embeddings: with int8 activations the head
    multiplies their blocks (the lookup still reads them dequantized)."""
    engine = make_engine(smollm2_dir, quantize_activations="int8", max_model_len=64)
    model = engine.runner.model
    assert model.lm_head.packing == "gguf-q8_0+int8"
    assert engine.runner.quantization.startswith("gguf blocks (q4_1 x210, q8_0 x1)")
    plain = make_engine(smollm2_dir, max_model_len=64).runner.model
    assert plain.lm_head.packing == "lmiserve" or plain.lm_head.quant is None
    assert (model.embed == plain.embed).all()


def test_dense_layers_refuse_it(tiny_llama_dir) -> None:
    with pytest.raises(QuantizationError, match="quantize_activations=int8 multiplies weights in blocks"):
        make_engine(tiny_llama_dir, quantize_activations="int8")


def test_int8_weights_take_it(tiny_llama_dir) -> None:
    engine = make_engine(tiny_llama_dir, quantize="int8", quantize_activations="int8")
    assert engine.runner.quantization.endswith("int8 activations")
    tokens, _, _ = run(engine, {0: [("a", [1, 2, 3, 4], SamplingParams(max_new_tokens=4, ignore_eos=True))]})
    assert len(tokens["a"][0]) == 4


def test_deterministic_mode_keeps_a_request_apart_from_the_batch(smollm2_dir) -> None:
    """The int8 kernel's rows never depend on the batch, so with ``option.deterministic`` a
    request's greedy tokens are the same alone and beside others (whole or chunked prompts)."""
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    prompt = list(range(200, 240))
    others = [list(range(300, 300 + n)) for n in (7, 25, 61)]

    def tokens(with_others: bool, step_tokens: int) -> list[int]:
        engine = make_engine(
            smollm2_dir, dtype="bf16", quantize_activations="int8", deterministic=True,
            max_num_batched_tokens=step_tokens, max_model_len=128,
        )  # fmt: skip
        arrivals = {0: [("a", prompt, params)]}
        if with_others:
            arrivals[0] += [(f"o{i}", p, params) for i, p in enumerate(others)]
        return run(engine, arrivals)[0]["a"][0]

    alone = tokens(False, 256)
    assert tokens(True, 256) == alone
    assert tokens(True, 16) == alone


def test_lora_adapters_add_to_the_int8_product(tiny_llama_dir, tiny_tokenizer, tmp_path) -> None:
    """A LoRA adapter on int8 weights with int8 activations: the CPU kernel and the reference's
    definition, with the adapter's product added in either, give the same greedy tokens (near-ties
    aside), and the adapter changes them."""
    from lmiserve import wire
    from tests.lora_adapters import build_adapter

    adapter = build_adapter(tiny_llama_dir, tmp_path / "all", seed=11, rank=8)
    prompt = tiny_tokenizer("The quick brown fox jumps over the lazy dog.")["input_ids"]
    params = SamplingParams(max_new_tokens=12, ignore_eos=True, logprobs=2)

    def greedy(ops: str, name: str):  # type: ignore[no-untyped-def]
        engine = make_engine(tiny_llama_dir, ops=ops, quantize="int8", quantize_activations="int8", enable_lora=True)
        result = engine.adapter_command(wire.AdapterCommand(op_id=0, action="register", name="all", src=str(adapter)))
        assert result.kind is None, result.error
        engine.add_request("a", prompt, params, name)
        tokens, _, deltas = run(engine, {0: []})
        return tokens["a"][0], [top for d in deltas for top in (d.top_logprobs or [])]

    got, _ = greedy("cpu", "all")
    want, tops = greedy("reference", "all")
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if first is not None:
        top = sorted((t.logprob for t in tops[first]), reverse=True)
        assert top[0] - top[1] < TIE, (first, top)
    assert greedy("cpu", "")[0] != got

"""A request that brings the tokens it already generated continues exactly as the first run did."""

import msgspec
import pytest
import torch

from lmiserve.generation.sampling import sample_rows
from lmiserve.rolling_batch.core.engine import RequestRejected
from lmiserve.rolling_batch.runner import replay
from lmiserve.wire import GenerateRequest, GuidedDecoding, SamplingParams

from .engine_helpers import make_engine

pytestmark = pytest.mark.usefixtures("scheduling")

PROMPT = [5, 17, 42, 99, 7, 63, 120, 8, 31, 250, 12, 77, 3, 190, 44, 6, 210, 19]
N = 12

VARIANTS = {
    "greedy": SamplingParams(max_new_tokens=N, ignore_eos=True),
    "seeded": SamplingParams(
        max_new_tokens=N, do_sample=True, temperature=0.8, top_p=0.9, top_k=40, seed=7, ignore_eos=True
    ),
    "penalties": SamplingParams(
        max_new_tokens=N, repetition_penalty=1.5, presence_penalty=0.8, frequency_penalty=0.3, ignore_eos=True
    ),
    "seeded_penalties": SamplingParams(
        max_new_tokens=N, do_sample=True, seed=3, repetition_penalty=1.3, presence_penalty=0.5, ignore_eos=True
    ),
    "prompt_logprobs": SamplingParams(max_new_tokens=N, do_sample=True, seed=11, prompt_logprobs=2, logprobs=2),
}


def collect(engine, max_steps: int = 500) -> dict[str, list]:
    """Every request's deltas, by request id, until the engine is idle."""
    out: dict[str, list] = {}
    for _ in range(max_steps):
        if not engine.has_work():
            break
        for d in engine.step():
            out.setdefault(d.request_id, []).append(d)
    return out


def tokens_of(deltas) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


def replayed(prompt, params, first, k) -> GenerateRequest:
    """The request that continues ``first`` (an uninterrupted run's deltas) after its ``k``th token."""
    return GenerateRequest(
        request_id=f"r{k}",
        prompt_ids=prompt,
        params=params,
        output_ids=tokens_of(first)[:k],
        cumulative_logprob=first[k - 1].cumulative_logprob,
    )


def assert_continues(first, again, k) -> None:
    assert tokens_of(again) == tokens_of(first)[k:]
    assert again[-1].finish_reason == first[-1].finish_reason
    assert again[-1].cumulative_logprob == pytest.approx(first[-1].cumulative_logprob, abs=1e-4)
    assert [lp for d in again for lp in d.logprobs] == pytest.approx(
        [lp for d in first[k:] for lp in d.logprobs], abs=1e-4
    )
    assert again[0].num_prompt_tokens == first[0].num_prompt_tokens == len(PROMPT)


def min_new_variant(engine) -> SamplingParams:
    """Stop tokens that a plain greedy run meets early, held off by ``min_new_tokens``."""
    engine.add_request("probe", PROMPT, SamplingParams(max_new_tokens=3, ignore_eos=True))
    first = tokens_of(collect(engine)["probe"])
    return SamplingParams(max_new_tokens=N, min_new_tokens=6, stop_token_ids=first[:2])


@pytest.mark.parametrize("variant", [*VARIANTS, "min_new_tokens"])
def test_a_replay_continues_token_for_token(tiny_model_dirs, variant):
    model_dir = tiny_model_dirs["llama"]
    engine = make_engine(model_dir, enable_prefix_caching=False)
    params = min_new_variant(engine) if variant == "min_new_tokens" else VARIANTS[variant]
    engine.add_request("first", PROMPT, params)
    first = collect(engine)["first"]
    n = len(tokens_of(first))
    assert n >= 6
    for k in sorted({1, 3, n // 2, n - 1}):
        engine = make_engine(model_dir, enable_prefix_caching=False)
        engine.submit(replayed(PROMPT, params, first, k))
        again = collect(engine)[f"r{k}"]
        assert_continues(first, again, k)
        if params.prompt_logprobs is not None:
            assert len(again[0].prompt_logprobs) == len(PROMPT)
            assert again[0].prompt_logprobs[1:] == pytest.approx(first[0].prompt_logprobs[1:], abs=1e-4)
            assert len(again[0].prompt_top_logprobs) == len(PROMPT) - 1


def test_replays_and_fresh_requests_in_one_batch(tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    alone = {}
    for name in ("seeded", "greedy", "penalties"):
        engine = make_engine(model_dir)
        engine.add_request(name, PROMPT, VARIANTS[name])
        alone[name] = collect(engine)[name]
    engine = make_engine(model_dir)
    engine.submit(replayed(PROMPT, VARIANTS["seeded"], alone["seeded"], 4))
    engine.add_request("greedy", PROMPT, VARIANTS["greedy"])
    engine.submit(
        msgspec.structs.replace(replayed(PROMPT[:9], VARIANTS["penalties"], alone["penalties"], 2), request_id="p")
    )
    engine.add_request("seeded", PROMPT, VARIANTS["seeded"])
    together = collect(engine)
    assert_continues(alone["seeded"], together["r4"], 4)
    assert tokens_of(together["greedy"]) == tokens_of(alone["greedy"])
    assert tokens_of(together["seeded"]) == tokens_of(alone["seeded"])
    assert len(tokens_of(together["p"])) == N - 2
    assert engine.blocks.num_used_blocks == 0


def test_requests_a_replay_cannot_continue_are_refused(tiny_model_dirs):
    engine = make_engine(tiny_model_dirs["llama"], max_model_len=64)
    for params, output in [
        (SamplingParams(n=2, best_of=2), [5]),
        (SamplingParams(best_of=2), [5]),
        (SamplingParams(num_beams=2), [5]),
        (SamplingParams(max_new_tokens=2), [5, 6]),
        (SamplingParams(max_new_tokens=100), [5] * 62),
        (SamplingParams(), [10**7]),
    ]:
        with pytest.raises(RequestRejected):
            engine.submit(GenerateRequest(request_id="x", prompt_ids=[5, 6], params=params, output_ids=output))
    assert not engine.groups and not engine.has_work()


def test_guided_state_is_advanced_over_the_replayed_tokens(tiny_model_dirs, tiny_tokenizer):
    pytest.importorskip("xgrammar")
    engine = make_engine(tiny_model_dirs["llama"])
    guided = GuidedDecoding("regex", "(yes|no)[0-9]")
    params = SamplingParams(max_new_tokens=8, guided=guided)
    engine.add_request("first", PROMPT, params)
    first = collect(engine)["first"]
    n = len(tokens_of(first))
    for k in range(1, n):
        engine.submit(replayed(PROMPT, params, first, k))
        assert tokens_of(collect(engine)[f"r{k}"]) == tokens_of(first)[k:]
    bad = tiny_tokenizer("zzz", add_special_tokens=False)["input_ids"]
    with pytest.raises(RequestRejected, match="does not follow"):
        engine.submit(GenerateRequest(request_id="bad", prompt_ids=PROMPT, params=params, output_ids=bad))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("vocab", [7, 400, 4099])
def test_advancing_a_generator_skips_exactly_the_draws_of_the_replayed_tokens(dtype, vocab):
    """The engine's draws (``sample_rows``) from real, peaked distributions move a generator
    exactly as far as :func:`replay.advance` does, and the draws after it are the same."""
    rows = torch.softmax(torch.randn(6, vocab) * 4, dim=-1).to(dtype)
    drawn = torch.Generator().manual_seed(1234)
    for i in range(5):
        sample_rows(rows[i : i + 1], [drawn])
    advanced = torch.Generator().manual_seed(1234)
    replay.advance(advanced, rows[0], 5)
    assert torch.equal(drawn.get_state(), advanced.get_state())
    assert sample_rows(rows[5:], [drawn]).tolist() == sample_rows(rows[5:], [advanced]).tolist()


@pytest.fixture(scope="module")
def wide_heads_model(tmp_path_factory):
    """A tiny Llama with 64-wide heads and 4 layers: there the CPU's prompt and decode attention
    kernels round some rows differently in bf16 and the difference reaches the tokens (with the
    16-wide heads and 2 layers of the usual tiny models it does not)."""
    from tests.tiny_models import build_model

    return build_model(tmp_path_factory.mktemp("wide-heads"), "llama", seed=3, hidden_size=256, num_attention_heads=4, num_hidden_layers=4,
                       num_key_value_heads=2, intermediate_size=256)  # fmt: skip


@pytest.mark.parametrize("deterministic", [False, True])
def test_bf16_replays_continue_bit_for_bit(wide_heads_model, deterministic):
    """The replayed tokens are attended as the decodes that produced them, so in bf16 too every
    continuation is the first run's, log-probabilities to the last bit, whether the replays run
    alone or together (deterministic mode's ops attend every prompt row so; nothing is marked)."""
    check_bf16_replays_bit_for_bit(wide_heads_model, deterministic=deterministic)


def check_bf16_replays_bit_for_bit(model_dir, **engine_overrides) -> None:
    """Replays cut after 1, 13, 26 and 39 tokens, alone and together, continue the first run's
    tokens and log-probabilities exactly (``engine_overrides``: the device, the mode)."""
    params = SamplingParams(max_new_tokens=40, ignore_eos=True, logprobs=1)
    prompts = [PROMPT * 3, PROMPT[3:] * 4, [9, 8, 7, 6, 5, 4, 3, 2, 1, 2, 3] * 5, PROMPT[::-1] * 3]
    engine = make_engine(
        model_dir, dtype="bf16", enable_prefix_caching=False, max_num_batched_tokens=256, **engine_overrides
    )
    for i, prompt in enumerate(prompts):
        engine.add_request(f"c{i}", prompt, params)
    first = collect(engine)
    cuts = (1, 13, 26, 39)
    for together in (False, True):
        for k in cuts:
            for i, prompt in enumerate(prompts):
                request = replayed(prompt, params, first[f"c{i}"], k)
                engine.submit(msgspec.structs.replace(request, request_id=f"r{i}-{k}"))
                if not together:
                    again = collect(engine)[f"r{i}-{k}"]
                    assert tokens_of(again) == tokens_of(first[f"c{i}"])[k:], (i, k)
        if together:
            out = collect(engine)
            for k in cuts:
                for i in range(len(prompts)):
                    again, orig = out[f"r{i}-{k}"], first[f"c{i}"]
                    assert tokens_of(again) == tokens_of(orig)[k:], (i, k)
                    assert [lp for d in again for lp in d.logprobs] == [lp for d in orig[k:] for lp in d.logprobs]
    assert engine.blocks.num_used_blocks == 0

"""On a machine with a CUDA GPU: overlapped steps (option.async_scheduling, on by default there)
give the serial engine's tokens, eagerly and with graphs, greedy and seeded."""

import pytest

from lmiserve.wire import SamplingParams
from tests.unit.engine.engine_helpers import make_engine
from tests.unit.engine.overlap_helpers import both, same

pytestmark = pytest.mark.cuda


def test_overlap_is_on_by_default_on_cuda(tiny_model_dirs):
    assert make_engine(tiny_model_dirs["llama"], device="cuda:0", async_scheduling="auto").overlap is not None


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "graphs"])
def test_overlapped_steps_on_cuda_give_the_serial_deltas(eager, tiny_model_dirs, tiny_tokenizer):
    prompts = [tiny_tokenizer(p)["input_ids"] for p in ("What is Deep Learning?", "The quick brown fox " * 6, "Hi")]
    arrivals = {
        0: [
            ("greedy", prompts[0], SamplingParams(max_new_tokens=12, logprobs=2)),
            (
                "seeded",
                prompts[1],
                SamplingParams(max_new_tokens=10, do_sample=True, seed=3, temperature=0.7, top_p=0.9),
            ),
        ],
        2: [("late", prompts[2], SamplingParams(max_new_tokens=8, ignore_eos=True))],
        3: [("mixed", prompts[2], SamplingParams(max_new_tokens=6, do_sample=True, seed=9, top_k=5, n=2))],
    }
    options = {"device": "cuda:0", "max_num_batched_tokens": 16, "enforce_eager": eager}
    serial, overlapped = both(tiny_model_dirs["llama"], arrivals, abort_after={"late": 5}, options=options)
    assert same(serial, overlapped, exact=False)

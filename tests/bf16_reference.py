"""The engine's bf16 greedy tokens on the embedded SmolLM2 against transformers' generate in
bf16: equal, except where transformers' top two logits are a near-tie at the first difference and
our token's logit there is within the same margin of the top one (one of the near-tie, which may
hold more than two tokens: on an AVX512_BF16 Xeon without AMX, five tokens tied at 37.0)."""

from __future__ import annotations

import functools
import hashlib
import math
from pathlib import Path

import torch

from lmiserve.file_lock import file_lock
from lmiserve.wire import SamplingParams
from tests.unit.engine.engine_helpers import make_engine, run

TIE_ULPS = 4
"""bf16 near-tie margin: transformers' top two logits within 4 bf16 steps at their magnitude
(one step is 2**(floor(log2 |logit|) - 7); at a logit of 30, 4 steps are 0.5)."""

TEXTS = ["What is Deep Learning?", "The capital of France is", "def fibonacci(n):"]
NEW_TOKENS = 32


def bf16_margin(logit: float) -> float:
    return TIE_ULPS * 2.0 ** (math.floor(math.log2(max(abs(logit), 1e-30))) - 7)


Greedy = list[tuple[list[int], list[int], torch.Tensor]]


def shared_transformers_greedy(model_dir, device: str, texts: tuple[str, ...], shared: Path) -> Greedy:
    """:func:`transformers_greedy`, computed by the first of the test run's processes (pytest-xdist's
    workers) that asks, in ``shared`` (a directory they all see), and read there by the others."""
    key = hashlib.sha256(repr((str(model_dir), device, texts)).encode()).hexdigest()[:16]
    path = shared / f"bf16-greedy-{key}.pt"
    with file_lock(path.with_suffix(".lock")):
        if not path.exists():
            torch.save(transformers_greedy(model_dir, device, texts), path)
    return torch.load(path)


@functools.cache
def transformers_greedy(model_dir, device: str, texts: tuple[str, ...]) -> Greedy:
    """Per text: its prompt's ids, transformers' greedy new tokens in bf16, and the logits of each
    step (fp32, on the CPU); computed once per process, model, device and texts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
    greedy = []
    for text in texts:
        prompt = tok(text)["input_ids"]
        out = hf.generate(
            torch.tensor([prompt], device=device),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        logits = torch.stack([step[0].float().cpu() for step in out.logits])
        greedy.append((prompt, out.sequences[0, len(prompt) :].tolist(), logits))
    return greedy


def assert_bf16_greedy_matches_transformers(
    model_dir, device: str, texts: list[str] = TEXTS, shared: Path | None = None, **engine_args
) -> None:
    """``shared``: a directory every process of the test run sees, where the reference is computed
    once for all of them."""
    if shared is None:
        reference = transformers_greedy(model_dir, device, tuple(texts))
    else:
        reference = shared_transformers_greedy(model_dir, device, tuple(texts), shared)
    engine = make_engine(model_dir, device=device, dtype="bf16", max_model_len=512, max_num_seqs=8, **engine_args)
    params = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    tokens, _, _ = run(engine, {0: [(str(i), prompt, params) for i, (prompt, _, _) in enumerate(reference)]})
    for i, (_, want, step_logits) in enumerate(reference):
        ours = tokens[str(i)][0]
        first = next((j for j, (a, b) in enumerate(zip(ours, want)) if a != b), None)
        if first is None:
            assert ours == want
            continue
        logits = step_logits[first]
        top2 = logits.topk(2)
        gap = float(top2.values[0] - top2.values[1])
        assert gap <= bf16_margin(float(top2.values[0])), (texts[i], first, gap)
        # our token is one of the near-tie: its logit within the margin of the top one (with a tie
        # of three or more, topk's two indices are any two of them)
        behind = float(top2.values[0] - logits[ours[first]])
        assert behind <= bf16_margin(float(top2.values[0])), (texts[i], first, behind)

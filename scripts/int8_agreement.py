#!/usr/bin/env python3
"""How far greedy text with int8 activations (``option.quantize_activations=int8``) agrees with
the same model's without them, in the engine, in-process:

    python scripts/int8_agreement.py [--model DIR] [--dtype bf16] [--tokens 64] [--quantize int8]

For each prompt (a fixed set of chat, code and prose openings) it prints the tokens the two runs
share before they part, and their sum against all tokens generated; beside them, as a yardstick,
the same for the model in the other dtype (fp32 against bf16), whose only change is rounding. ``--model``: a model directory (default: the embedded SmolLM2, served from its
Q4_1 blocks); ``--quantize int8``: a plain checkpoint's weights quantized at load to Q8_0 blocks.
"""

from __future__ import annotations

import argparse
from pathlib import Path

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "List three colors:",
    "Once upon a time, in a land far away,",
    "Explain photosynthesis in one sentence.",
    "import numpy as np\n\n# multiply two matrices\n",
    "The three laws of thermodynamics are",
    "Write a haiku about the sea.",
    "SELECT name, age FROM users WHERE",
    "Translate to French: Good morning, how are you?",
    "The quick brown fox",
    "What is 17 times 23?",
    "In 1969, the first humans",
    "A recipe for pancakes: first,",
    "class Stack:\n    def __init__(self):",
    "The most important thing about machine learning is",
]


def greedy(model_dir: Path, dtype: str, tokens: int, quantize: str | None, int8: bool) -> list[list[int]]:
    from transformers import AutoTokenizer

    from lmiserve.rolling_batch.core.engine import Engine, EngineConfig
    from lmiserve.wire import SamplingParams

    tok = AutoTokenizer.from_pretrained(model_dir)
    config = EngineConfig(
        model_dir=model_dir,
        dtype=dtype,
        max_num_seqs=len(PROMPTS),
        max_model_len=256,
        quantize=quantize,
        quantize_activations="int8" if int8 else "none",
    )
    engine = Engine(config)
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
    for i, text in enumerate(PROMPTS):
        engine.add_request(str(i), tok(text)["input_ids"], params)
    out: dict[str, list[int]] = {str(i): [] for i in range(len(PROMPTS))}
    while engine.has_work():
        for delta in engine.step():
            out[delta.request_id].extend(delta.token_ids)
    return [out[str(i)] for i in range(len(PROMPTS))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--quantize", default=None)
    args = ap.parse_args()
    model = args.model
    if model is None:
        from lmiserve.model_store import resolve_model

        model = resolve_model(None, Path("/nonexistent-model-dir"))
    plain = greedy(model, args.dtype, args.tokens, args.quantize, False)
    int8 = greedy(model, args.dtype, args.tokens, args.quantize, True)
    other = "fp32" if args.dtype != "fp32" else "bf16"
    yardstick = greedy(model, other, args.tokens, args.quantize, False)
    print(f"{'prompt':<48} tokens agreeing before they part (of {args.tokens}): int8 activations; {other}")
    sums = [0, 0]
    for text, a, b, c in zip(PROMPTS, plain, int8, yardstick):
        parts = [_prefix(a, b), _prefix(a, c)]
        sums = [s + p for s, p in zip(sums, parts)]
        print(f"{text[:46]!r:<48} {parts[0]:>3}; {parts[1]:>3}")
    total = args.tokens * len(PROMPTS)
    print(
        f"against {args.dtype} without them: int8 activations {sums[0]}/{total} ({sums[0] / total:.0%}) of the tokens"
    )
    print(
        f"before they part; {other} (the yardstick: only the dtype's rounding changes) {sums[1]}/{total} ({sums[1] / total:.0%})"
    )


def _prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))


if __name__ == "__main__":
    main()

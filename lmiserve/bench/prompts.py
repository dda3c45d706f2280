"""Fixed, seeded prompts of a chosen length in tokens."""

from __future__ import annotations

import random
from typing import Any

WORDS = (
    "the model serves requests while new prompts join the running batch and every token streams out as soon as "
    "it is sampled so clients see text appear word by word across many concurrent streams on two small cores "
    "memory bandwidth decides how fast weights are read attention reads keys and values from paged blocks"
).split()


def make_prompts(tokenizer: Any, count: int, length: int, seed: int = 0, salt: str = "") -> list[list[int]]:
    """``count`` different prompts of exactly ``length`` token ids (seeded).

    ``salt`` (a few words) starts every prompt: a server that has seen the same prompts in an
    earlier run then finds nothing of them in its prefix cache.
    """
    rng = random.Random(seed)
    head = tokenizer(salt, add_special_tokens=False)["input_ids"] if salt else []
    prompts = []
    for _ in range(count):
        ids: list[int] = []
        while len(ids) < length:
            words = " ".join(rng.choice(WORDS) for _ in range(length))
            ids = tokenizer(" " + words, add_special_tokens=False)["input_ids"]
        prompts.append((head + ids)[:length])
    return prompts


def as_text(tokenizer: Any, prompts: list[list[int]]) -> list[str]:
    return [tokenizer.decode(p) for p in prompts]

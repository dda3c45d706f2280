"""What bench's requests ask: ``random`` (seeded word salad of a chosen length in tokens, see
:mod:`.prompts`) or ``grounded`` (requests whose answers repeat long spans of the prompt: copy a
passage with one word replaced, copy it and quote one of its sentences, copy a code snippet with
a variable renamed or a comment line added; where prompt-lookup speculation does well).

Grounded prompts are built from the texts of :mod:`.grounded_texts`, seeded, every one different
(no prefix-cache hits between them beyond the instruction's first words). A chat API sends one as
the user message; a completion API sends it in the model's chat template where the tokenizer has
one (an instruct model then answers it as the chat API's request), else as it is.
"""

from __future__ import annotations

import random
from typing import Any

from .grounded_texts import CODE, COMMENTS, NEW_NAMES, PASSAGES, REPLACEMENTS
from .prompts import as_text, make_prompts

WORKLOADS = ("random", "grounded")
CHAT_APIS = frozenset({"openai-chat"})
ORDINALS = ("first", "second", "third", "fourth")
CODE_SHARE = 1 / 3
"""Share of grounded requests about code (the rest are about prose)."""
DISTINCT_TRIES = 50


def _sentences(text: str) -> list[str]:
    parts = [s.strip() for s in text.replace("\n", " ").split(". ")]
    return [s if s.endswith(".") else s + "." for s in parts if s]


def _prose(rng: random.Random) -> str:
    picks = rng.sample(range(len(PASSAGES)), 2 if rng.random() < 2 / 3 else 1)
    document = " ".join(PASSAGES[i][0] for i in picks)
    words = [w for i in picks for w in PASSAGES[i][1]]
    task = rng.choice(("replace", "replace", "quote"))
    if task == "replace":
        old, new = rng.choice(words), rng.choice(REPLACEMENTS)
        ask = f'Copy the following text exactly, but replace every "{old}" with "{new}".'
    else:
        ordinal = ORDINALS[rng.randrange(min(len(ORDINALS), len(_sentences(document))))]
        ask = f"Copy the following text exactly, then quote its {ordinal} sentence."
    return f"{ask}\n\n{document}"


def _code(rng: random.Random) -> str:
    snippet, names = rng.choice(CODE)
    task = rng.choice(("rename", "rename", "comment", "explain"))
    if task == "rename":
        old, new = rng.choice(names), rng.choice(NEW_NAMES)
        ask = f"Copy the following code exactly, but rename the variable `{old}` to `{new}`."
    elif task == "comment":
        marker = "//" if snippet.rstrip().endswith("}") else "#"
        ask = f"Copy the following code exactly, and add the line `{marker} {rng.choice(COMMENTS)}` as its first line."
    else:
        ask = "Copy the following code exactly, then explain in one sentence what it does."
    return f"{ask}\n\n```\n{snippet}```"


def grounded_prompts(count: int, seed: int = 0, salt: str = "") -> list[str]:
    """``count`` different grounded requests (seeded), each started by ``salt`` where given. Past
    the texts' combinations, a request is told apart by its number."""
    rng = random.Random(seed)
    seen: set[str] = set()
    prompts = []
    for n in range(count):
        for _ in range(DISTINCT_TRIES):
            text = _code(rng) if rng.random() < CODE_SHARE else _prose(rng)
            if text not in seen:
                break
        else:
            text = f"Request {n}. {text}"
        seen.add(text)
        prompts.append(f"{salt} {text}" if salt else text)
    return prompts


def for_api(tokenizer: Any, messages: list[str], api: str) -> list[str]:
    """What a request sends: the user message itself to a chat API, else the message in the
    tokenizer's chat template (with the assistant's turn opened) where it has one."""
    if api in CHAT_APIS or not getattr(tokenizer, "chat_template", None):
        return list(messages)
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True, tokenize=False)
        for m in messages
    ]


def build(
    workload: str, tokenizer: Any, count: int, prompt_tokens: int, seed: int, salt: str, api: str
) -> tuple[list[str], list[list[int]]]:
    """The requests' texts as the API sends them, and their token ids (the baseline's prompts;
    for a chat API, the ids of the prompt in the chat template)."""
    if workload == "random":
        ids = make_prompts(tokenizer, count, prompt_tokens, seed, salt)
        return as_text(tokenizer, ids), ids
    if workload != "grounded":
        raise ValueError(f"unknown workload {workload!r}: one of {', '.join(WORKLOADS)}")
    messages = grounded_prompts(count, seed, salt)
    texts = for_api(tokenizer, messages, api)
    templated = texts if api not in CHAT_APIS else for_api(tokenizer, messages, "openai")
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in templated]
    return texts, ids

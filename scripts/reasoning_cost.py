"""What a reasoning parser costs the API process per streamed token: the OpenAI chat responder
formats the same streams (32 choices of 128 tokens of SmolLM2's text) with and without a parser,
in this process, and prints the microseconds per token of each and the difference.

    .venv/bin/python scripts/reasoning_cost.py [--parser deepseek_r1] [--rounds 5]

``deepseek_r1`` over text without its closing marker is the dearest case: every token is read
while the thinking is open, watching for ``</think>``. Set the difference against the API
process's CPU per streamed token that ``lmiserve bench --api openai-chat`` prints.
"""

from __future__ import annotations

import argparse
import time

from lmiserve.formatters import openai_chat
from lmiserve.formatters.openai_chat_responder import ChatResponder
from lmiserve.generation import reasoning
from lmiserve.generation.request import RequestOutput, SequenceOutput, TokenOutput

TEXT = (
    "Deep learning is a subfield of machine learning that trains neural networks with many layers. "
    "Each layer turns its input into a slightly more abstract representation, and the network learns "
    "the weights of every layer from examples by gradient descent. "
) * 8


def token_texts(n: int) -> list[str]:
    import tempfile
    from pathlib import Path

    from lmiserve.generation.tokenizer import load_tokenizer
    from lmiserve.model_store import resolve_model

    tokenizer = load_tokenizer(resolve_model(None, Path(tempfile.mkdtemp())))  # the embedded SmolLM2
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"][:n]
    return [tokenizer.decode([i]) for i in ids]


def run(texts: list[str], choices: int, parser: str | None) -> float:
    """Seconds to stream ``choices`` requests of ``texts``, one token per update, interleaved."""
    req = openai_chat.parse({"messages": [{"role": "user", "content": "hi"}], "stream": True})
    outs = []
    for c in range(choices):
        seq = SequenceOutput(0)
        outs.append(
            (ChatResponder(req, "m", reasoning=reasoning.for_request(parser)), RequestOutput(f"r{c}", "", [1], [seq]))
        )
    for responder, out in outs:
        responder.start([out])
    start = time.perf_counter()
    for i, text in enumerate(texts):
        for responder, out in outs:
            seq = out.sequences[0]
            token = TokenOutput(i, text, -0.5)
            seq.tokens.append(token)
            seq.new_tokens = [token]
            seq.text += text
            seq.finish_reason = "length" if i == len(texts) - 1 else None
            responder.chunk(0, out)
    for responder, out in outs:
        responder.end([out])
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parser", default="deepseek_r1", choices=reasoning.NAMES)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--choices", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    texts = token_texts(args.tokens)
    n = len(texts) * args.choices
    best = {}
    for name in (None, args.parser):
        best[name] = min(run(texts, args.choices, name) for _ in range(args.rounds)) / n * 1e6
    print(f"chat responder, {args.choices} streams of {len(texts)} tokens, best of {args.rounds}:")
    print(f"  no parser:        {best[None]:.1f} us per token")
    print(f"  {args.parser + ':':17} {best[args.parser]:.1f} us per token")
    print(f"  the parser's cost: {best[args.parser] - best[None]:.1f} us per token")


if __name__ == "__main__":
    main()

"""The API side of a stream: one engine step's text decoded for every request at once, and a
client that fell behind getting what has already arrived in one write, byte for byte the same."""

import asyncio
import json
import random

import pytest

from lmiserve import wire
from lmiserve.formatters.lmi_rolling import Defaults, parse_request
from lmiserve.formatters.lmi_rolling_output import LmiResponder
from lmiserve.generation.detokenizer import IncrementalDetokenizer, batch_decoder, decode_step
from lmiserve.generation.output_processor import OutputProcessor, detokenize_step
from lmiserve.rolling_batch.process.client import RequestStream
from lmiserve.serving.respond import respond

TEXT = "Große Füchse 😀 springen über 東京 and plain words, then more plain words here."


def test_the_tiny_tokenizer_decodes_in_batches(tiny_tokenizer):
    assert batch_decoder(tiny_tokenizer) is not None


def test_a_step_decoded_at_once_gives_each_sequence_its_own_pieces(tiny_tokenizer):
    rng = random.Random(1)
    special = set(tiny_tokenizer.all_special_ids)
    vocab = len(tiny_tokenizer)
    prompts = [tiny_tokenizer(p)["input_ids"] for p in ("Hi", "Numbers: ", "What is", TEXT)]
    gens = [tiny_tokenizer(TEXT, add_special_tokens=False)["input_ids"]] + [
        [t for t in (rng.randrange(vocab) for _ in range(40)) if t not in special] for _ in range(3)
    ]
    alone = [IncrementalDetokenizer(tiny_tokenizer, p) for p in prompts]
    together = [IncrementalDetokenizer(tiny_tokenizer, p) for p in prompts]
    for step in range(max(map(len, gens))):
        live = [i for i, g in enumerate(gens) if step < len(g)]
        expected = [alone[i].add([gens[i][step]]) for i in live]
        assert decode_step([(together[i], gens[i][step]) for i in live]) == expected
    assert [d.text for d in together] == [d.text for d in alone]


def processor(tokenizer, rid, stop=()):
    body = {"inputs": "Hi", "parameters": {"stop_sequences": list(stop)}}
    parsed = parse_request(json.dumps(body).encode(), Defaults())
    return OutputProcessor(tokenizer, rid, parsed.generation, tokenizer("Hi")["input_ids"])


def deltas_for(tokenizer, rid, text, per_delta=1, finish="length"):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    chunks = [ids[i : i + per_delta] for i in range(0, len(ids), per_delta)]
    out = [wire.SeqDelta(request_id=rid, token_ids=c, logprobs=[-1.0] * len(c)) for c in chunks]
    out[-1].finish_reason = finish
    return out


@pytest.mark.parametrize("per_delta", [1, 3])
def test_deltas_decoded_when_their_step_arrives_give_the_same_outputs(tiny_tokenizer, per_delta):
    """Several steps' deltas decoded before any is applied (a lagging request, or steps merged
    on their way), with a stop string that ends one sequence early."""
    texts = {"a": TEXT, "b": "one two three STOP four five", "c": "short"}
    stops = {"b": ["STOP"]}
    plain = {r: processor(tiny_tokenizer, r, stops.get(r, ())) for r in texts}
    early = {r: processor(tiny_tokenizer, r, stops.get(r, ())) for r in texts}
    streams = {r: deltas_for(tiny_tokenizer, r, t, per_delta) for r, t in texts.items()}
    steps = [[s[k] for s in streams.values() if k < len(s)] for k in range(max(map(len, streams.values())))]
    for first in range(0, len(steps), 3):  # three steps at a time arrive before they are applied
        window = [d for step in steps[first : first + 3] for d in step]
        detokenize_step((early[d.request_id], d) for d in window)
        for d in window:
            assert early[d.request_id].apply(d) == plain[d.request_id].apply(d)
            ours, theirs = early[d.request_id].output.sequences[0], plain[d.request_id].output.sequences[0]
            assert ours.new_tokens == theirs.new_tokens
    for r in texts:
        assert early[r].output.sequences[0].text == plain[r].output.sequences[0].text
        assert early[r].output.sequences[0].finish_reason == plain[r].output.sequences[0].finish_reason
    assert early["b"].output.sequences[0].finish_reason == "stop_sequence"
    assert early["a"].output.sequences[0].text == TEXT


class FakeModel:
    """Stands in for an engine model: the test feeds the request's stream itself."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.stream: RequestStream | None = None
        self.aborted: list[str] = []

    def submit(self, request, budget=None, tenant=None):
        proc = OutputProcessor(self.tokenizer, "r", request, self.tokenizer("Hi")["input_ids"])
        self.stream = RequestStream("r", 1)
        return "r", proc, self.stream

    def abort(self, request_id, index=None):
        self.aborted.append(request_id)


async def stream_body(tokenizer, deltas, lagging: bool, fmt: str) -> list[bytes]:
    body = {"inputs": "Hi", "stream": True, "parameters": {"output_formatter": fmt}}
    parsed = parse_request(json.dumps(body).encode(), Defaults())
    model = FakeModel(tokenizer)
    if lagging:  # every delta is there before the client reads a byte
        task = asyncio.ensure_future(respond(model, [parsed.generation], LmiResponder(parsed), 30.0))
        await asyncio.sleep(0)
        for d in deltas:
            model.stream.put(d)
        reply = await task
        return [chunk async for chunk in reply.chunks]
    task = asyncio.ensure_future(respond(model, [parsed.generation], LmiResponder(parsed), 30.0))
    await asyncio.sleep(0)
    model.stream.put(deltas[0])
    reply = await task
    chunks = []
    it = reply.chunks.__aiter__()
    chunks.append(await it.__anext__())
    for d in deltas[1:]:
        model.stream.put(d)
        chunks.append(await it.__anext__())
    chunks += [c async for c in it]
    return chunks


@pytest.mark.parametrize("fmt", ["jsonlines", "sse"])
def test_a_lagging_stream_is_written_in_one_piece_with_the_same_bytes(tiny_tokenizer, fmt):
    deltas = deltas_for(tiny_tokenizer, "r", TEXT)
    paced = asyncio.run(stream_body(tiny_tokenizer, deltas, lagging=False, fmt=fmt))
    lagging = asyncio.run(stream_body(tiny_tokenizer, deltas_for(tiny_tokenizer, "r", TEXT), lagging=True, fmt=fmt))
    assert b"".join(lagging) == b"".join(paced)
    assert len(paced) >= len(deltas)  # one write per token when the client keeps up
    assert len(lagging) <= 2  # the first update opens the stream; the rest had all arrived

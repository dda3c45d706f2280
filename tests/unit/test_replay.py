"""Replays of requests across engine crashes (lmiserve.serving.replay), with fake engines: what
each reader receives, what each restarted engine is given, and which request is blamed."""

from __future__ import annotations

import asyncio

from lmiserve import wire
from lmiserve.errors import RequestPoisoned, WorkerDied
from lmiserve.rolling_batch.process.client import RequestStream
from lmiserve.serving.replay import ReplayingStream, Replays


class FakeEngine:
    """An engine client: records what it is given; the test sends deltas and kills it."""

    def __init__(self, resumes: bool = True):
        self.resumes = resumes
        self.alive = True
        self.streams: dict[str, RequestStream] = {}
        self.given: dict[str, dict] = {}

    def submit(self, request_id, prompt_ids, params, adapter="", *, output_ids=None, cumulative_logprob=0.0, **more):
        deadline, images = more.get("deadline", 0.0), more.get("images", ())
        if not self.alive:
            raise WorkerDied("the engine is not running")
        stream = RequestStream(request_id, max(params.n, params.best_of, 1))
        self.streams[request_id] = stream
        self.given[request_id] = {
            "prompt_ids": list(prompt_ids),
            "output_ids": list(output_ids or []),
            "cumulative_logprob": cumulative_logprob,
            "prompt_logprobs": params.prompt_logprobs,
            "deadline": deadline,
            "images": list(images),
        }
        return stream

    def send(self, request_id: str, tokens: list[int], logprob: float = 0.0, finish: str | None = None) -> None:
        self.streams[request_id].put(
            wire.SeqDelta(request_id=request_id, token_ids=tokens, cumulative_logprob=logprob, finish_reason=finish)
        )

    def kill(self) -> None:
        self.alive = False
        for stream in self.streams.values():
            stream.fail(WorkerDied("the engine process exited (killed by SIGKILL) while handling this request"))
        self.streams.clear()


class FakeModel:
    """The engine source: a generation number per engine, and waiters for the next one."""

    name = "tiny"

    def __init__(self, max_replays: int = 2, resumes: bool = True):
        self.max_replays = max_replays
        self.replays = Replays()
        self.resumes = resumes
        self.engine = FakeEngine(resumes)
        self.generation = 1
        self.failed = False
        self._next: asyncio.Future | None = None

    async def engine_after(self, generation: int):
        while True:
            if self.engine.alive and self.generation > generation:
                return self.engine, self.generation
            if self.failed:
                raise WorkerDied("model tiny failed: cannot restart")
            if self._next is None or self._next.done():
                self._next = asyncio.get_running_loop().create_future()
            await self._next

    def crash(self) -> None:
        self.engine.kill()

    def restart(self) -> FakeEngine:
        self.engine = FakeEngine(self.resumes)
        self.generation += 1
        if self._next is not None and not self._next.done():
            self._next.set_result(None)
        return self.engine

    def give_up(self) -> None:
        self.failed = True
        if self._next is not None and not self._next.done():
            self._next.set_result(None)

    def stream(self, request_id: str, prompt=(1, 2, 3), **params) -> ReplayingStream:
        s = ReplayingStream(self, request_id, list(prompt), wire.SamplingParams(**params), deadline=123.0)
        s.hand_to(self.engine, self.generation)
        return s


class Reader:
    """Reads a stream on a task: ``tokens`` so far, ``error`` if it ended with one."""

    def __init__(self, stream: ReplayingStream):
        self.tokens: list[int] = []
        self.finish: str | None = None
        self.error: Exception | None = None
        self.task = asyncio.ensure_future(self._read(stream))

    async def _read(self, stream: ReplayingStream) -> None:
        try:
            async for delta in stream:
                self.tokens += delta.token_ids
                self.finish = delta.finish_reason or self.finish
        except Exception as exc:  # noqa: BLE001 - what the reader got
            self.error = exc


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def run(coro):
    return asyncio.run(coro)


def test_a_request_with_nothing_sent_starts_again_from_its_prompt():
    async def main():
        model = FakeModel()
        stream = model.stream("a", prompt_logprobs=0)
        reader = Reader(stream)
        await settle()
        model.crash()
        await settle()
        assert not reader.task.done()  # waiting for the restart, not failed
        engine = model.restart()
        await settle()
        assert engine.given["a"]["output_ids"] == [] and engine.given["a"]["prompt_ids"] == [1, 2, 3]
        assert engine.given["a"]["prompt_logprobs"] == 0 and engine.given["a"]["deadline"] == 123.0
        engine.send("a", [7, 8], finish="length")
        await reader.task
        assert reader.error is None and reader.tokens == [7, 8] and reader.finish == "length"
        assert model.replays.counts() == {"replayed": 1, "resumed": 0, "poisoned": 0}

    run(main())


def test_a_streaming_request_continues_from_the_tokens_it_already_sent():
    async def main():
        model = FakeModel()
        reader = Reader(model.stream("a", prompt_logprobs=1))
        await settle()
        model.engine.send("a", [10], logprob=-0.5)
        model.engine.send("a", [11], logprob=-1.25)
        await settle()
        model.crash()
        engine = model.restart()
        await settle()
        given = engine.given["a"]
        assert given["prompt_ids"] == [1, 2, 3] and given["output_ids"] == [10, 11]
        assert given["cumulative_logprob"] == -1.25
        assert given["prompt_logprobs"] is None  # already sent with the first delta
        engine.send("a", [12], finish="length")
        await reader.task
        assert reader.error is None and reader.tokens == [10, 11, 12]
        assert model.replays.counts() == {"replayed": 0, "resumed": 1, "poisoned": 0}

    run(main())


def test_a_started_stream_ends_with_the_crash_where_the_engine_cannot_continue_it():
    async def main():
        model = FakeModel(resumes=False)
        reader = Reader(model.stream("a"))
        await settle()
        model.engine.send("a", [10])
        await settle()
        model.crash()
        model.restart()
        await reader.task
        assert isinstance(reader.error, WorkerDied) and reader.tokens == [10]

    run(main())


def test_several_sequences_already_streaming_end_with_the_crash():
    async def main():
        model = FakeModel()
        reader = Reader(model.stream("a", n=2, do_sample=True))
        await settle()
        model.engine.send("a", [10])
        await settle()
        model.crash()
        model.restart()
        await reader.task
        assert isinstance(reader.error, WorkerDied)

    run(main())


def test_replays_stop_at_max_replays():
    async def main():
        model = FakeModel(max_replays=1)
        reader = Reader(model.stream("a"))
        await settle()
        model.engine.send("a", [10])
        await settle()
        model.crash()
        model.restart()
        await settle()
        model.engine.send("a", [11])
        await settle()
        model.crash()
        model.restart()
        await reader.task
        assert isinstance(reader.error, WorkerDied) and reader.tokens == [10, 11]

    run(main())


def test_a_deadline_while_waiting_for_the_restart_ends_the_wait():
    async def main():
        model = FakeModel()
        stream = model.stream("a")
        reader = Reader(stream)
        await settle()
        model.crash()
        await settle()
        stream.fail(TimeoutError("deadline"))
        await reader.task
        assert isinstance(reader.error, TimeoutError)
        engine = model.restart()
        await settle()
        assert "a" not in engine.given  # never handed to the new engine

    run(main())


def test_a_model_that_cannot_restart_ends_the_waiting_requests():
    async def main():
        model = FakeModel()
        reader = Reader(model.stream("a"))
        await settle()
        model.crash()
        await settle()
        model.give_up()
        await reader.task
        assert isinstance(reader.error, WorkerDied) and "cannot restart" in str(reader.error)

    run(main())


def test_a_request_starting_at_two_consecutive_crashes_is_taken_for_their_cause(caplog):
    async def main():
        model = FakeModel()
        busy = Reader(model.stream("busy"))
        await settle()
        model.engine.send("busy", [5])
        await settle()
        poison = Reader(model.stream("poison"))  # sent, nothing back: starting when the engine dies
        await settle()
        model.crash()
        engine = model.restart()
        await settle()
        # the blamed request goes in alone, before anything is let in after it; the other at once
        assert set(engine.given) == {"busy", "poison"}
        model.crash()  # while the blamed request is starting again
        engine = model.restart()
        await settle()
        await poison.task
        assert isinstance(poison.error, RequestPoisoned) and poison.error.status == 424
        assert "poison" not in engine.given  # never a third time
        engine.send("busy", [6], finish="length")
        await busy.task
        assert busy.error is None and busy.tokens == [5, 6]
        assert model.replays.poisoned == 1

    with caplog.at_level("ERROR", logger="lmiserve.model"):
        run(main())
    assert "request poison was starting in the engine at two consecutive crashes" in caplog.text


def test_crashes_that_are_not_consecutive_blame_no_one_twice():
    async def main():
        model = FakeModel(max_replays=3)
        reader = Reader(model.stream("a"))
        await settle()
        model.crash()  # blamed: nothing back yet
        engine = model.restart()
        await settle()
        engine.send("a", [1])
        await settle()
        model.crash()  # it had started: not blamed
        engine = model.restart()
        await settle()
        model.crash()  # starting again (continuing): blamed, but the last blame was two crashes ago
        engine = model.restart()
        await settle()
        engine.send("a", [2], finish="length")
        await reader.task
        assert reader.error is None and reader.tokens == [1, 2]

    run(main())


def test_blamed_requests_are_replayed_one_at_a_time():
    async def main():
        model = FakeModel()
        readers = {rid: Reader(model.stream(rid)) for rid in ("x", "y")}
        await settle()
        model.crash()  # both blamed
        engine = model.restart()
        await settle()
        first = set(engine.given)
        assert len(first) == 1  # the other waits for the first one's first token
        (one,) = first
        engine.send(one, [1])
        await settle()
        assert set(engine.given) == {"x", "y"}
        other = ({"x", "y"} - first).pop()
        engine.send(other, [2], finish="length")
        engine.send(one, [3], finish="length")
        for reader in readers.values():
            await reader.task
            assert reader.error is None
        assert readers[one].tokens == [1, 3] and readers[other].tokens == [2]

    run(main())


def test_a_request_that_arrives_while_the_engine_restarts_waits_for_it():
    async def main():
        model = FakeModel()
        model.crash()
        stream = ReplayingStream(model, "late", [4, 5], wire.SamplingParams())
        reader = Reader(stream)
        await settle()
        assert not reader.task.done()
        engine = model.restart()
        await settle()
        assert engine.given["late"]["prompt_ids"] == [4, 5]
        engine.send("late", [9], finish="length")
        await reader.task
        assert reader.error is None and reader.tokens == [9]
        assert model.replays.counts() == {"replayed": 0, "resumed": 0, "poisoned": 0}

    run(main())

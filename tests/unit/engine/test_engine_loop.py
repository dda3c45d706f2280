"""The engine loop's connections: sends never wait on a slow API process, deltas reach the
connection that owns the request, in order, once."""

from __future__ import annotations

import select
import socket
import threading
import time
from pathlib import Path

import pytest

from lmiserve import wire
from lmiserve.rolling_batch.core.engine import RequestRejected
from lmiserve.rolling_batch.process.engine_process import EngineLoop, listen
from lmiserve.rolling_batch.process.outbox import Outbox


class CountingEngine:
    """Each request yields ``per_step`` token ids a step (0, 1, 2, ...) up to its max_new_tokens."""

    def __init__(self, per_step: int = 64):
        self.per_step = per_step
        self.groups: dict[str, list] = {}
        self.generated = 0
        self.aborted: list[str] = []

    def add_request(self, request_id, prompt_ids, params, adapter=""):  # type: ignore[no-untyped-def]
        if request_id in self.groups:
            raise RequestRejected("already running")
        self.groups[request_id] = [params.max_new_tokens, 0]  # limit, generated

    def submit(self, request: wire.GenerateRequest) -> None:
        self.add_request(request.request_id, request.prompt_ids, request.params, request.adapter)

    def abort(self, request_id, index=None):  # type: ignore[no-untyped-def]
        if self.groups.pop(request_id, None) is not None:  # as the engine: at once, without a delta
            self.aborted.append(request_id)

    def has_work(self) -> bool:
        return bool(self.groups)

    def step(self) -> list[wire.SeqDelta]:
        deltas = []
        for request_id, group in list(self.groups.items()):
            limit, done = group
            count = min(self.per_step, limit - done)
            ids = list(range(done, done + count))
            group[1] = done + count
            self.generated += count
            reason = "length" if group[1] >= limit else None
            if reason is not None:
                del self.groups[request_id]
            deltas.append(wire.SeqDelta(request_id=request_id, token_ids=ids, finish_reason=reason))
        return deltas

    def stats(self) -> wire.EngineStats:
        zero = dict(running=len(self.groups), waiting=0, kv_blocks_used=0, kv_blocks_total=1)
        return wire.EngineStats(
            **zero,
            prefix_cache_hit_tokens=0,
            preemptions=0,
            prompt_tokens=0,
            generated_tokens=self.generated,
            step_seconds=0.0,
        )

    def adapter_command(self, cmd: wire.AdapterCommand) -> wire.AdapterResult:
        return wire.AdapterResult(op_id=cmd.op_id)

    def close(self) -> None:
        pass


def _request(request_id: str, tokens: int) -> wire.GenerateRequest:
    return wire.GenerateRequest(
        request_id=request_id, prompt_ids=[1, 2], params=wire.SamplingParams(max_new_tokens=tokens)
    )


def _wait(condition, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.01)


def _collect(sock: socket.socket, request_ids: set[str]) -> dict[str, list[wire.SeqDelta]]:
    """Every delta until each of ``request_ids`` has finished."""
    got: dict[str, list[wire.SeqDelta]] = {}
    open_ids = set(request_ids)
    while open_ids:
        msg = wire.recv(sock)
        assert msg is not None
        if not isinstance(msg, wire.EngineStep):
            continue
        for delta in msg.deltas:
            got.setdefault(delta.request_id, []).append(delta)
            if delta.finish_reason is not None:
                open_ids.discard(delta.request_id)
    return got


def _tokens(deltas: list[wire.SeqDelta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


@pytest.fixture
def primary():
    api, engine_end = socket.socketpair()
    for s in (api, engine_end):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    engine = CountingEngine()
    outbox = Outbox(engine_end)
    loop = EngineLoop(engine, outbox.put)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    yield api, engine, loop, outbox
    loop.post(wire.Shutdown())
    thread.join(10)
    outbox.close()
    api.close()
    engine_end.close()


def test_the_engine_keeps_stepping_while_the_api_process_does_not_read(primary):
    api, engine, loop, outbox = primary
    total = 200_000  # far more than the socket buffers hold
    loop.post(_request("a", total))
    loop.post(_request("b", total // 2))
    # the reader is paused: nothing is read until the engine has generated every token
    _wait(lambda: engine.generated == total + total // 2)
    assert not engine.groups
    assert outbox.merged > 0  # the sender was behind, and the steps waiting were merged
    assert len(outbox) <= 1
    got = _collect(api, {"a", "b"})
    assert _tokens(got["a"]) == list(range(total))
    assert _tokens(got["b"]) == list(range(total // 2))
    for deltas in got.values():
        assert [d.finish_reason for d in deltas if d.finish_reason] == ["length"]
        assert deltas[-1].finish_reason == "length"


def test_steps_that_wait_are_merged_in_order_with_the_latest_stats():
    api, engine_end = socket.socketpair()
    outbox = Outbox(engine_end)
    stats = CountingEngine().stats
    # hold the sender: queue a message it cannot finish until the reader reads
    big = wire.EngineStep(deltas=[wire.SeqDelta(request_id="x", token_ids=list(range(500_000)))])
    outbox.put(big)
    _wait(lambda: len(outbox) == 0)
    for i in range(100):
        step_stats = stats()
        step_stats.generated_tokens = i
        outbox.put(wire.EngineStep(deltas=[wire.SeqDelta(request_id="y", token_ids=[i])], stats=step_stats))
    outbox.put(wire.AdapterResult(op_id=7))
    outbox.put(wire.EngineStep(deltas=[wire.SeqDelta(request_id="y", token_ids=[100])]))
    assert len(outbox) == 3
    first = wire.recv(api)
    assert first == big
    merged, result, last = wire.recv(api), wire.recv(api), wire.recv(api)
    assert [d.token_ids[0] for d in merged.deltas] == list(range(100))
    assert merged.stats.generated_tokens == 99
    assert result == wire.AdapterResult(op_id=7)
    assert last.deltas[0].token_ids == [100]
    outbox.close()
    outbox.join(5)
    api.close()
    engine_end.close()


def test_a_message_is_on_the_socket_when_put_returns_if_nothing_waits():
    """The engine loop writes a step's deltas itself (no wait for the sender thread to be run)
    where the socket takes them; what it cannot finish, the sender sends after, in order."""
    api, engine_end = socket.socketpair()
    for s in (api, engine_end):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    outbox = Outbox(engine_end)
    steps = [wire.EngineStep(deltas=[wire.SeqDelta(request_id="a", token_ids=[i])]) for i in range(3)]
    for i, step in enumerate(steps):
        outbox.put(step)
        assert outbox.written == i + 1
        readable, _, _ = select.select([api], [], [], 0)
        assert readable == [api]
        assert wire.recv(api) == step
    # larger than the socket takes: begun at once, finished by the sender, then what came after
    big = wire.EngineStep(deltas=[wire.SeqDelta(request_id="b", token_ids=list(range(200_000)))])
    outbox.put(big)
    assert outbox.written == 4
    outbox.put(steps[0])
    assert wire.recv(api) == big
    assert wire.recv(api) == steps[0]
    outbox.close()
    outbox.join(5)
    api.close()
    engine_end.close()


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    return sock


def test_each_connection_gets_its_own_requests_deltas(primary, tmp_path):
    api, engine, loop, _ = primary
    path = tmp_path / "engine.sock"
    server = listen(loop, str(path))
    try:
        other = _connect(path)
        wire.send(other, _request("other-1", 300))
        loop.post(_request("main-1", 200))
        got_other = _collect(other, {"other-1"})
        got_main = _collect(api, {"main-1"})
        assert set(got_other) == {"other-1"}
        assert _tokens(got_other["other-1"]) == list(range(300))
        assert set(got_main) == {"main-1"}
        assert _tokens(got_main["main-1"]) == list(range(200))
        # an id already running is refused to the connection that sent it, not to its owner
        loop.post(_request("same", 10**9))
        _wait(lambda: "same" in engine.groups)
        wire.send(other, _request("same", 5))
        refused = _collect(other, {"same"})["same"]
        assert refused[-1].finish_reason == "error" and refused[-1].error_kind == "validation"
        assert "same" in engine.groups
        # aborts from a connection reach only its own requests
        wire.send(other, wire.AbortRequest(request_ids=["same"]))
        wire.send(other, wire.AdapterCommand(op_id=3, action="unregister", name="x"))
        answer = wire.recv(other)
        while not isinstance(answer, wire.AdapterResult):
            answer = wire.recv(other)
        assert answer.op_id == 3
        assert "same" in engine.groups
        loop.post(wire.AbortRequest(request_ids=["same"]))
        _wait(lambda: "same" in engine.aborted and "same" not in loop.owners)
        # a connection that closes: its requests are aborted
        wire.send(other, _request("other-2", 10**9))
        _wait(lambda: "other-2" in engine.groups)
        other.close()
        _wait(lambda: "other-2" in engine.aborted)
        _wait(lambda: "other-2" not in loop.owners)
    finally:
        server.close()


def test_an_attached_client_streams_the_requests_it_sent(primary, tmp_path):
    import asyncio

    from lmiserve.rolling_batch.process.attached_client import AttachedEngineClient

    _, engine, loop, _ = primary
    path = tmp_path / "engine.sock"
    server = listen(loop, str(path))

    async def generate() -> tuple[list[int], bool]:
        client = AttachedEngineClient(str(path), {"max_model_len": 256})
        await client.start()
        stream = client.submit("p1-0", [1, 2], wire.SamplingParams(max_new_tokens=130))
        tokens = []
        async for delta in stream:
            tokens.extend(delta.token_ids)
        await client.stop()
        return tokens, client.alive

    try:
        tokens, alive = asyncio.run(generate())
        assert tokens == list(range(130)) and not alive
        _wait(lambda: len(loop._connections) == 1)  # the closed connection is forgotten
    finally:
        server.close()

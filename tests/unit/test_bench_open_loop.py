"""The open-loop load generator against a mock server on loopback (every request carries its
deadline; refusals, sheds and completions told apart), and the overload report's arithmetic."""

import asyncio
import json
import threading

import pytest

from lmiserve.bench.apis import APIS
from lmiserve.bench.open_loop import OpenRecord, offer_load, overload_report, refusals_between, refusals_by_reason

TOKENS = 5


class RefusingServer:
    """Streams TOKENS OpenAI completion chunks, but refuses every other request with 503."""

    def __init__(self):
        self.requests = 0
        self.deadlines: list[str] = []
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _serve(self, ready):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _handle(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                headers = dict(
                    line.decode().lower().split(": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line
                )
                json.loads(await reader.readexactly(int(headers["content-length"])))
                self.deadlines.append(headers.get("x-request-timeout", ""))
                self.requests += 1
                if self.requests % 2 == 0:
                    error = b'{"error": {"code": 503, "message": "predicted late; retry later"}}'
                    writer.write(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(error), error))  # fmt: skip
                    continue
                chunk = b'data: {"choices": [{"text": "x"}]}\n\n'
                body = chunk * TOKENS + b"data: [DONE]\n\n"
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def test_arrivals_carry_their_deadline_and_refusals_are_told_from_completions():
    server = RefusingServer()
    records, busy = offer_load(
        f"http://127.0.0.1:{server.port}", APIS["openai"], "Hi", TOKENS, "m", rate=200, duration=0.3, deadline=2.5
    )
    assert records and len(records) == server.requests and len(busy) == 1
    assert set(server.deadlines) == {"2.5"}
    refused = [r for r in records if r.refused]
    served = [r for r in records if r.status == 200]
    assert len(refused) + len(served) == len(records)
    assert len(refused) == len(records) // 2
    assert all(r.tokens == TOKENS and r.ttft is not None for r in served)


def record(start, end, status=200, tokens=4, first=None, body=b""):
    r = OpenRecord(start=start, end=end, status=status, tokens=tokens, body=body)
    r.first_token = first if first is not None else (start + 0.1 if status == 200 else None)
    return r


def test_the_overload_report():
    shed = b'{"error": "the request waited 2 s (its deadline) without being scheduled; retry later"}'
    records = [
        record(0.0, 1.0, first=0.2),  # on time
        record(1.0, 2.0, first=1.4),  # on time
        record(2.0, 5.0, first=4.0),  # late
        record(3.0, 3.001, status=503, tokens=0),  # refused
        record(3.5, 3.503, status=503, tokens=0),  # refused
        record(4.0, 6.0, status=503, tokens=0, body=shed),  # admitted, then shed
        record(4.5, 5.0, tokens=2),  # truncated at its deadline
    ]
    report = overload_report(
        records, rate=2.0, duration=5.0, deadline=2.0, max_new_tokens=4, capacity_tokens_per_s=4.0, unloaded_ttft=0.1
    )
    assert (report["offered"], report["admitted"], report["refused"]) == (7, 5, 2)
    assert report["offered_per_s"] == 7 / 5
    assert report["refusal_ms"]["max"] == 3.0 and report["refusal_ms"]["p50"] == 2.0
    assert report["completed_in_deadline"] == 2 and report["deadline_misses"] == 3
    assert report["goodput_tokens_per_s"] == 8 / 6  # 8 tokens on time over the 6 s of the level
    assert report["goodput_ratio"] == (8 / 6) / 4.0
    # the overload itself: arrivals from 0 to 4.5 s; both on-time streams (0.2-1.0, 1.4-2.0) inside it
    assert report["steady_goodput_tokens_per_s"] == pytest.approx(8 / 4.5)
    assert report["steady_goodput_ratio"] == pytest.approx((8 / 4.5) / 4.0)
    # a stream that ends after the last arrival counts for its part within the window
    tail = overload_report(
        [record(0.0, 1.0, first=0.5), record(1.0, 3.0, first=2.0)], rate=1.0, duration=2.0, deadline=5.0,
        max_new_tokens=4, capacity_tokens_per_s=4.0, unloaded_ttft=0.1,
    )  # fmt: skip
    assert tail["steady_goodput_tokens_per_s"] == pytest.approx(4 / 1.0)  # the window is 0-1 s: 4 + 0 tokens
    assert report["ttft_s"]["p50"] is not None and report["ttft_vs_unloaded"]["p50"] > 1


def test_the_servers_refusals_by_reason_between_two_readings():
    before = refusals_by_reason(
        'lmiserve_requests_refused_total{model="llm",reason="queue_full"} 2.0\n'
        'lmiserve_requests_refused_total{model="other",reason="queue_full"} 9.0\n',
        "llm",
    )
    after = refusals_by_reason(
        "# HELP lmiserve_requests_refused_total Generation requests refused\n"
        'lmiserve_requests_refused_total{model="llm",reason="queue_full"} 2.0\n'
        'lmiserve_requests_refused_total{model="llm",reason="first_token_wait"} 7.0\n',
        "llm",
    )
    assert before == {"queue_full": 2.0}
    assert refusals_between(before, after) == {"first_token_wait": 7}

"""The benchmark's own HTTP client against a fast mock server on loopback: streamed tokens counted
whatever the chunking, kept-alive connections, error answers, and clients over several processes."""

import asyncio
import json
import threading

import pytest

from lmiserve.bench.apis import APIS
from lmiserve.bench.load import run_level

TOKENS = 7


class MockServer:
    """Streams TOKENS tokens in the protocol the path names, each line cut in two chunks; a prompt
    of "fail" gets a 422 with a Content-Length body, one of "close" an answer ended by closing, and
    the first of "drop" no answer: its connection is closed."""

    def __init__(self):
        self.connections = 0
        self.requests = 0
        self.dropped = False
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

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader, writer):
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ")[1].decode()
                length = int(
                    next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1]
                )
                body = json.loads(await reader.readexactly(length))
                self.requests += 1
                prompt = body.get("inputs") or body.get("prompt")
                if prompt == "drop" and not self.dropped:  # closed unanswered, as at a keep-alive timeout
                    self.dropped = True
                    writer.close()
                    return
                if prompt == "fail":
                    error = b'{"error": "bad request"}'
                    writer.write(b"HTTP/1.1 422 Unprocessable\r\nContent-Length: %d\r\n\r\n%s" % (len(error), error))
                    continue
                lines = self._lines(path)
                if prompt == "close":
                    writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"".join(lines))
                    await writer.drain()
                    writer.close()
                    return
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                for line in lines:
                    for part in (line[:5], line[5:]):
                        writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    @staticmethod
    def _lines(path):
        if path == "/v1/completions":
            chunk = {"choices": [{"text": "a", "index": 0}]}
            return [b"data: " + json.dumps(chunk).encode() + b"\n\n"] * TOKENS + [b"data: [DONE]\n\n"]
        return [json.dumps({"token": {"id": 1, "text": "a", "log_prob": -1.0}}).encode() + b"\n"] * TOKENS

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def mock():
    server = MockServer()
    yield server
    server.stop()


@pytest.mark.parametrize("api", ["lmi", "openai"])
def test_streamed_tokens_are_counted_over_kept_alive_connections(mock, api):
    row = run_level(mock.url, APIS[api], ["p"] * 8, concurrency=2, warmup=2, max_new_tokens=TOKENS, model="m")
    assert row["errors"] == 0 and row["requests"] == 6 and row["output_tokens"] == 6 * TOKENS
    assert row["ttft_s"]["p50"] > 0 and row["itl_s"]["p50"] >= 0
    assert mock.requests == 8 and mock.connections == 2  # one connection per client, kept alive
    assert row["client_procs"] == 1 and len(row["client_cpu_per_proc"]) == 1
    assert row["streamed_tokens"] == 8 * TOKENS  # the warm-up's tokens too


def test_an_error_answer_and_a_closed_connection(mock):
    row = run_level(
        mock.url, APIS["lmi"], ["close", "fail", "p"], concurrency=1, warmup=0, max_new_tokens=TOKENS, model="m"
    )
    assert row["requests"] == 3 and row["errors"] == 1 and row["output_tokens"] == 2 * TOKENS
    assert mock.connections == 2  # the closed one was opened again


def test_a_kept_alive_connection_closed_unanswered_is_opened_again_and_the_request_sent_again(mock):
    row = run_level(mock.url, APIS["lmi"], ["p", "drop"], concurrency=1, warmup=0, max_new_tokens=TOKENS, model="m")
    assert row["errors"] == 0 and row["requests"] == 2 and row["output_tokens"] == 2 * TOKENS
    assert mock.connections == 2 and mock.requests == 3


def test_clients_spread_over_processes(mock):
    row = run_level(
        mock.url, APIS["openai"], ["p"] * 10, concurrency=4, warmup=2, max_new_tokens=TOKENS, model="m", client_procs=2
    )
    assert row["errors"] == 0 and row["requests"] == 8 and row["output_tokens"] == 8 * TOKENS
    assert row["client_procs"] == 2 and len(row["client_cpu_per_proc"]) == 2 and row["streamed_tokens"] == 10 * TOKENS
    assert mock.requests == 10 and mock.connections == 4


def test_the_servers_api_cpu_is_read_from_its_metrics(monkeypatch):
    import httpx

    from lmiserve.bench import command

    text = '# TYPE lmiserve_api_cpu_seconds counter\nlmiserve_api_cpu_seconds_total{model=""} 12.5\nother_total 3.0\n'
    monkeypatch.setattr(httpx, "get", lambda url, timeout: httpx.Response(200, text=text))
    assert command.api_cpu_seconds("http://server") == 12.5
    monkeypatch.setattr(httpx, "get", lambda url, timeout: httpx.Response(200, text="other_total 3.0\n"))
    assert command.api_cpu_seconds("http://server") is None  # another server (vLLM, TGI)
    monkeypatch.setattr(httpx, "get", lambda url, timeout: httpx.Response(404))
    assert command.api_cpu_seconds("http://server") is None


@pytest.mark.parametrize("procs", [1, 2])
def test_each_requests_text_is_kept_by_its_prompts_index(mock, procs):
    outputs = {}
    row = run_level(
        mock.url, APIS["lmi"], ["p", "p", "fail", "p", "p"], concurrency=2, warmup=1, max_new_tokens=TOKENS,
        model="m", client_procs=procs, outputs=outputs,
    )  # fmt: skip
    assert row["errors"] == 1 and sorted(outputs) == [0, 1, 2, 3, 4]
    assert outputs[0] == ("a" * TOKENS, None) and outputs[4] == ("a" * TOKENS, None)
    assert outputs[2][0] == "" and outputs[2][1].startswith("HTTP 422")

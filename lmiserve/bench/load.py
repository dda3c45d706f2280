"""A closed-loop load generator: ``concurrency`` clients, each sending its next request as
soon as the previous one has finished. The first ``warmup`` requests are sent but not
measured, so measured requests meet a server already under steady load.

The clients may be spread over several processes (``client_procs``), each with its own event
loop, so that a fast server is measured rather than the client: each process reports the CPU
it used, and a level whose client processes were busy most of the time is flagged."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import orjson

from .apis import APIS, Api
from .client_processes import in_processes
from .http_stream import Connection, HttpError
from .stats import RequestRecord, level_report

CLIENT_BOUND = 0.8
"""Share of one core above which a client process likely held the measurement back."""


@dataclass
class Share:
    """What one client process sends: its clients and its part of the requests, in order."""

    base_url: str
    api: str
    items: list[tuple[bool, str, str]]
    """(warm-up, prompt, adapter) per request."""
    clients: int
    max_new_tokens: int
    model: str


async def _one(conn: Connection, path: str, body: bytes, api: Api) -> RequestRecord:
    record = RequestRecord(start=time.perf_counter())

    def on_line(line: bytes) -> None:
        record.arrived(api.tokens_in(line) if line else 0)

    try:
        status, error_body = await conn.post(path, body, on_line)
        if status != 200:
            record.error = f"HTTP {status}: {error_body.decode('utf-8', 'replace')}"
    except (HttpError, RuntimeError, ValueError) as exc:  # orjson's error is a ValueError
        conn.close()
        record.error = f"{type(exc).__name__}: {exc}"
    record.end = time.perf_counter()
    return record


async def _send_share(share: Share) -> tuple[list[RequestRecord], int]:
    """The measured requests' records, and the tokens of every request (warm-up too)."""
    api = APIS[share.api]
    queue = list(share.items)
    measured: list[RequestRecord] = []
    streamed = [0]

    async def client() -> None:
        conn = Connection(share.base_url)
        try:
            while queue:
                is_warmup, prompt, adapter = queue.pop(0)
                body = orjson.dumps(api.body(prompt, share.max_new_tokens, share.model, adapter))
                record = await _one(conn, api.path, body, api)
                streamed[0] += record.tokens
                if not is_warmup:
                    measured.append(record)
        finally:
            conn.close()

    await asyncio.gather(*(client() for _ in range(share.clients)))
    return measured, streamed[0]


def _run_share(share: Share) -> tuple[list[RequestRecord], float, float, int]:
    """One client process: its records, the CPU seconds it used, the seconds it ran and the
    tokens it received (warm-up included)."""
    cpu, wall = time.process_time(), time.perf_counter()
    records, streamed = asyncio.run(_send_share(share))
    return records, time.process_time() - cpu, time.perf_counter() - wall, streamed


def run_level(
    base_url: str,
    api: Api,
    prompts: list[str],
    concurrency: int,
    warmup: int,
    max_new_tokens: int,
    model: str,
    adapters: list[str] | None = None,
    client_procs: int = 1,
) -> dict[str, object]:
    """Send one request per prompt with ``concurrency`` clients over ``client_procs`` processes;
    the first ``warmup`` are not measured. With ``adapters``, request ``i`` uses adapter
    ``i mod len(adapters)`` (an even mix)."""
    names = adapters or [""]
    items = [(i < warmup, prompt, names[i % len(names)]) for i, prompt in enumerate(prompts)]
    procs = max(1, min(client_procs, concurrency))
    shares = [
        Share(base_url, api.name, items[k::procs], len(range(k, concurrency, procs)), max_new_tokens, model)
        for k in range(procs)
    ]
    results = in_processes(_run_share, shares)
    row = level_report(concurrency, [r for records, _, _, _ in results for r in records])
    busy = [round(cpu / wall, 3) if wall > 0 else 0.0 for _, cpu, wall, _ in results]
    row["streamed_tokens"] = sum(streamed for *_, streamed in results)
    row["client_procs"] = procs
    row["client_cpu_per_proc"] = busy
    row["client_bound"] = max(busy) > CLIENT_BOUND
    return row

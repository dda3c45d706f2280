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
    items: list[tuple[int, bool, str, str]]
    """(index, warm-up, prompt, adapter) per request."""
    clients: int
    max_new_tokens: int
    model: str
    keep_text: bool = False


async def _one(conn: Connection, path: str, body: bytes, api: Api, keep_text: bool = False) -> RequestRecord:
    record = RequestRecord(start=time.perf_counter())

    def on_line(line: bytes) -> None:
        if line:
            record.took(api.read(line), keep_text)

    try:
        status, error_body = await conn.post(path, body, on_line)
        if status != 200:
            record.error = f"HTTP {status}: {error_body.decode('utf-8', 'replace')}"
    except (HttpError, RuntimeError, ValueError) as exc:  # orjson's error is a ValueError
        conn.close()
        record.error = f"{type(exc).__name__}: {exc}"
    record.end = time.perf_counter()
    return record


Outputs = dict[int, tuple[str, str | None]]
"""Per request's index: its generated text and its error (None when it succeeded)."""


async def _send_share(share: Share) -> tuple[list[RequestRecord], int, Outputs]:
    """The measured requests' records, the tokens of every request (warm-up too), and every
    request's text where kept."""
    api = APIS[share.api]
    queue = list(share.items)
    measured: list[RequestRecord] = []
    streamed = [0]
    outputs: Outputs = {}

    async def client() -> None:
        conn = Connection(share.base_url)
        try:
            while queue:
                index, is_warmup, prompt, adapter = queue.pop(0)
                body = orjson.dumps(api.body(prompt, share.max_new_tokens, share.model, adapter))
                record = await _one(conn, api.path, body, api, share.keep_text)
                streamed[0] += record.output_tokens
                if share.keep_text:
                    outputs[index] = ("".join(record.pieces), record.error)
                if not is_warmup:
                    measured.append(record)
        finally:
            conn.close()

    await asyncio.gather(*(client() for _ in range(share.clients)))
    return measured, streamed[0], outputs


def _run_share(share: Share) -> tuple[list[RequestRecord], float, float, int, Outputs]:
    """One client process: its records, the CPU seconds it used, the seconds it ran, the tokens
    it received (warm-up included) and the texts it kept."""
    cpu, wall = time.process_time(), time.perf_counter()
    records, streamed, outputs = asyncio.run(_send_share(share))
    return records, time.process_time() - cpu, time.perf_counter() - wall, streamed, outputs


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
    outputs: Outputs | None = None,
) -> dict[str, object]:
    """Send one request per prompt with ``concurrency`` clients over ``client_procs`` processes;
    the first ``warmup`` are not measured. With ``adapters``, request ``i`` uses adapter
    ``i mod len(adapters)`` (an even mix). With ``outputs``, every request's text and error go
    into it, by the prompt's index."""
    names = adapters or [""]
    items = [(i, i < warmup, prompt, names[i % len(names)]) for i, prompt in enumerate(prompts)]
    procs = max(1, min(client_procs, concurrency))
    shares = [
        Share(
            base_url,
            api.name,
            items[k::procs],
            len(range(k, concurrency, procs)),
            max_new_tokens,
            model,
            keep_text=outputs is not None,
        )
        for k in range(procs)
    ]
    results = in_processes(_run_share, shares)
    row = level_report(concurrency, [r for records, *_ in results for r in records])
    busy = [round(cpu / wall, 3) if wall > 0 else 0.0 for _, cpu, wall, *_ in results]
    row["streamed_tokens"] = sum(streamed for *_, streamed, _ in results)
    if outputs is not None:
        for *_, kept in results:
            outputs.update(kept)
    row["client_procs"] = procs
    row["client_cpu_per_proc"] = busy
    row["client_bound"] = max(busy) > CLIENT_BOUND
    return row

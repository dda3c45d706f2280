"""A closed-loop load generator: ``concurrency`` clients, each sending its next request as
soon as the previous one has finished. The first ``warmup`` requests are sent but not
measured, so measured requests meet a server already under steady load."""

from __future__ import annotations

import asyncio
import time

import httpx

from .apis import Api
from .stats import RequestRecord, level_report


async def _one(client: httpx.AsyncClient, url: str, body: dict, api: Api) -> RequestRecord:
    record = RequestRecord(start=time.perf_counter())
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                await response.aread()
                record.error = f"HTTP {response.status_code}: {response.text[:200]}"
            else:
                async for line in response.aiter_lines():
                    n = api.tokens_in(line) if line else 0
                    if n:
                        now = time.perf_counter()
                        if record.first_token is None:
                            record.first_token = now
                        record.token_times.append(now)
                        record.tokens += n
    except (httpx.HTTPError, RuntimeError, ValueError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    record.end = time.perf_counter()
    return record


async def run_level(
    base_url: str,
    api: Api,
    prompts: list[str],
    concurrency: int,
    warmup: int,
    max_new_tokens: int,
    model: str,
    adapters: list[str] | None = None,
) -> dict[str, object]:
    """Send one request per prompt with ``concurrency`` clients; the first ``warmup`` are not
    measured. With ``adapters``, request ``i`` uses adapter ``i mod len(adapters)`` (an even mix)."""
    url = base_url.rstrip("/") + api.path
    names = adapters or [""]
    queue = [(i < warmup, prompt, names[i % len(names)]) for i, prompt in enumerate(prompts)]
    measured: list[RequestRecord] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:

        async def worker() -> None:
            while queue:
                is_warmup, prompt, adapter = queue.pop(0)
                record = await _one(client, url, api.body(prompt, max_new_tokens, model, adapter), api)
                if not is_warmup:
                    measured.append(record)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return level_report(concurrency, measured)

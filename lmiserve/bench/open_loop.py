"""An open-loop load generator: requests arrive as a Poisson process at a given rate, whatever
the server answers and however long it takes, each with a deadline (``X-Request-Timeout``).

A closed loop (:mod:`.load`) never offers more than the server takes; an open loop shows what
happens beyond capacity: which requests are refused, how fast, and whether the admitted ones
still meet their deadlines. Arrivals may be spread over several client processes, each a Poisson
process of its share of the rate (together, one of the whole rate)."""

from __future__ import annotations

import asyncio
import random
import re
import time
from dataclasses import dataclass

import orjson

from .apis import APIS, Api
from .client_processes import in_processes
from .http_stream import Connection, HttpError
from .stats import RequestRecord, percentile

SHED = b"without being scheduled"
"""In the 503 of a request admitted, then shed from the queue at its deadline."""


@dataclass
class OpenRecord(RequestRecord):
    status: int = 0
    body: bytes = b""
    """The start of a non-200 answer."""

    @property
    def refused(self) -> bool:
        """Refused on arrival (503), as opposed to admitted and shed from the queue later."""
        return self.status == 503 and SHED not in self.body


@dataclass
class Offer:
    """What one client process sends."""

    base_url: str
    api: str
    prompt: str
    max_new_tokens: int
    model: str
    rate: float
    """Requests per second this process offers."""
    duration: float
    deadline: float
    """Seconds, sent as ``X-Request-Timeout``."""
    seed: int


async def _one(conn: Connection, api: Api, body: bytes, headers: dict[str, str]) -> OpenRecord:
    record = OpenRecord(start=time.perf_counter())

    def on_line(line: bytes) -> None:
        record.arrived(api.tokens_in(line) if line else 0)

    try:
        record.status, record.body = await conn.post(api.path, body, on_line, headers)
    except (HttpError, RuntimeError, ValueError) as exc:  # orjson's error is a ValueError
        conn.close()
        record.error = f"{type(exc).__name__}: {exc}"
    record.end = time.perf_counter()
    if record.status != 200 and record.error is None:
        record.error = f"HTTP {record.status}"
    return record


async def _offer(offer: Offer) -> list[OpenRecord]:
    api = APIS[offer.api]
    rng = random.Random(offer.seed)
    headers = {"X-Request-Timeout": f"{offer.deadline:g}"}
    idle: list[Connection] = []
    records: list[OpenRecord] = []

    async def send(i: int) -> None:
        conn = idle.pop() if idle else Connection(offer.base_url)
        # a different first word for every request: none finds another's prompt in the prefix cache
        prompt = f"{offer.seed}-{i}: {offer.prompt}"
        body = orjson.dumps(api.body(prompt, offer.max_new_tokens, offer.model))
        records.append(await _one(conn, api, body, headers))
        if conn.open:
            idle.append(conn)

    tasks = []
    start = time.perf_counter()
    at = 0.0
    i = 0
    while True:
        at += rng.expovariate(offer.rate)
        if at >= offer.duration:
            break
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(send(i)))
        i += 1
    await asyncio.gather(*tasks)
    for conn in idle:
        conn.close()
    return records


def _run_offer(offer: Offer) -> tuple[list[OpenRecord], float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    records = asyncio.run(_offer(offer))
    return records, time.process_time() - cpu, time.perf_counter() - wall


def offer_load(
    base_url: str,
    api: Api,
    prompt: str,
    max_new_tokens: int,
    model: str,
    rate: float,
    duration: float,
    deadline: float,
    client_procs: int = 1,
    seed: int = 0,
) -> tuple[list[OpenRecord], list[float]]:
    """Poisson arrivals at ``rate`` per second for ``duration`` seconds, over ``client_procs``
    processes; every request's record, and how busy each client process was (CPU / wall)."""
    procs = max(1, client_procs)
    offers = [
        Offer(base_url, api.name, prompt, max_new_tokens, model, rate / procs, duration, deadline, seed * 1000 + k)
        for k in range(procs)
    ]
    results = in_processes(_run_offer, offers)
    records = [r for rs, _, _ in results for r in rs]
    return records, [round(cpu / wall, 3) if wall > 0 else 0.0 for _, cpu, wall in results]


REFUSED = re.compile(r'^lmiserve_requests_refused_total\{model="([^"]*)",reason="(\w+)"\} (\S+)$', re.M)


def refusals_by_reason(metrics_text: str, model: str) -> dict[str, float]:
    """The server's count of ``model``'s refusals by reason, from its ``/metrics`` text."""
    return {reason: float(value) for name, reason, value in REFUSED.findall(metrics_text) if name == model}


def refusals_between(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """The refusals, by reason, counted between two readings (reasons with none left out)."""
    return {
        reason: int(n - before.get(reason, 0.0)) for reason, n in sorted(after.items()) if n > before.get(reason, 0.0)
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


def _steady_goodput(on_time: list[OpenRecord], records: list[OpenRecord]) -> float:
    """Tokens per second of the on-time requests within the arrivals' window, each request's
    spread evenly from its first token to its end."""
    if not records:
        return 0.0
    lo, hi = min(r.start for r in records), max(r.start for r in records)
    if hi <= lo:
        return 0.0
    tokens = 0.0
    for r in on_time:
        first = r.first_token if r.first_token is not None else r.start
        span = r.end - first
        inside = max(0.0, min(r.end, hi) - max(first, lo))
        tokens += r.tokens * (inside / span if span > 0 else float(lo <= r.end <= hi))
    return tokens / (hi - lo)


def overload_report(
    records: list[OpenRecord],
    rate: float,
    duration: float,
    deadline: float,
    max_new_tokens: int,
    capacity_tokens_per_s: float,
    unloaded_ttft: float | None,
) -> dict[str, object]:
    """What an open-loop level did: refusals and their latency, the admitted requests' first
    tokens and deadlines, and goodput: tokens of requests completed within their deadline, as a
    share of the closed-loop capacity, per second of the level (its first arrival to its last
    answer, the queue's drain included) and per second of the overload itself (first to last
    arrival; each request's tokens counted for the part of its stream, first token to end, that
    falls within it): the steady rate of useful work while the load lasted."""
    refused = [r for r in records if r.refused]
    admitted = [r for r in records if not r.refused]
    on_time = [r for r in admitted if r.status == 200 and r.tokens >= max_new_tokens and r.end - r.start <= deadline]
    ttfts = [r.ttft for r in admitted if r.ttft is not None]
    refusal_s = [r.end - r.start for r in refused]
    window = (max(r.end for r in records) - min(r.start for r in records)) if records else 0.0
    goodput = sum(r.tokens for r in on_time) / window if window > 0 else 0.0
    steady = _steady_goodput(on_time, records)
    p50, p99 = percentile(ttfts, 50), percentile(ttfts, 99)
    return {
        "rate": rate,
        "offered": len(records),
        "offered_per_s": len(records) / duration if duration else 0.0,
        "admitted": len(admitted),
        "refused": len(refused),
        "refusal_ms": {
            "p50": _ms(percentile(refusal_s, 50)),
            "p99": _ms(percentile(refusal_s, 99)),
            "max": _ms(max(refusal_s, default=None)),
        },
        "completed_in_deadline": len(on_time),
        "deadline_misses": len(admitted) - len(on_time),
        "goodput_tokens_per_s": goodput,
        "goodput_ratio": goodput / capacity_tokens_per_s if capacity_tokens_per_s else None,
        "steady_goodput_tokens_per_s": steady,
        "steady_goodput_ratio": steady / capacity_tokens_per_s if capacity_tokens_per_s else None,
        "ttft_s": {"p50": p50, "p99": p99},
        "ttft_vs_unloaded": {
            "p50": p50 / unloaded_ttft if p50 is not None and unloaded_ttft else None,
            "p99": p99 / unloaded_ttft if p99 is not None and unloaded_ttft else None,
        },
        "errors": sorted({r.error for r in admitted if r.error})[:5],
    }

"""Soak test of a running lmiserve server on 127.0.0.1.

Sends a bounded mix of requests (LMI, TGI, OpenAI completions and chat, KServe generate,
Databricks; streaming and not; greedy and seeded sampling; clients that disconnect
mid-stream) from several threads until --duration seconds or --requests requests, then checks
that every request ended with a complete answer or a clear error (none hung past
--request-timeout), that every KV-cache block is free again, and that the resident memory of
the server and its children grew less than --rss-growth-mb. Prints one JSON report; exits 1
when a check fails.

    python scripts/soak.py --url http://127.0.0.1:8080 --duration 120 --requests 100000
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak_watch import RssSampler, rss_bytes, server_pid, wait_idle  # noqa: E402

PROMPTS = [
    "What is Deep Learning?",
    "Write a short poem about the sea.",
    "List three prime numbers.",
    "Explain what a hash table is.",
    "Translate 'good morning' into French.",
]


# --- the request mix ------------------------------------------------------------------


def _sampling(rng: random.Random) -> dict:
    """Greedy, or seeded sampling (reproducible whatever the batch)."""
    if rng.random() < 0.5:
        return {}
    return {"do_sample": True, "temperature": 0.8, "top_p": 0.95, "seed": rng.randrange(2**31)}


def build(kind: str, model: str, rng: random.Random, max_tokens: int) -> tuple[str, dict, str]:
    """(path, body, framing) of one request; framing is json, jsonlines or sse."""
    prompt = rng.choice(PROMPTS)
    s = _sampling(rng)
    oa = {k: v for k, v in s.items() if k in ("temperature", "top_p", "seed")}
    if kind.startswith("lmi"):
        stream = kind == "lmi-stream"
        body = {"inputs": prompt, "parameters": {"max_new_tokens": max_tokens, **s}, "stream": stream}
        return "/invocations", body, "jsonlines" if stream else "json"
    if kind == "tgi":
        return "/generate", {"inputs": prompt, "parameters": {"max_new_tokens": max_tokens, **s}}, "json"
    if kind == "tgi-stream":
        return "/generate_stream", {"inputs": prompt, "parameters": {"max_new_tokens": max_tokens, **s}}, "sse"
    if kind.startswith("completions"):
        stream = kind.endswith("stream")
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream, **oa}
        return "/v1/completions", body, "sse" if stream else "json"
    if kind.startswith("chat"):
        stream = kind.endswith("stream")
        messages = [{"role": "user", "content": prompt}]
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": stream, **oa}
        return "/v1/chat/completions", body, "sse" if stream else "json"
    if kind.startswith("kserve"):
        stream = kind.endswith("stream")
        body = {"text_input": prompt, "parameters": {"max_tokens": max_tokens, **s}}
        return f"/v2/models/{model}/generate" + ("_stream" if stream else ""), body, "sse" if stream else "json"
    if kind == "databricks":
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
        if "temperature" in oa:
            body["temperature"] = oa["temperature"]
        return f"/serving-endpoints/{model}/invocations", body, "json"
    raise ValueError(kind)


KINDS = [
    "lmi",
    "lmi-stream",
    "tgi",
    "tgi-stream",
    "completions",
    "completions-stream",
    "chat",
    "chat-stream",
    "kserve",
    "kserve-stream",
    "databricks",
]
DISCONNECT_KINDS = ["lmi-stream", "tgi-stream", "completions-stream", "chat-stream", "kserve-stream"]


def _events(lines: list[str], framing: str) -> list:
    out = []
    for line in lines:
        if framing == "sse":
            if not line.startswith("data:"):
                continue
            line = line[len("data:") :].strip()
            if line == "[DONE]":
                out.append(line)
                continue
        out.append(json.loads(line))
    return out


def _is_error(event) -> bool:
    if not isinstance(event, dict):
        return False
    details = event.get("details") or {}
    return "error" in event or (isinstance(details, dict) and details.get("finish_reason") == "error")


def _stream_outcome(kind: str, events: list) -> str:
    """complete, error (the protocol's in-stream error event) or unclear (ended without either)."""
    if any(_is_error(e) for e in events):
        return "error"
    if kind == "kserve-stream":  # no final marker (and no event for empty text): a clean end is the end
        return "complete"
    if not events:
        return "unclear"
    last = events[-1]
    if kind.startswith(("completions", "chat")):
        return "complete" if last == "[DONE]" else "unclear"
    if kind == "lmi-stream":
        return "complete" if isinstance(last, dict) and "generated_text" in last else "unclear"
    if kind == "tgi-stream":
        return "complete" if isinstance(last, dict) and last.get("generated_text") is not None else "unclear"
    return "unclear"


def _body_outcome(kind: str, r: httpx.Response) -> str:
    try:
        data = r.json()
    except ValueError:
        return "unclear"
    if r.status_code >= 400:
        return "error" if data else "unclear"
    if r.status_code != 200:
        return "unclear"
    fields = {"lmi": "generated_text", "kserve": "text_output", "completions": "choices", "chat": "choices"}
    field = fields.get(kind, "choices" if kind == "databricks" else "generated_text")
    item = data[0] if isinstance(data, list) and data else data
    return "complete" if isinstance(item, dict) and field in item else "unclear"


def one(client: httpx.Client, kind: str, disconnect: bool, model: str, rng: random.Random, max_tokens: int) -> dict:
    path, body, framing = build(kind, model, rng, max_tokens)
    started = time.monotonic()
    result = {"kind": kind + ("-disconnect" if disconnect else ""), "status": None}
    try:
        if framing == "json":
            r = client.post(path, json=body)
            result["status"] = r.status_code
            result["outcome"] = _body_outcome(kind, r)
        else:
            with client.stream("POST", path, json=body) as r:
                result["status"] = r.status_code
                if r.status_code != 200:
                    r.read()
                    result["outcome"] = _body_outcome(kind, r)
                else:
                    lines = []
                    for line in r.iter_lines():
                        if line:
                            lines.append(line)
                        if disconnect and len(lines) >= 2:
                            break
                    if disconnect:
                        result["outcome"] = "disconnected"
                    else:
                        result["outcome"] = _stream_outcome(kind, _events(lines, framing))
    except httpx.TimeoutException:
        result["outcome"] = "hang"
    except (httpx.HTTPError, ValueError) as exc:
        result["outcome"] = "unclear"
        result["detail"] = f"{type(exc).__name__}: {exc}"[:200]
    result["seconds"] = time.monotonic() - started
    return result


# --- the run ----------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def soak(args: argparse.Namespace) -> dict:
    url = urlparse(args.url)
    if url.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("soak.py only talks to a server on 127.0.0.1")
    client = httpx.Client(base_url=args.url, timeout=args.request_timeout, limits=httpx.Limits(max_connections=256))
    model = args.model or client.get("/v1/models").json()["data"][0]["id"]
    pid = args.pid or server_pid(url.port or 80)
    baseline = rss_bytes(pid) if pid else 0
    sampler = RssSampler(pid)
    sampler.start()
    rng = random.Random(args.seed)
    plans = []
    served = {False: 0, True: 0}  # the kinds take turns, so even a short run covers every protocol
    for _ in range(args.requests):
        disconnect = rng.random() < args.disconnect_ratio
        kinds = DISCONNECT_KINDS if disconnect else KINDS
        kind = kinds[served[disconnect] % len(kinds)]
        served[disconnect] += 1
        plans.append((kind, disconnect, random.Random(rng.random())))
    results: list[dict] = []
    ends = time.monotonic() + args.duration
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        pending: set[concurrent.futures.Future] = set()
        plan = iter(plans)
        while True:
            while len(pending) < args.concurrency and time.monotonic() < ends:
                nxt = next(plan, None)
                if nxt is None:
                    break
                pending.add(pool.submit(one, client, nxt[0], nxt[1], model, nxt[2], args.max_tokens))
            if not pending:
                break
            done, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
            results += [f.result() for f in done]
    elapsed = time.monotonic() - started
    state = wait_idle(client, args.idle_timeout)
    time.sleep(1.0)
    final = rss_bytes(pid) if pid else 0
    sampler.stop.set()
    sampler.join()
    outcomes = Counter(r["outcome"] for r in results)
    latencies = [r["seconds"] for r in results if r["outcome"] == "complete"]
    client_errors = [r for r in results if r["status"] and 400 <= r["status"] < 500]
    growth_mb = (final - baseline) / 2**20 if pid else None
    failures = []
    if outcomes["hang"]:
        failures.append(f"{outcomes['hang']} requests got no answer within {args.request_timeout} s")
    if outcomes["unclear"]:
        failures.append(f"{outcomes['unclear']} requests ended without a complete answer or a clear error")
    if client_errors:
        failures.append(f"{len(client_errors)} valid requests were refused with 4xx")
    if not outcomes["complete"]:
        failures.append("no request completed")
    if any(state.values()):
        failures.append(f"the engine is not idle after the load: {state}")
    if growth_mb is not None and growth_mb > args.rss_growth_mb:
        failures.append(f"RSS grew {growth_mb:.0f} MiB, more than {args.rss_growth_mb} MiB")
    return {
        "url": args.url,
        "model": model,
        "seconds": round(elapsed, 1),
        "requests": len(results),
        "outcomes": dict(outcomes),
        "by_kind": {
            k: dict(Counter(r["outcome"] for r in results if r["kind"] == k))
            for k in sorted({r["kind"] for r in results})
        },
        "errors": outcomes["error"],
        "error_statuses": dict(Counter(r["status"] for r in results if r["outcome"] == "error")),
        "latency_p50_s": percentile(latencies, 50),
        "latency_p99_s": percentile(latencies, 99),
        "server_pid": pid,
        "rss_baseline_mib": round(baseline / 2**20, 1) if pid else None,
        "rss_peak_mib": round(sampler.peak / 2**20, 1) if pid else None,
        "rss_final_mib": round(final / 2**20, 1) if pid else None,
        "rss_growth_mib": None if growth_mb is None else round(growth_mb, 1),
        "rss_growth_bound_mib": args.rss_growth_mb,
        "after_load": state,
        "examples": [r for r in results if r["outcome"] in ("hang", "unclear")][:5] + client_errors[:5],
        "failures": failures,
        "ok": not failures,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--model", help="model name (default: the first of /v1/models)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds to send requests for")
    p.add_argument("--requests", type=int, default=1000, help="most requests to send")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--disconnect-ratio", type=float, default=0.1)
    p.add_argument("--request-timeout", type=float, default=120.0, help="seconds after which a request counts as hung")
    p.add_argument("--idle-timeout", type=float, default=30.0, help="seconds the engine gets to go idle after the load")
    p.add_argument("--rss-growth-mb", type=float, default=512.0, help="allowed RSS growth of the server and children")
    p.add_argument("--pid", type=int, help="the server's pid (default: the process listening on the port)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the JSON report here")
    args = p.parse_args(argv)
    report = soak(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    sys.exit(main())

"""Fault drills against a running lmiserve server on 127.0.0.1, with the figures as JSON.

``kill``: streams --streams requests, SIGKILLs the model's engine process mid-batch and reports
how each stream ended (complete, handed to the restarted engine; or its in-stream error with
``option.max_replays=0``), the longest pause a stream saw, how long /ping answered 503, and
whether a new request then succeeds.

``drain``: streams --streams requests, sends SIGTERM to the server (--pid) and reports whether
each in-flight request finished, what a new request got meanwhile, and how long the server took
to exit.

    python scripts/fault_drill.py kill --url http://127.0.0.1:8080
    python scripts/fault_drill.py drain --url http://127.0.0.1:8080 --pid 1234
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import sys
import time
from urllib.parse import urlparse

import httpx


def _stream(url: str, max_tokens: int, first: concurrent.futures.Future) -> dict:
    """One LMI jsonlines stream: whether it completed or ended with the in-stream error, and when."""
    params = {"max_new_tokens": max_tokens, "ignore_eos_token": True}
    body = {"inputs": "Tell me a long story.", "parameters": params, "stream": True}
    last = None
    previous, pause, lines = None, 0.0, 0
    with httpx.Client(base_url=url, timeout=120) as c, c.stream("POST", "/invocations", json=body) as r:
        for line in r.iter_lines():
            if line:
                now = time.monotonic()
                pause = max(pause, now - previous) if previous is not None else 0.0
                previous, lines = now, lines + 1
                last = json.loads(line)
                if not first.done():
                    first.set_result(None)
    ended = time.monotonic()
    details = (last or {}).get("details") or {}
    outcome = "error" if details.get("finish_reason") == "error" else "complete" if last else "empty"
    return {"outcome": outcome, "ended": ended, "status": r.status_code, "pause": pause, "lines": lines}


def _ping(url: str) -> int:
    try:
        return httpx.get(url + "/ping", timeout=2).status_code
    except httpx.HTTPError:
        return 0


def _start_streams(pool, url: str, n: int, max_tokens: int) -> list[concurrent.futures.Future]:
    firsts = [concurrent.futures.Future() for _ in range(n)]
    streams = [pool.submit(_stream, url, max_tokens, f) for f in firsts]
    concurrent.futures.wait(firsts, timeout=120)
    return streams


def kill(args: argparse.Namespace) -> dict:
    info = httpx.get(args.url + "/models", timeout=10).json()["models"][0]
    name = info["modelName"]
    old = httpx.get(f"{args.url}/models/{name}", timeout=10).json()[0]["enginePid"]
    with concurrent.futures.ThreadPoolExecutor(args.streams) as pool:
        streams = _start_streams(pool, args.url, args.streams, args.max_tokens)
        killed = time.monotonic()
        os.kill(old, signal.SIGKILL)
        unhealthy = None
        while time.monotonic() - killed < args.timeout:
            code = _ping(args.url)
            if code == 503 and unhealthy is None:
                unhealthy = time.monotonic() - killed
            if code == 200 and unhealthy is not None:
                break
            time.sleep(0.05)
        healthy = time.monotonic() - killed
        results = [s.result(timeout=args.timeout) for s in streams]
    new = httpx.get(f"{args.url}/models/{name}", timeout=10).json()[0]["enginePid"]
    after = httpx.post(
        args.url + "/invocations", json={"inputs": "Hi", "parameters": {"max_new_tokens": 4}}, timeout=60
    )
    ended_s = [r["ended"] - killed for r in results]
    report = {
        "drill": "kill",
        "streams": args.streams,
        "stream_outcomes": [r["outcome"] for r in results],
        "stream_lines": [r["lines"] for r in results],
        "max_seconds_to_end": round(max(ended_s), 3),
        "longest_pause_s": round(max(r["pause"] for r in results), 3),
        "seconds_to_ping_503": None if unhealthy is None else round(unhealthy, 3),
        "seconds_to_ping_200": round(healthy, 2),
        "engine_pid": [old, new],
        "request_after_recovery": after.status_code,
    }
    # each stream ends complete (handed to the restarted engine) or, with option.max_replays=0,
    # with its in-stream error
    report["ok"] = (
        all(o in ("complete", "error") for o in report["stream_outcomes"])
        and unhealthy is not None
        and new != old
        and after.status_code == 200
    )
    return report


def drain(args: argparse.Namespace) -> dict:
    if not args.pid:
        raise SystemExit("drain needs the server's --pid")
    with concurrent.futures.ThreadPoolExecutor(args.streams) as pool:
        streams = _start_streams(pool, args.url, args.streams, args.max_tokens)
        sent = time.monotonic()
        os.kill(args.pid, signal.SIGTERM)
        time.sleep(0.2)
        try:
            refused = httpx.post(args.url + "/invocations", json={"inputs": "Hi"}, timeout=10).status_code
        except httpx.HTTPError:
            refused = 0
        results = [s.result(timeout=args.timeout) for s in streams]
        while os.path.exists(f"/proc/{args.pid}") and time.monotonic() - sent < args.timeout:
            state = open(f"/proc/{args.pid}/stat").read().split()[2] if os.path.exists(f"/proc/{args.pid}") else "X"
            if state == "Z":
                break
            time.sleep(0.05)
        exited = time.monotonic() - sent
    report = {
        "drill": "drain",
        "streams": args.streams,
        "stream_outcomes": [r["outcome"] for r in results],
        "new_request_during_drain": refused,
        "seconds_to_exit": round(exited, 2),
        "last_stream_done_s": round(max(r["ended"] for r in results) - sent, 2),
    }
    report["ok"] = all(o == "complete" for o in report["stream_outcomes"]) and refused in (503, 0)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("drill", choices=["kill", "drain"])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--pid", type=int, help="the server's pid (drain)")
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args(argv)
    if urlparse(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("fault_drill.py only talks to a server on 127.0.0.1")
    report = kill(args) if args.drill == "kill" else drain(args)
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Chaos soak of a running lmiserve server on 127.0.0.1: requests of several protocols while the
model's engine process is SIGKILLed at random, with the figures as one JSON report.

First every distinct request of the mix (LMI jsonlines stream, OpenAI completions stream, TGI
and TGI stream, KServe V2 over gRPC; each prompt greedy or seeded) runs once with no fault: the
clean answers. Then, for --duration seconds, --concurrency threads send requests drawn from the
same mix while a killer SIGKILLs the engine every --kill-min to --kill-max seconds (and times
how long /ping takes to say 200 again). Checks: every request ended with a complete answer or a
well-formed error in its protocol's shape (none hung, none cut short, no 5xx that is not the
protocol's error body); every complete answer equals the clean one (with --batch-variant, every
answer of a request in flight at a kill; the others are counted); at least --min-success of
the requests completed; the API process's own resident memory is flat (its growth over the run,
after the clean phase, under --rss-growth-mb). Exits 1 when a check fails.

    python scripts/chaos_soak.py --url http://127.0.0.1:8080 --grpc 127.0.0.1:8081 --duration 300
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import re
import signal
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import PROMPTS, _body_outcome, _events, _stream_outcome  # noqa: E402

KINDS = ["lmi-stream", "completions-stream", "tgi", "tgi-stream", "kserve-grpc"]
SEEDS = [None, None, 1, 2]
"""Greedy twice as often as each seed: both give the same answer on every run."""


def process_rss(pid: int) -> int:
    """Resident memory of ``pid`` alone (not its children)."""
    try:
        match = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    except OSError:
        return 0
    return int(match.group(1)) * 1024 if match else 0


# --- the requests -------------------------------------------------------------------------


def http_request(kind: str, model: str, prompt: str, seed: int | None, tokens: int) -> tuple[str, dict, str]:
    """(path, body, framing) of one HTTP request of the mix."""
    lmi = {"max_new_tokens": tokens}
    if seed is not None:
        lmi |= {"do_sample": True, "temperature": 0.8, "top_p": 0.95, "seed": seed}
    if kind == "lmi-stream":
        return "/invocations", {"inputs": prompt, "parameters": lmi, "stream": True}, "jsonlines"
    if kind == "tgi":
        return "/generate", {"inputs": prompt, "parameters": lmi}, "json"
    if kind == "tgi-stream":
        return "/generate_stream", {"inputs": prompt, "parameters": lmi}, "sse"
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "stream": True, "temperature": 0.0}
    if seed is not None:
        body |= {"temperature": 0.8, "top_p": 0.95, "seed": seed}
    return "/v1/completions", body, "sse"


def stream_text(kind: str, events: list) -> str:
    if kind == "completions-stream":
        return "".join(e["choices"][0]["text"] for e in events if isinstance(e, dict) and e.get("choices"))
    return events[-1]["generated_text"]


def send_http(client: httpx.Client, kind: str, model: str, prompt: str, seed: int | None, tokens: int) -> dict:
    path, body, framing = http_request(kind, model, prompt, seed, tokens)
    result: dict = {"status": None}
    if framing == "json":
        r = client.post(path, json=body)
        result["status"] = r.status_code
        result["outcome"] = _body_outcome(kind, r)
        if r.status_code != 200:
            result["detail"] = r.text[:200]
        if result["outcome"] == "complete":
            result["text"] = r.json()["generated_text"]
        return result
    with client.stream("POST", path, json=body) as r:
        result["status"] = r.status_code
        if r.status_code != 200:
            r.read()
            result["outcome"] = _body_outcome(kind.removesuffix("-stream"), r)
            result["detail"] = r.text[:200]
            return result
        events = _events([line for line in r.iter_lines() if line], framing)
    result["outcome"] = _stream_outcome(kind.removesuffix("-stream") + "-stream", events)
    if result["outcome"] == "complete":
        result["text"] = stream_text(kind, events)
    return result


def send_grpc(address: str, model: str, prompt: str, seed: int | None, tokens: int, timeout: float) -> dict:
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    tensor = grpcclient.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([prompt], dtype=np.object_))
    params: dict = {"max_tokens": tokens, "do_sample": seed is not None}
    if seed is not None:
        params |= {"temperature": 0.8, "top_p": 0.95, "seed": seed}
    client = grpcclient.InferenceServerClient(address)
    try:
        answer = client.infer(model, [tensor], parameters=params, client_timeout=timeout)
    except InferenceServerException as exc:
        hung = "DEADLINE_EXCEEDED" in str(exc.status())
        return {"status": str(exc.status()), "outcome": "hang" if hung else "error", "detail": str(exc)[:200]}
    finally:
        client.close()
    text = answer.as_numpy("text_output").reshape(-1)[0]
    return {"status": "OK", "outcome": "complete", "text": text.decode() if isinstance(text, bytes) else text}


def one(args: argparse.Namespace, client: httpx.Client, model: str, plan: tuple[str, str, int | None]) -> dict:
    kind, prompt, seed = plan
    started = time.monotonic()
    try:
        if kind == "kserve-grpc":
            result = send_grpc(args.grpc, model, prompt, seed, args.max_tokens, args.request_timeout)
        else:
            result = send_http(client, kind, model, prompt, seed, args.max_tokens)
    except httpx.TimeoutException:
        result = {"status": None, "outcome": "hang"}
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        result = {"status": None, "outcome": "unclear", "detail": f"{type(exc).__name__}: {exc}"[:200]}
    result |= {"plan": plan, "started": started, "seconds": time.monotonic() - started}
    return result


# --- the killer ---------------------------------------------------------------------------


class Killer(threading.Thread):
    """SIGKILLs the model's engine every ``low`` to ``high`` seconds until ``stop``; times each
    return of /ping to 200."""

    def __init__(self, client: httpx.Client, model: str, low: float, high: float, seed: int):
        super().__init__(daemon=True)
        self.client, self.model, self.low, self.high = client, model, low, high
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.kills: list[float] = []
        self.ready_s: list[float] = []

    def run(self) -> None:
        while not self.stop.wait(self.rng.uniform(self.low, self.high)):
            try:
                pid = self.client.get(f"/models/{self.model}").json()[0]["enginePid"]
                os.kill(pid, signal.SIGKILL)
            except (httpx.HTTPError, ProcessLookupError, KeyError, IndexError, TypeError):
                continue
            killed = time.monotonic()
            self.kills.append(killed)
            while self.client.get("/ping").status_code == 200 and time.monotonic() - killed < 5:
                time.sleep(0.005)  # the server has not seen the death yet
            while self.client.get("/ping").status_code != 200 and time.monotonic() - killed < 120:
                time.sleep(0.02)
            self.ready_s.append(round(time.monotonic() - killed, 3))


# --- the run ------------------------------------------------------------------------------


def run_all(args, client, model, plans, pool) -> list[dict]:
    return list(pool.map(lambda p: one(args, client, model, p), plans))


def chaos(args: argparse.Namespace) -> dict:
    if urlparse(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("chaos_soak.py only talks to a server on 127.0.0.1")
    limits = httpx.Limits(max_connections=256)
    client = httpx.Client(base_url=args.url, timeout=args.request_timeout, limits=limits)
    model = args.model or client.get("/v1/models").json()["data"][0]["id"]
    kinds = [k for k in args.kinds.split(",") if k != "kserve-grpc" or args.grpc]
    distinct = [(k, p, s) for k in kinds for p in PROMPTS for s in sorted(set(SEEDS), key=str)]
    rng = random.Random(args.seed)
    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        clean = {r["plan"]: r for r in run_all(args, client, model, distinct, pool)}
        broken = [r for r in clean.values() if r["outcome"] != "complete"]
        if broken:
            return {"ok": False, "failures": [f"the clean run did not complete: {broken[:3]}"]}
        rss: list[tuple[float, int]] = [(0.0, process_rss(args.pid))] if args.pid else []
        killer = Killer(client, model, args.kill_min, args.kill_max, args.seed)
        killer.start()
        results: list[dict] = []
        started = time.monotonic()
        pending: set[concurrent.futures.Future] = set()
        while time.monotonic() - started < args.duration or pending:
            while len(pending) < args.concurrency and time.monotonic() - started < args.duration:
                pending.add(pool.submit(one, args, client, model, rng.choice(distinct)))
            done, pending = concurrent.futures.wait(pending, timeout=1, return_when=concurrent.futures.FIRST_COMPLETED)
            results += [f.result() for f in done]
            if args.pid and time.monotonic() - started - rss[-1][0] >= 5:
                rss.append((time.monotonic() - started, process_rss(args.pid)))
        killer.stop.set()
        killer.join()
    return report(args, clean, results, killer, rss, time.monotonic() - started)


def report(args, clean, results, killer, rss, elapsed) -> dict:
    for r in results:
        if r["outcome"] == "complete" and r["text"] != clean[r["plan"]]["text"]:
            r["outcome"] = "mismatch"
        r["replayed"] = any(r["started"] < k < r["started"] + r["seconds"] for k in killer.kills)
    outcomes = Counter(r["outcome"] for r in results)
    n = len(results)
    success = outcomes["complete"] / n if n else 0.0
    replayed = [r for r in results if r["replayed"]]
    growth = (rss[-1][1] - rss[0][1]) / 2**20 if len(rss) > 1 else None
    failures = []
    for bad, what in (
        ("hang", "got no answer in time"),
        ("unclear", "ended without a complete answer or a clear error"),
    ):
        if outcomes[bad]:
            failures.append(f"{outcomes[bad]} requests {what}")
    replayed_off = sum(r["outcome"] == "mismatch" for r in replayed)
    others_off = outcomes["mismatch"] - replayed_off
    if replayed_off:
        failures.append(f"{replayed_off} answers of requests in flight at a kill differ from the clean run's")
    if others_off and not args.batch_variant:
        failures.append(f"{others_off} answers of requests no kill touched differ from the clean run's")
    if success < args.min_success:
        failures.append(f"{success:.1%} of the requests completed, fewer than {args.min_success:.0%}")
    if not killer.kills:
        failures.append("the engine was never killed")
    if growth is not None and growth > args.rss_growth_mb:
        failures.append(f"the API process grew {growth:.0f} MiB, more than {args.rss_growth_mb} MiB")
    return {
        "seconds": round(elapsed, 1),
        "concurrency": args.concurrency,
        "requests": n,
        "outcomes": dict(outcomes),
        "success_ratio": round(success, 4),
        "by_kind": {
            k: dict(Counter(r["outcome"] for r in results if r["plan"][0] == k)) for k in args.kinds.split(",")
        },
        "error_statuses": dict(Counter(str(r["status"]) for r in results if r["outcome"] == "error")),
        "in_flight_at_a_kill": len(replayed),
        "in_flight_at_a_kill_complete": sum(r["outcome"] == "complete" for r in replayed),
        "in_flight_at_a_kill_mismatch": replayed_off,
        "untouched_mismatch": others_off,
        "kills": len(killer.kills),
        "ready_after_kill_s": killer.ready_s,
        "ready_after_kill_p50_s": statistics.median(killer.ready_s) if killer.ready_s else None,
        "api_rss_mib": [round(v / 2**20, 1) for _, v in rss],
        "api_rss_growth_mib": None if growth is None else round(growth, 1),
        "examples": [{k: v for k, v in r.items() if k != "text"} for r in results if r["outcome"] not in ("complete",)][
            :8
        ],
        "error_details": dict(
            Counter(r.get("detail", "")[:120] for r in results if r["outcome"] == "error").most_common(5)
        ),
        "failures": failures,
        "ok": not failures,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--grpc", help="the KServe gRPC address (host:port); without it, no gRPC requests")
    p.add_argument("--model", help="model name (default: the first of /v1/models)")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--duration", type=float, default=300.0, help="seconds of chaos")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--kill-min", type=float, default=20.0)
    p.add_argument("--kill-max", type=float, default=40.0)
    p.add_argument("--request-timeout", type=float, default=120.0, help="seconds after which a request counts as hung")
    p.add_argument("--min-success", type=float, default=0.97)
    p.add_argument("--rss-growth-mb", type=float, default=64.0, help="allowed growth of the API process")
    p.add_argument("--pid", type=int, help="the API process's pid (its memory is watched)")
    p.add_argument(
        "--batch-variant",
        action="store_true",
        help="the server's greedy answers may depend on the batch (the CPU's default mode with GGUF blocks on AMX): "
        "answers of requests that no kill touched are counted against the clean run's, not checked",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the JSON report here")
    args = p.parse_args(argv)
    result = chaos(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    sys.exit(main())

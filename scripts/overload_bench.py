"""How a running server degrades beyond its capacity.

First the capacity of one request shape (OpenAI streaming completions, a fixed prompt,
--max-tokens with ignore_eos): a closed loop at --concurrency gives requests/s and tokens/s,
and one client alone the unloaded time to first token. Then open-loop Poisson arrivals at each
multiple of the measured request rate (--load, default 2 and 4 times) for --duration seconds,
every request with an X-Request-Timeout of --deadline seconds. For each level: the offered
rate, requests admitted and refused (and how fast the refusals came), requests completed within
their deadline, goodput (tokens of those requests per second, as a share of the capacity's
tokens/s, over the level with the queue's drain and over the arrivals alone: "steady"), the
admitted requests' time to first token against the unloaded one, deadline misses
among the admitted, and the server's refusals of the level by reason (from its /metrics:
queue_full, predicted_delay, first_token_wait). Writes JSON (--out) and prints a table.

The server's admission settings are its own, set where it is started: for the figures with a bound
on the first token's wait, start it with OPTION_MAX_FIRST_TOKEN_WAIT=0.2 (or
option.max_first_token_wait=0.2 in serving.properties); --server-note records how it was started.
Such a bound refuses part of a closed loop too, so measure the capacity on the same server started
without it and hand that report to the bounded run: --capacity-from REPORT takes the capacity
(requests/s, tokens/s, unloaded time to first token) from an earlier report of this script.

    python scripts/overload_bench.py --url http://127.0.0.1:8080 --concurrency 32 --duration 60
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx

from lmiserve.bench.apis import APIS
from lmiserve.bench.load import run_level
from lmiserve.bench.open_loop import offer_load, overload_report, refusals_between, refusals_by_reason
from lmiserve.bench.prompts import WORDS

CLIENT_BOUND = 0.8


def model_name(url: str, name: str | None) -> str:
    if name:
        return name
    return httpx.get(url.rstrip("/") + "/v1/models", timeout=30).json()["data"][0]["id"]


def server_refusals(url: str, model: str) -> dict[str, float]:
    """The server's refusals of ``model`` so far, by reason (none where /metrics cannot be read)."""
    try:
        answer = httpx.get(url.rstrip("/") + "/metrics", timeout=30)
    except httpx.HTTPError:
        return {}
    return refusals_by_reason(answer.text, model) if answer.status_code == 200 else {}


def fixed_prompt(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


def measure_capacity(args: argparse.Namespace, model: str, prompt: str) -> dict:
    api = APIS["openai"]
    c = args.concurrency
    requests = args.capacity_requests or 4 * c
    # the first batches of a fresh server are slower (shapes seen for the first time): warm it up,
    # at the concurrency measured, before measuring anything
    print(f"warm-up: {2 * c} requests at concurrency {c} ...", file=sys.stderr, flush=True)
    warm = [f"warm-{i}: {prompt}" for i in range(2 * c)]
    run_level(args.url, api, warm, c, len(warm), args.max_tokens, model, client_procs=args.client_procs)
    print("unloaded: one client, 10 requests ...", file=sys.stderr, flush=True)
    alone = [f"unloaded-{i}: {prompt}" for i in range(12)]
    unloaded = run_level(args.url, api, alone, 1, 2, args.max_tokens, model)
    print(f"capacity: closed loop at concurrency {c}, {requests} requests ...", file=sys.stderr, flush=True)
    prompts = [f"capacity-{i}: {prompt}" for i in range(c + requests)]
    loaded = run_level(args.url, api, prompts, c, c, args.max_tokens, model, client_procs=args.client_procs)
    return {
        "concurrency": c,
        "requests_per_s": loaded.get("requests_per_s", 0.0),
        "tokens_per_s": loaded.get("output_tokens_per_s", 0.0),
        "errors": loaded.get("errors"),
        "unloaded_ttft_s": (unloaded.get("ttft_s") or {}).get("p50"),
        "closed_loop": loaded,
        "unloaded": unloaded,
    }


def fmt(value: object, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def table(capacity: dict, levels: list[dict]) -> str:
    head = (
        f"capacity at concurrency {capacity['concurrency']}: {capacity['requests_per_s']:.2f} requests/s, "
        f"{capacity['tokens_per_s']:.1f} tokens/s; unloaded TTFT p50 {fmt(capacity['unloaded_ttft_s'], '.3f')} s\n"
    )
    cols = (
        "load  offered/s  admitted  refused  refusal ms p50/p99/max  in deadline  goodput  steady  "
        "TTFT p50/p99 s  x unloaded  misses"
    )
    rows = [head, cols]
    for lv in levels:
        r = lv["report"]
        ms, ttft, ratio = r["refusal_ms"], r["ttft_s"], r["ttft_vs_unloaded"]
        refusal = f"{fmt(ms['p50'])}/{fmt(ms['p99'])}/{fmt(ms['max'])}"
        first = f"{fmt(ttft['p50'], '.3f')}/{fmt(ttft['p99'], '.3f')}"
        times = f"{fmt(ratio['p50'], '.1f')}/{fmt(ratio['p99'], '.1f')}"
        rows.append(
            f"{lv['load']:>3g}x  {r['offered_per_s']:>9.2f}  {r['admitted']:>8}  {r['refused']:>7}  {refusal:>23}  "
            f"{r['completed_in_deadline']:>11}  {fmt(r['goodput_ratio'], '.2f'):>7}  "
            f"{fmt(r['steady_goodput_ratio'], '.2f'):>6}  {first:>14}  {times:>10}  "
            f"{r['deadline_misses']:>6}"
        )
    for lv in levels:
        reasons = ", ".join(f"{reason} {n}" for reason, n in lv["report"].get("refused_by_reason", {}).items())
        rows.append(f"{lv['load']:g}x refused by the server, by reason: {reasons or 'none'}")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="the running server")
    parser.add_argument("--model", default=None, help="model name (default: the server's first)")
    parser.add_argument("--prompt-words", type=int, default=100, help="words of the fixed prompt")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens every request generates (ignore_eos)")
    parser.add_argument("--concurrency", type=int, default=32, help="closed-loop clients measuring the capacity")
    parser.add_argument("--capacity-requests", type=int, default=0, help="measured requests (default: 4 x concurrency)")
    parser.add_argument("--load", default="2,4", help="comma-separated multiples of the capacity's request rate")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals per level")
    parser.add_argument("--deadline", type=float, default=10.0, help="X-Request-Timeout of every request (seconds)")
    parser.add_argument("--client-procs", type=int, default=1, help="client processes the load is spread over")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--capacity-from",
        default="",
        help="an earlier report of this script whose capacity to use instead of measuring it (a server without "
        "a first-token bound)",
    )
    parser.add_argument(
        "--server-note",
        default="",
        help="how the server was started (say OPTION_MAX_FIRST_TOKEN_WAIT=0.2), kept in the JSON report",
    )
    parser.add_argument("--out", default="overload-results.json", help="the JSON report")
    args = parser.parse_args()

    model = model_name(args.url, args.model)
    prompt = fixed_prompt(args.prompt_words)
    if args.capacity_from:
        capacity = json.loads(Path(args.capacity_from).read_text())["capacity"] | {"from": args.capacity_from}
        warm = [f"warm-{i}: {prompt}" for i in range(8)]  # a few at a time: a bound refuses a burst
        run_level(args.url, APIS["openai"], warm, 2, len(warm), args.max_tokens, model)
    else:
        capacity = measure_capacity(args, model, prompt)
    if not capacity["requests_per_s"]:
        print(f"the capacity run failed: {capacity['closed_loop']}", file=sys.stderr)
        return 1
    levels = []
    for load in [float(x) for x in args.load.split(",") if x.strip()]:
        rate = load * capacity["requests_per_s"]
        print(f"{load:g}x: {rate:.2f} requests/s for {args.duration:g} s ...", file=sys.stderr, flush=True)
        before = server_refusals(args.url, model)
        records, busy = offer_load(
            args.url,
            APIS["openai"],
            prompt,
            args.max_tokens,
            model,
            rate,
            args.duration,
            args.deadline,
            args.client_procs,
            args.seed + len(levels) + 1,
        )
        report = overload_report(
            records,
            rate,
            args.duration,
            args.deadline,
            args.max_tokens,
            capacity["tokens_per_s"],
            capacity["unloaded_ttft_s"],
        )
        report["client_cpu_per_proc"] = busy
        report["refused_by_reason"] = refusals_between(before, server_refusals(args.url, model))
        if max(busy) > CLIENT_BOUND:
            print(
                f"warning: a client process was busy {max(busy):.0%} of the time (try --client-procs)", file=sys.stderr
            )
        levels.append({"load": load, "report": report})
    result = {"config": vars(args) | {"model": model}, "capacity": capacity, "levels": levels}
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(table(capacity, levels))
    print(f"\nwrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``lmiserve bench``: sweep concurrency levels against a server, then (optionally) measure
transformers generate on the same prompts, and write the report."""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import httpx

from . import speculation
from .apis import APIS
from .load import Outputs, run_level
from .outputs import compare_outputs, describe_comparison, output_lines, read_outputs, write_outputs
from .report import plot, table, write_json
from .speculation import STATIC
from .workloads import WORKLOADS, build


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="the running server")
    parser.add_argument("--api", choices=sorted(APIS), default="lmi", help="protocol to load the server with")
    parser.add_argument(
        "--concurrency",
        default=None,
        help="comma-separated concurrency levels (default: 1,8,32,128; --cpu-report 1,8,32)",
    )
    parser.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="random",
        help="random: seeded words of --prompt-tokens tokens; grounded: requests to copy a passage or code snippet "
        "with one change, whose answers repeat the prompt (where prompt-lookup speculation helps)",
    )
    parser.add_argument("--prompt-tokens", type=int, default=190, help="--workload random: the prompts' length")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--requests", type=int, default=0, help="measured requests per level (default: max(8, 3 x c))")
    parser.add_argument("--warmup", type=int, default=-1, help="unmeasured requests first (default: c)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompt texts")
    parser.add_argument(
        "--no-salt", action="store_true", help="do not start prompts with a per-run tag (prefix-cache hits across runs)"
    )
    parser.add_argument("--model", default=None, help="model name (default: the server's only model)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the served model's)")
    parser.add_argument(
        "--adapters", default="", help="comma-separated LoRA adapters, mixed evenly over the requests (default: none)"
    )
    parser.add_argument(
        "--baseline", action="store_true", help="also measure transformers generate (batch = c) on the server's device"
    )
    parser.add_argument("--dtype", default=None, help="baseline dtype (default: the server's)")
    parser.add_argument("--device", default=None, help="baseline device (default: the server's, e.g. cuda:0)")
    parser.add_argument("--out", default="bench-results", help="directory for report.json and report.png")
    parser.add_argument(
        "--save-outputs",
        default=None,
        metavar="FILE",
        help="write every request's generated text (warm-up too) to FILE as JSON lines by prompt index; "
        "runs to compare need the same prompts: the same --workload, --seed and levels, and --no-salt",
    )
    parser.add_argument(
        "--compare-outputs",
        nargs=2,
        default=None,
        metavar=("A", "B"),
        help="no server: how many texts of two --save-outputs files are identical (exit 1 if any differ)",
    )
    parser.add_argument(
        "--cpu-report",
        action="store_true",
        help="no server: run the engine in this process and report how it uses this CPU (cpu-report.json in --out)",
    )
    parser.add_argument("--model-dir", default=None, help="--cpu-report: the model directory, as for lmiserve serve")
    parser.add_argument("--steps", type=int, default=20, help="--cpu-report: decode steps measured per level")
    parser.add_argument(
        "--client-procs",
        type=int,
        default=1,
        help="client processes the concurrent clients are spread over (raise it when a level is flagged client-bound)",
    )


def _server_model(url: str, name: str | None) -> dict:
    """The model's description from lmiserve's management API; for another server (vLLM, TGI),
    what its OpenAI ``/v1/models`` says (its ``root`` is the model's directory, where it gives one)."""
    base = url.rstrip("/")
    listed = httpx.get(base + "/models", timeout=30)
    if listed.status_code == 200 and "models" in listed.json():
        name = name or listed.json()["models"][0]["modelName"]
        return httpx.get(base + f"/models/{name}", timeout=30).json()[0]
    cards = httpx.get(base + "/v1/models", timeout=30).json()["data"]
    card = next((c for c in cards if c["id"] == name), cards[0])
    return {"modelName": card["id"], "root": card.get("root"), "engine": None}


API_CPU = "lmiserve_api_cpu_seconds_total"


def api_cpu_seconds(url: str) -> float | None:
    """The server's API CPU counter from its ``/metrics`` (None for a server without one)."""
    try:
        response = httpx.get(url.rstrip("/") + "/metrics", timeout=30)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    for line in response.text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.split("{", 1)[0] == API_CPU:
            return float(value)
    return None


def speculative_now(url: str, name: str) -> dict | None:
    """The speculative counters of the served model (None for a server or model without them)."""
    try:
        response = httpx.get(url.rstrip("/") + f"/models/{name}", timeout=30)
        described = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    if isinstance(described, list) and described:
        described = described[0]
    return speculation.speculative_stats(described)


def _compare(paths: list[str]) -> int:
    a, b = (read_outputs(Path(p)) for p in paths)
    result = compare_outputs(a, b)
    print(describe_comparison(result, a, b))
    return 0 if result["compared"] and not result["differing"] else 1


def _model_path(info: dict, tokenizer: str | None) -> Path:
    from ..config import load_settings
    from ..model_store import resolve_model

    if tokenizer:
        return Path(tokenizer)
    if "modelUrl" not in info:  # another server: its model's own directory
        if not info.get("root") or not Path(info["root"]).is_dir():
            raise SystemExit("this server does not say where its model is: give --tokenizer DIR")
        return Path(info["root"])
    settings = load_settings(info["modelUrl"], env={})
    return resolve_model(settings.model.model_id, settings.model_dir)


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def run(args: argparse.Namespace) -> int:
    if args.compare_outputs:
        return _compare(args.compare_outputs)
    if args.cpu_report:
        from ..cpu_isa import CpuIsaError, apply_torch_env

        try:
            apply_torch_env()  # a forced CPU class holds torch's own kernels too, as in lmiserve serve
        except CpuIsaError as exc:
            print(f"lmiserve: {exc}", file=sys.stderr)
            return 2
        from .cpu_report import run as run_cpu_report

        return run_cpu_report(args)
    from transformers import AutoTokenizer

    levels = [int(c) for c in (args.concurrency or "1,8,32,128").split(",") if c.strip()]
    adapters = [a.strip() for a in args.adapters.split(",") if a.strip()]
    info = _server_model(args.url, args.model)
    path = _model_path(info, args.tokenizer)
    tokenizer = AutoTokenizer.from_pretrained(path)
    plan = [(c, args.requests or max(8, 3 * c), c if args.warmup < 0 else args.warmup) for c in levels]
    salt = "" if args.no_salt else f"run {random.Random().randrange(10**6)}:"
    # every request of the run gets a prompt of its own: no request finds another's in the prefix cache
    count = sum(n + w for _, n, w in plan)
    texts, ids = build(args.workload, tokenizer, count, args.prompt_tokens, args.seed, salt, args.api)
    configured = speculation.speculative_stats(info) or {}
    report: dict = {
        "config": {
            "url": args.url,
            "api": args.api,
            "model": info["modelName"],
            "workload": args.workload,
            "prompt_tokens": args.prompt_tokens if args.workload == "random" else round(_mean(map(len, ids)), 1),
            "max_new_tokens": args.max_new_tokens,
            "seed": args.seed,
            "salt": salt,
            "adapters": adapters,
            "engine": info.get("engine"),
            "speculative": {k: v for k, v in configured.items() if k in STATIC} or None,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
        "server": [],
    }
    api = APIS[args.api]
    used = 0
    kept: Outputs = {}
    warmups: set[int] = set()
    for c, n, warmup in plan:
        print(f"concurrency {c}: {warmup} warm-up + {n} measured requests ...", file=sys.stderr, flush=True)
        batch = texts[used : used + warmup + n]
        level_outputs: Outputs | None = {} if args.save_outputs else None
        cpu, spec = api_cpu_seconds(args.url), speculative_now(args.url, info["modelName"])
        row = run_level(
            args.url,
            api,
            batch,
            c,
            warmup,
            args.max_new_tokens,
            info["modelName"],
            adapters,
            args.client_procs,
            level_outputs,
        )
        after = api_cpu_seconds(args.url)
        if (figures := speculation.run_figures(spec, speculative_now(args.url, info["modelName"]))) is not None:
            row["speculative"] = figures  # the level's own proposals, its warm-up's included
        row["prompt_indices"] = [used, used + warmup + n]  # of --save-outputs, warm-up first
        kept.update({used + i: out for i, out in (level_outputs or {}).items()})
        warmups.update(range(used, used + warmup))
        used += warmup + n
        if cpu is not None and after is not None and row.get("streamed_tokens"):
            # the server's API processes: their CPU over the level (warm-up included) per token streamed
            row["api_cpu_us_per_token"] = round((after - cpu) / row["streamed_tokens"] * 1e6, 1)
            print(f"  the server's API process(es): {row['api_cpu_us_per_token']:.0f} us of CPU per streamed token",
                  file=sys.stderr, flush=True)  # fmt: skip
        for sample in row.get("error_samples") or []:
            print(f"  error: {sample[:300]}", file=sys.stderr, flush=True)
        if row["client_bound"]:
            print(
                f"warning: at concurrency {c} a client process was busy {max(row['client_cpu_per_proc']):.0%} of "
                "the time: the figure may be the client's limit, not the server's (try --client-procs)",
                file=sys.stderr,
                flush=True,
            )
        report["server"].append(row)
    if args.baseline:
        from .baseline import run_baseline

        engine = info.get("engine") or {}
        dtype = args.dtype or engine.get("dtype") or "fp32"
        device = args.device or engine.get("device") or "cpu"
        print(f"transformers generate ({dtype} on {device}), batch sizes {levels} ...", file=sys.stderr, flush=True)
        report["baseline"] = run_baseline(path, dtype, ids, levels, args.max_new_tokens, device)
        report["config"]["baseline_dtype"] = dtype
        report["config"]["baseline_device"] = device
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(report, out / "report.json")
    print(table(report))
    if spec_table := speculation.table(report["server"]):
        print("\n" + spec_table)
    written = [str(out / "report.json")]
    if args.save_outputs:
        write_outputs(output_lines(texts, kept, warmups), Path(args.save_outputs))
        written.append(args.save_outputs)
    try:
        plot(report, out / "report.png")
        written.append(str(out / "report.png"))
    except ImportError as exc:  # the figures above and in the JSON stand without the plot
        print(f"no plot ({exc}); install matplotlib (lmiserve[bench]) for report.png", file=sys.stderr)
    print(f"\nwrote {' and '.join(written)}", file=sys.stderr)
    return 0 if all(row.get("errors", 1) == 0 for row in report["server"]) else 1

#!/usr/bin/env python3
"""Speculative decoding against plain decoding on one model, server by server:

    python scripts/spec_bench.py [--model-dir DIR] [--workloads grounded,random] [--concurrency 1,8,32]
                                 [--config NAME [VAR=VALUE ...]]... [--draft-model DIR] [--deterministic]

Each configuration is its own ``lmiserve serve``, started, measured with ``lmiserve bench`` (every
workload, every level, greedy, ``--no-salt`` so that every server gets the same prompts) and
stopped in turn. A configuration is a name and the ``OPTION_*`` variables its server gets besides
``OPTION_PREDICTIVE_ADMISSION=false`` (no 503s under the closed loop), ``--env`` and, with
``--deterministic``, ``OPTION_DETERMINISTIC=true``. Built in: ``baseline`` (no speculation),
``ngram`` (prompt lookup, 4 tokens, 2- to 4-token matches) and, with ``--draft-model DIR``,
``draft`` (that model proposes 4 tokens). The default runs ``baseline`` and ``ngram`` (and
``draft``). A serving.properties in ``--model-dir`` wins over the variables: leave speculation
out of it. Without ``--model-dir``, the embedded SmolLM2.

The table: per configuration, workload and level, output tokens/s and its ratio to the base
configuration's (``--base``), how many greedy texts are the base's exactly (warm-up requests
included), and the speculative figures bench reads from the server (acceptance rate a, mean
accepted length L, mean proposal length k, draft cost ratio c, the cost model's speed-up
L/(1+kc), and the tokens per step i.i.d. acceptance at rate a would give). Reports and outputs
land in ``--work``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from lmiserve.bench.outputs import compare_outputs, read_outputs

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
SPEC = "OPTION_SPECULATIVE_CONFIG"


def presets(draft_model: str | None) -> dict[str, dict[str, str]]:
    """The built-in configurations, by name: their variables."""
    known = {"baseline": {}, "ngram": {SPEC: json.dumps(NGRAM)}}
    if draft_model:
        known["draft"] = {
            SPEC: json.dumps({"method": "draft_model", "model": draft_model, "num_speculative_tokens": 4})
        }
    return known


def parse_configs(given: list[list[str]] | None, draft_model: str | None) -> dict[str, dict[str, str]]:
    """``--config NAME [VAR=VALUE ...]`` as {name: variables}; a name alone is a built-in one.
    None given: the built-in ones."""
    known = presets(draft_model)
    if not given:
        return known
    configs: dict[str, dict[str, str]] = {}
    for name, *pairs in given:
        if not pairs:
            if name not in known:
                raise SystemExit(
                    f"--config {name}: not a built-in configuration ({', '.join(known)}); give its VAR=VALUE"
                )
            configs[name] = dict(known[name])
            continue
        configs[name] = dict(parse_pair(p) for p in pairs)
    return configs


def parse_pair(text: str) -> tuple[str, str]:
    """``VAR=VALUE``, split at the first ``=`` (the value may hold more)."""
    var, sep, value = text.partition("=")
    if not sep or not var:
        raise SystemExit(f"{text!r} is not VAR=VALUE")
    return var, value


def server_env(config: dict[str, str], extra: dict[str, str], deterministic: bool) -> dict[str, str]:
    """What a configuration's server runs with, over this environment."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", OPTION_PREDICTIVE_ADMISSION="false")
    env.update(extra)
    if deterministic:
        env["OPTION_DETERMINISTIC"] = "true"
    env.update(config)
    return env


def identical_by_level(report: dict, mine: dict[int, dict], base: dict[int, dict] | None) -> dict[int, str]:
    """Per level: "identical/compared" against the base's texts for the level's prompts ("-"
    without the base's texts)."""
    cells = {}
    for row in report["server"]:
        first, end = row.get("prompt_indices") or (0, 0)
        if base is None or end <= first:
            cells[row["concurrency"]] = "-"
            continue
        pick = range(first, end)
        result = compare_outputs({i: mine[i] for i in pick if i in mine}, {i: base[i] for i in pick if i in base})
        cells[row["concurrency"]] = f"{result['identical']}/{result['compared']}"
    return cells


def _f(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def table(results: list[dict], base_name: str) -> str:
    """One line per configuration, workload and level. ``results``: {config, workload, report,
    identical: {level: cell}} (a failed run: report None)."""
    head = "| config | workload | c | tok/s | ratio | identical greedy | a | L | k | c_draft | L/(1+kc) | i.i.d. L |"
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    bases = {r["workload"]: r["report"] for r in results if r["config"] == base_name and r["report"]}
    for r in results:
        if r["report"] is None:
            lines.append(f"| {r['config']} | {r['workload']} | - | failed |" + " - |" * 8)
            continue
        base_rows = {row["concurrency"]: row for row in (bases.get(r["workload"]) or {"server": []})["server"]}
        for row in r["report"]["server"]:
            c = row["concurrency"]
            tps = row.get("output_tokens_per_s")
            b = base_rows.get(c, {}).get("output_tokens_per_s")
            ratio = f"{tps / b:.2f}x" if tps and b else "-"
            s = row.get("speculative") or {}
            lines.append(
                f"| {r['config']} | {r['workload']} | {c} | {_f(tps, '.1f')} | {ratio} | {r['identical'].get(c, '-')} "
                f"| {_f(s.get('acceptance_rate'), '.3f')} | {_f(s.get('mean_accepted_length'), '.2f')} "
                f"| {_f(s.get('mean_proposal_length'), '.2f')} | {_f(s.get('draft_cost_ratio'), '.3g')} "
                f"| {_f(s.get('predicted_speedup'), '.2f')} | {_f(s.get('iid_tokens_per_step'), '.2f')} |"
            )
    return "\n".join(lines)


def _wait_ready(url: str, server: subprocess.Popen, log: Path, limit_s: float = 900) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"the server stopped before it was ready:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{url}/ping", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    sys.exit(f"the server was not ready within {limit_s:.0f} s")


def bench_command(args: argparse.Namespace, url: str, workload: str, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "lmiserve", "bench", "--url", url, "--api", args.api, "--workload", workload]
    cmd += ["--concurrency", args.concurrency, "--max-new-tokens", str(args.max_tokens), "--seed", str(args.seed)]
    cmd += ["--no-salt", "--out", str(out), "--save-outputs", str(out / "outputs.jsonl")]
    return cmd + (["--requests", str(args.requests)] if args.requests else [])


def run_config(args: argparse.Namespace, work: Path, model_dir: Path, name: str, env: dict[str, str]) -> list[dict]:
    url = f"http://127.0.0.1:{args.port}"
    log = work / f"server-{name}.log"
    cmd = [sys.executable, "-m", "lmiserve", "serve", "--model-dir", str(model_dir)]
    cmd += ["--host", "127.0.0.1", "--port", str(args.port)]
    print(f"{name}: starting the server ({log})", file=sys.stderr, flush=True)
    with log.open("w") as out:
        server = subprocess.Popen(cmd, stdout=out, stderr=out, env=env, start_new_session=True)
    results = []
    try:
        _wait_ready(url, server, log)
        for workload in args.workloads.split(","):
            out_dir = work / name / workload
            subprocess.run(bench_command(args, url, workload, out_dir), env=dict(os.environ), stdout=sys.stderr)
            report_path = out_dir / "report.json"
            report = json.loads(report_path.read_text()) if report_path.exists() else None
            results.append({"config": name, "workload": workload, "report": report, "outputs": out_dir})
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model-dir", type=Path, default=None, help="as for lmiserve serve (default: the embedded SmolLM2)"
    )
    ap.add_argument(
        "--config",
        nargs="+",
        action="append",
        metavar="NAME [VAR=VALUE ...]",
        help="a configuration: a built-in name alone (baseline, ngram, draft), or a name and its OPTION_* variables; "
        "repeat for more (default: baseline and ngram, and draft with --draft-model)",
    )
    ap.add_argument("--draft-model", default=None, help="adds the built-in 'draft' configuration: this draft model")
    ap.add_argument("--base", default="baseline", help="the configuration ratios and texts are compared to")
    ap.add_argument("--workloads", default="grounded", help="comma-separated bench workloads (grounded, random)")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--requests", type=int, default=0, help="measured requests per level (default: bench's)")
    ap.add_argument("--max-tokens", type=int, default=128, help="new tokens per request")
    ap.add_argument("--deterministic", action="store_true", help="OPTION_DETERMINISTIC=true on every server")
    ap.add_argument("--env", action="append", default=[], metavar="VAR=VALUE", help="for every server (repeat)")
    ap.add_argument("--api", default="lmi", help="bench's --api")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=8096)
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args(argv)
    configs = parse_configs(args.config, args.draft_model)
    extra = dict(parse_pair(p) for p in args.env)
    work = args.work or Path(tempfile.mkdtemp(prefix="spec-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    model_dir = args.model_dir
    if model_dir is None:  # an empty directory: lmiserve serve then serves the embedded model
        model_dir = work / "embedded-model"
        model_dir.mkdir(exist_ok=True)
    results = []
    for name, config in configs.items():
        results += run_config(args, work, model_dir, name, server_env(config, extra, args.deterministic))
    bases = {r["workload"]: r for r in results if r["config"] == args.base and r["report"]}
    for r in results:
        base = bases.get(r["workload"])
        mine_path, base_path = r["outputs"] / "outputs.jsonl", base and base["outputs"] / "outputs.jsonl"
        if r["report"] is None or base_path is None or not mine_path.exists() or not base_path.exists():
            r["identical"] = {}
            continue
        r["identical"] = identical_by_level(r["report"], read_outputs(mine_path), read_outputs(base_path))
    print(table(results, args.base))
    print(f"reports: {work}")
    return 0 if all(r["report"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

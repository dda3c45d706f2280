"""The bench report: a table on the terminal, JSON, and a PNG plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def table(report: dict[str, Any]) -> str:
    base = {row["concurrency"]: row for row in report.get("baseline") or []}
    lines = [
        "| concurrency | output tok/s | req/s | TTFT p50/p90/p99 ms | ITL p50/p99 ms | E2E p50/p99 s | errors "
        "| transformers tok/s | ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["server"]:
        c = row["concurrency"]
        b = base.get(c)
        baseline = f"{b['output_tokens_per_s']:.1f}" if b else "-"
        if "output_tokens_per_s" not in row:
            lines.append(f"| {c} | - | - | - | - | - | {row.get('errors')} | {baseline} | - |")
            continue
        ttft, itl, e2e = row["ttft_s"], row["itl_s"], row["e2e_s"]
        ratio = f"{row['output_tokens_per_s'] / b['output_tokens_per_s']:.2f}x" if b else "-"
        lines.append(
            f"| {c} | {row['output_tokens_per_s']:.1f} | {row['requests_per_s']:.2f} "
            f"| {_ms(ttft['p50'])}/{_ms(ttft['p90'])}/{_ms(ttft['p99'])} | {_ms(itl['p50'])}/{_ms(itl['p99'])} "
            f"| {e2e['p50']:.2f}/{e2e['p99']:.2f} | {row['errors']} | {baseline} | {ratio} |"
        )
    return "\n".join(lines)


def write_json(report: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(report, indent=2))


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["server"] if "output_tokens_per_s" in r]
    conc = [r["concurrency"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(conc, [r["output_tokens_per_s"] for r in rows], "o-", label="lmiserve")
    if report.get("baseline"):
        base = report["baseline"]
        left.plot(
            [b["concurrency"] for b in base],
            [b["output_tokens_per_s"] for b in base],
            "s--",
            label="transformers generate",
        )
    left.set_xscale("log", base=2)
    left.set_xticks(conc, [str(c) for c in conc])
    left.set_xlabel("concurrency (transformers: batch size)")
    left.set_ylabel("output tokens/s")
    left.set_title("Throughput")
    left.legend()
    left.grid(alpha=0.3)
    for key, marker, color, label in (("ttft_s", "o", "C0", "TTFT"), ("itl_s", "^", "C2", "inter-token")):
        right.plot(conc, [r[key]["p50"] for r in rows], marker + "-", color=color, label=f"{label} p50")
        right.plot(conc, [r[key]["p99"] for r in rows], marker + "--", color=color, alpha=0.6, label=f"{label} p99")
    right.set_xscale("log", base=2)
    right.set_xticks(conc, [str(c) for c in conc])
    if any(r[key][q] > 0 for r in rows for key in ("ttft_s", "itl_s") for q in ("p50", "p99")):
        right.set_yscale("log")  # a level whose every request failed has no latency to scale
    right.set_xlabel("concurrency")
    right.set_ylabel("seconds")
    right.set_title("Latency")
    right.legend()
    right.grid(alpha=0.3)
    cfg = report["config"]
    fig.suptitle(
        f"{cfg['model']} - {cfg.get('workload', 'random')} workload, {cfg['prompt_tokens']}-token prompts, "
        f"{cfg['max_new_tokens']} new tokens, {cfg['api']} API"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

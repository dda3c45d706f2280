"""One table from several `lmiserve bench` reports of the same server: output tok/s per
protocol and concurrency, OpenAI over LMI, TTFT, transformers' baseline and a level run first
after start-up.

    python scripts/bench_table.py --run lmi=DIR --run openai=DIR [--cold DIR]

Each DIR holds a report.json. The first run is the reference for the TTFT columns and for the
ratio; a run's baseline (``--baseline``) fills the transformers column.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def load(directory: str) -> dict[str, Any]:
    return json.loads((Path(directory) / "report.json").read_text())


def rows(report: dict[str, Any], key: str = "server") -> dict[int, dict[str, Any]]:
    return {row["concurrency"]: row for row in report.get(key) or []}


def tok_s(row: dict[str, Any] | None) -> str:
    return "-" if not row or not row.get("output_tokens_per_s") else f"{row['output_tokens_per_s']:,.0f}"


def table(runs: list[tuple[str, dict[str, Any]]], cold: dict[str, Any] | None) -> str:
    names = [name for name, _ in runs]
    levels = sorted({c for _, r in runs for c in rows(r)})
    first = rows(runs[0][1])
    baseline: dict[int, dict[str, Any]] = {}
    for _, report in runs:
        baseline.update(rows(report, "baseline"))
    cold_rows = rows(cold) if cold else {}
    header = ["c", *(f"{n} tok/s" for n in names)]
    if len(runs) > 1:
        header += [f"{n}/{names[0]}" for n in names[1:]]
    header += [f"TTFT p50/p99 ms ({names[0]})", "transformers tok/s"]
    if cold:
        header.append(f"first after start ({cold['config']['api']})")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in levels:
        cells = [str(c)] + [tok_s(rows(r).get(c)) for _, r in runs]
        ref = (first.get(c) or {}).get("output_tokens_per_s") or 0
        for _, report in runs[1:]:
            other = (rows(report).get(c) or {}).get("output_tokens_per_s") or 0
            cells.append(f"{other / ref:.2f}" if ref and other else "-")
        ttft = (first.get(c) or {}).get("ttft_s")
        cells.append(f"{ttft['p50'] * 1e3:.0f}/{ttft['p99'] * 1e3:.0f}" if ttft else "-")
        cells.append(tok_s(baseline.get(c)))
        if cold:
            cells.append(tok_s(cold_rows.get(c)))
        lines.append("| " + " | ".join(cells) + " |")
    engine = runs[0][1]["config"].get("engine") or {}
    what = ", ".join(f"{k} {engine[k]}" for k in ("architecture", "dtype", "device", "decode_graphs") if k in engine)
    return "\n".join([f"{what}" if what else "", *lines]).strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, help="NAME=DIR, a bench report directory")
    parser.add_argument("--cold", help="a report directory of a level run right after start-up")
    args = parser.parse_args(argv)
    runs = [(spec.split("=", 1)[0], load(spec.split("=", 1)[1])) for spec in args.run]
    print(table(runs, load(args.cold) if args.cold else None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

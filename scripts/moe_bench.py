#!/usr/bin/env python3
"""Time the CPU's fused mixture-of-experts op against the reference (a loop over experts).

    python scripts/moe_bench.py [--seqs 32] [--hidden 1024] [--inter 512] [--experts 16] [--top-k 2]

One decode step's MoE layer (one row per sequence), bf16, routing drawn at random each step;
prints the median time per step of each and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    import torch

    from lmiserve.rolling_batch.ops.cpu import CpuOps
    from lmiserve.rolling_batch.ops.reference import ReferenceOps

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--inter", type=int, default=512)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args(argv)

    cpu, ref = CpuOps(), ReferenceOps()
    if not cpu.kernels:
        print("the CPU kernels did not build here")
        return 1
    torch.manual_seed(0)
    dtype = torch.bfloat16
    h, i, e = args.hidden, args.inter, args.experts
    w13 = (torch.randn(e, 2 * i, h) * h**-0.5).to(dtype)
    w2 = (torch.randn(e, h, i) * i**-0.5).to(dtype)
    steps = []
    for _ in range(args.steps):
        x = torch.randn(args.seqs, h).to(dtype)
        weights, ids = torch.softmax(torch.randn(args.seqs, e), -1).topk(args.top_k, dim=-1)
        steps.append((x, weights / weights.sum(-1, keepdim=True), ids.to(torch.int32)))

    def timed(ops) -> float:  # type: ignore[no-untyped-def]
        experts = ops.prepare_experts(w13, w2)
        for x, w, ids in steps[:5]:
            ops.fused_moe(x, w, ids, experts)
        times = []
        for x, w, ids in steps:
            start = time.perf_counter()
            ops.fused_moe(x, w, ids, experts)
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    fused, reference = timed(cpu), timed(ref)
    print(
        f"MoE decode step, {args.seqs} sequences, hidden {h}, intermediate {i}, {e} experts top {args.top_k}, bf16, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"  fused (csrc/moe.cpp): {fused:.3f} ms/step")
    print(f"  reference (loop over experts): {reference:.3f} ms/step")
    print(f"  speedup: {reference / fused:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

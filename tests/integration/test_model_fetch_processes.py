"""Downloads in real processes against a loopback S3: one killed half-way resumes where it stopped,
and two that start at once download the model once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmiserve.model_fetch.transfer import MIB, part_paths

FETCH = (
    "import logging, sys\n"
    "from pathlib import Path\n"
    "from lmiserve.model_fetch import FetchOptions, fetch_model\n"
    "logging.basicConfig(level=logging.INFO)\n"
    "print(fetch_model(sys.argv[1], None, FetchOptions(download_dir=Path(sys.argv[2]))))\n"
)


@pytest.fixture(scope="module")
def s3():
    from tests.aws.s3_server import S3Server

    server = S3Server()
    yield server
    server.stop()


def _fetch(s3, model_id: str, download_dir: Path) -> subprocess.Popen[str]:
    env = {**os.environ, **s3.env(), "AWS_EC2_METADATA_DISABLED": "true"}
    return subprocess.Popen(
        [sys.executable, "-c", FETCH, model_id, str(download_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_download_killed_half_way_resumes_where_it_stopped(s3, tmp_path: Path):
    data = os.urandom(16 * MIB)  # sixteen 1 MiB ranges
    s3.put("resume", "m", {"config.json": b"{}", "model.safetensors": data})
    s3.bytes_per_s = 512 * 1024  # a connection: eight of them make 4 MiB/s
    first = _fetch(s3, "s3://resume/m/", tmp_path)
    deadline = time.monotonic() + 60
    while s3.sent_from("resume") < 10 * MIB and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)
    first.kill()
    first.wait()
    # the server counts a piece before it sends it: a thread asleep in the throttle may count one
    # more before it finds the client gone; read the count once it has stood still for a second
    settled, last = time.monotonic(), s3.sent_from("resume")
    while time.monotonic() - settled < 1.0:
        time.sleep(0.1)
        if s3.sent_from("resume") != last:
            settled, last = time.monotonic(), s3.sent_from("resume")
    s3.bytes_per_s = None
    dest = tmp_path / "s3" / "resume" / "m" / "model.safetensors"
    part, record = part_paths(dest)
    assert part.is_file() and not dest.exists()
    done = record.read_text().splitlines()[1:]
    assert 0 < len(done) < 16, done
    before = s3.sent_from("resume")
    second = _fetch(s3, "s3://resume/m/", tmp_path)
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert out.strip() == str(dest.parent)
    assert dest.read_bytes() == data
    assert s3.sent_from("resume") - before == len(data) - len(done) * MIB  # only the ranges not recorded
    assert not part.exists() and not record.exists()


def test_two_processes_starting_at_once_download_the_model_once(s3, tmp_path: Path):
    data = os.urandom(8 * MIB)
    s3.put("twice", "m", {"config.json": b"{}", "model.safetensors": data})
    s3.bytes_per_s = 128 * 1024  # eight connections: 1 MiB/s, so the first is still downloading when the second starts
    try:
        procs = [_fetch(s3, "s3://twice/m", tmp_path)]
        deadline = time.monotonic() + 60
        while s3.sent_from("twice") == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        procs.append(_fetch(s3, "s3://twice/m", tmp_path))
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        s3.bytes_per_s = None
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in results]
    assert {out.strip() for out, _ in results} == {str(tmp_path / "s3" / "twice" / "m")}
    assert s3.sent_from("twice") == len(data) + 2  # once, and config.json's two bytes
    assert "another process is downloading this model; waiting for it" in results[1][1]
    assert "every file is in" in results[1][1]
    assert (tmp_path / "s3" / "twice" / "m" / "model.safetensors").read_bytes() == data

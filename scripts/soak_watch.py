"""What scripts/soak.py watches on the server: the resident memory of its processes, and its
requests and KV blocks in use (from ``/metrics``)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import httpx


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return kids + [k for kid in kids for k in _children(kid)]


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants."""
    total = 0
    for p in [pid, *_children(pid)]:
        try:
            match = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{p}/status").read_text(), re.M)
        except OSError:
            continue
        total += int(match.group(1)) * 1024 if match else 0
    return total


class RssSampler(threading.Thread):
    def __init__(self, pid: int | None, period: float = 0.5):
        super().__init__(daemon=True)
        self.pid, self.period, self.peak = pid, period, 0
        self.stop = threading.Event()

    def run(self) -> None:
        while self.pid and not self.stop.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            self.stop.wait(self.period)


def server_pid(port: int) -> int | None:
    """The process listening on ``port`` (needs psutil), or None."""
    try:
        import psutil
    except ImportError:
        return None
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return conn.pid
    return None


def engine_state(client: httpx.Client) -> dict[str, float]:
    """Running and waiting requests and KV blocks in use, summed over models, from /metrics."""
    text = client.get("/metrics").text
    state = {}
    for name in ("lmiserve_requests_running", "lmiserve_requests_waiting", "lmiserve_kv_cache_blocks_used"):
        state[name] = sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))
    return state


def wait_idle(client: httpx.Client, timeout: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        state = engine_state(client)
        if not any(state.values()) or time.monotonic() > deadline:
            return state
        time.sleep(0.25)

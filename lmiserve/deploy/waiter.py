"""Wait for an endpoint to settle, with a progress line whenever something changes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .aws import DeployError

Log = Callable[[str], None]
TRANSITIONAL = frozenset({"Creating", "Updating", "SystemUpdating", "RollingBack", "Deleting"})
HEARTBEAT = 60.0  # seconds between progress lines while nothing changes


def wait_for_endpoint(
    sagemaker: Any,
    name: str,
    *,
    poll: float = 15.0,
    timeout: float = 3600.0,
    log: Log = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict:
    """Poll DescribeEndpoint until the endpoint leaves its transitional states; return that description.

    The caller judges the outcome (InService, Failed, or an update rolled back to the old configuration).
    """
    start = clock()
    last_status = None
    last_line = start
    while True:
        described = sagemaker.describe_endpoint(EndpointName=name)
        status = described["EndpointStatus"]
        now = clock()
        if status != last_status or now - last_line >= HEARTBEAT:
            log(f"endpoint {name}: {status}{_instances(described)} ({_elapsed(now - start)})")
            last_status, last_line = status, now
        if status not in TRANSITIONAL:
            return described
        if now - start >= timeout:
            raise DeployError(
                f"endpoint {name} is still {status} after {_elapsed(now - start)}; SageMaker goes on with it: "
                f"lmiserve deploy status --endpoint {name}"
            )
        sleep(poll)


def _instances(described: dict) -> str:
    variants = described.get("ProductionVariants") or []
    counts = [(v.get("CurrentInstanceCount"), v.get("DesiredInstanceCount")) for v in variants]
    if not counts or all(c == (None, None) for c in counts):
        return ""
    current = sum(c or 0 for c, _ in counts)
    desired = sum(d or 0 for _, d in counts)
    return f", {current}/{desired} instances"


def _elapsed(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s"

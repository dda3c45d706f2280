"""Per-request deadlines of generation requests.

Every request gets ``predict_timeout`` seconds; a client may ask for less with the
``X-Request-Timeout`` header. When the deadline passes, generation is aborted (its KV blocks
are freed) and the request ends: with 503 and ``Retry-After`` when it never produced a token
(it was shed from the queue rather than served late), with 504 otherwise.
"""

from __future__ import annotations

import math

from starlette.requests import Request

from ..errors import BadRequest

HEADER = "x-request-timeout"


def budget(request: Request, predict_timeout: float) -> float:
    """Seconds this request may take: ``X-Request-Timeout`` capped by ``predict_timeout``."""
    raw = request.headers.get(HEADER)
    if raw is None:
        return predict_timeout
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise BadRequest(f"X-Request-Timeout must be a positive number of seconds, not {raw[:40]!r}")
    return min(value, predict_timeout)

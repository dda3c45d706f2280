"""One Prometheus exposition out of several API processes' expositions.

Every API process counts what it answered; ``/metrics`` shows the sum. Samples with the same
name and labels are added (counters, histogram buckets, sums and counts, and the gauges the
API processes keep: requests in flight); the engine's gauges are reported by the main process
only, so adding leaves them as they are. Families keep the order in which they first appear.
"""

from __future__ import annotations


def _split(line: str) -> tuple[str, float] | None:
    key, _, value = line.rpartition(" ")
    if not key:
        return None
    try:
        return key, float(value)
    except ValueError:
        return None


def _number(value: float) -> str:
    if value == int(value) and abs(value) < 2**53:
        return f"{int(value)}.0"
    return repr(value)


def merge_expositions(texts: list[bytes]) -> bytes:
    """The sum of ``texts`` (Prometheus text format 0.0.4), family by family."""
    families: dict[str, tuple[list[str], dict[str, float]]] = {}
    for text in texts:
        family = ""
        for line in text.decode().splitlines():
            if not line:
                continue
            if line.startswith("#"):
                parts = line.split(" ", 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    family = parts[2]
                    comments, _ = families.setdefault(family, ([], {}))
                    if line not in comments:
                        comments.append(line)
                continue
            sample = _split(line)
            if sample is None:
                continue
            key, value = sample
            _, samples = families.setdefault(family, ([], {}))
            samples[key] = samples.get(key, 0.0) + value
    out: list[str] = []
    for comments, samples in families.values():
        out.extend(comments)
        out.extend(f"{key} {_number(value)}" for key, value in samples.items())
    return ("\n".join(out) + "\n").encode()

"""Each request's generated text, as JSON lines in prompt order (``--save-outputs``), and how two
such files compare (``--compare-outputs``): greedy decoding with and without speculation should
give the same text for the same prompt."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def prompt_digest(prompt: str) -> str:
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


def output_lines(prompts: list[str], kept: dict[int, tuple[str, str | None]], warmup: set[int]) -> list[dict]:
    """One record per prompt answered (``kept``: its text and error, by index), in prompt order:
    the index, the prompt's digest, whether it was a warm-up request, the text and any error."""
    lines = []
    for i in sorted(kept):
        text, error = kept[i]
        line: dict[str, Any] = {"index": i, "prompt_sha256": prompt_digest(prompts[i]), "warmup": i in warmup}
        line["text"] = text
        if error:
            line["error"] = error
        lines.append(line)
    return lines


def write_outputs(lines: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))


def read_outputs(path: Path) -> dict[int, dict]:
    records = {}
    for raw in Path(path).read_text().splitlines():
        if raw.strip():
            line = json.loads(raw)
            records[int(line["index"])] = line
    return records


def compare_outputs(a: dict[int, dict], b: dict[int, dict]) -> dict[str, Any]:
    """How many prompts both files answered without error have the same text. Prompts that differ
    between the files (another seed, salt or workload) are counted apart and not compared."""
    common = sorted(set(a) & set(b))
    same_prompt = [i for i in common if a[i].get("prompt_sha256") == b[i].get("prompt_sha256")]
    ok = [i for i in same_prompt if "error" not in a[i] and "error" not in b[i]]
    differing = [i for i in ok if a[i]["text"] != b[i]["text"]]
    return {
        "compared": len(ok),
        "identical": len(ok) - len(differing),
        "differing": differing,
        "other_prompt": len(common) - len(same_prompt),
        "errors": len(same_prompt) - len(ok),
        "only_in_one": len(set(a) ^ set(b)),
    }


def first_difference(x: str, y: str) -> int:
    """The first character at which two texts differ (the shorter one's length if one starts the other)."""
    for i, (p, q) in enumerate(zip(x, y)):
        if p != q:
            return i
    return min(len(x), len(y))


def describe_comparison(result: dict[str, Any], a: dict[int, dict], b: dict[int, dict]) -> str:
    lines = [f"identical greedy texts: {result['identical']}/{result['compared']}"]
    for key, what in (("other_prompt", "with another prompt"), ("errors", "failed"), ("only_in_one", "in one file")):
        if result[key]:
            lines.append(f"  not compared: {result[key]} {what}")
    for i in result["differing"][:5]:
        at = first_difference(a[i]["text"], b[i]["text"])
        lines.append(
            f"  prompt {i} differs from character {at}: {a[i]['text'][at:][:60]!r} / {b[i]['text'][at:][:60]!r}"
        )
    return "\n".join(lines)

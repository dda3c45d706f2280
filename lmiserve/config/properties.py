"""Reading Java-style ``.properties`` files such as ``serving.properties``.

Supported: ``key=value``, ``key: value`` and ``key value`` lines, ``#`` and ``!``
comments, backslash line continuation and the usual escapes (``\\n``, ``\\t``,
``\\uXXXX``, ``\\=``, ``\\:``).
"""

from __future__ import annotations

from pathlib import Path

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f"}


def _logical_lines(text: str):
    """Yield (line_number, logical_line), joining continued lines."""
    buf: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.lstrip() if buf else raw.strip()
        if not buf:
            start = number
            if not line or line[0] in "#!":
                continue
        else:
            line = line.rstrip()
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            buf.append(line[:-1])
            continue
        buf.append(line)
        yield start, "".join(buf)
        buf = []
    if buf:
        yield start, "".join(buf)


def _unescape(s: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            n = s[i + 1]
            if n == "u" and i + 6 <= len(s):
                try:
                    out.append(chr(int(s[i + 2 : i + 6], 16)))
                    i += 6
                    continue
                except ValueError:
                    pass
            out.append(_ESCAPES.get(n, n))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _split(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in "=: \t":
            break
        i += 1
    key = line[:i]
    rest = line[i:].lstrip(" \t")
    if rest[:1] in ("=", ":") and (i >= len(line) or line[i] in " \t" or line[i] in "=:"):
        rest = rest[1:].lstrip(" \t")
    return _unescape(key), _unescape(rest)


def parse_properties(text: str) -> dict[str, str]:
    """Parse properties text into an ordered ``{key: value}`` dict (last one wins)."""
    result: dict[str, str] = {}
    for _, line in _logical_lines(text):
        key, value = _split(line)
        if key:
            result[key] = value
    return result


def read_properties(path: str | Path) -> dict[str, str]:
    return parse_properties(Path(path).read_text(encoding="utf-8"))

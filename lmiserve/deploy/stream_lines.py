"""Whole lines out of a byte stream that arrives in arbitrary pieces.

A streaming endpoint answers jsonlines or SSE, but SageMaker cuts the response into ``PayloadPart``
events wherever it likes: inside a line, inside a JSON string, even inside a multi-byte UTF-8
character. ``LineAssembler`` keeps the bytes of the unfinished line and hands out each line once its
newline has arrived. It splits on the byte ``\\n``, which never occurs inside a multi-byte UTF-8
sequence, so a line is decoded only when it is whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


class LineAssembler:
    """Feed bytes in pieces; get back the lines they complete (without their ``\\n`` or ``\\r\\n``)."""

    def __init__(self, encoding: str = "utf-8") -> None:
        self._encoding = encoding
        self._pending = bytearray()

    def feed(self, data: bytes) -> list[str]:
        """Add ``data`` and return every line it completes, in order (empty lines included)."""
        if b"\n" not in data:
            self._pending += data
            return []
        self._pending += data
        *complete, rest = bytes(self._pending).split(b"\n")
        self._pending = bytearray(rest)
        return [self._decode(line) for line in complete]

    def close(self) -> list[str]:
        """End of the stream: the unterminated last line, if there is one."""
        if not self._pending:
            return []
        line, self._pending = bytes(self._pending), bytearray()
        return [self._decode(line)]

    @property
    def pending(self) -> int:
        """Bytes held back because their line is not finished."""
        return len(self._pending)

    def _decode(self, line: bytes) -> str:
        if line.endswith(b"\r"):
            line = line[:-1]
        return line.decode(self._encoding, errors="replace")


def iter_lines(parts: Iterable[bytes], encoding: str = "utf-8") -> Iterator[str]:
    """Each line of the stream made of ``parts``, as soon as the part that ends it arrives."""
    assembler = LineAssembler(encoding)
    for part in parts:
        yield from assembler.feed(part)
    yield from assembler.close()

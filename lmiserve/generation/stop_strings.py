"""Cutting generated text at stop strings without ever streaming text that is later cut.

The stop strings of a request are compiled once into an Aho-Corasick automaton
(:class:`StopAutomaton`), shared by every sequence of the request. Each sequence's
:class:`StopStringMatcher` keeps one state in it, so the work per generated character is
constant however many stop strings a request brings (MindIE allows 1,024), and the memory is
one trie node per character of the stop strings.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence


class StopAutomaton:
    """An Aho-Corasick automaton over a request's stop strings.

    Node 0 is the root. For each node: its children, its failure link, its depth (the length of
    the prefix it spells) and the longest stop string that ends there (its length and its
    position in the request's list, or 0 and -1).
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self.children: list[dict[str, int]] = [{}]
        self.fail = [0]
        self.depth = [0]
        self.match_len = [0]
        self.match_index = [-1]
        for index, stop in enumerate(self.stops):
            node = 0
            for ch in stop:
                nxt = self.children[node].get(ch)
                if nxt is None:
                    nxt = len(self.children)
                    self.children.append({})
                    self.fail.append(0)
                    self.depth.append(self.depth[node] + 1)
                    self.match_len.append(0)
                    self.match_index.append(-1)
                    self.children[node][ch] = nxt
                node = nxt
            if self.match_index[node] == -1:  # the same string twice: the first one names it
                self.match_len[node], self.match_index[node] = len(stop), index
        queue = deque(self.children[0].values())
        while queue:
            node = queue.popleft()
            for ch, child in self.children[node].items():
                self.fail[child] = self.step(self.fail[node], ch)
                if self.match_index[child] == -1:  # inherit the longest stop that is a suffix
                    f = self.fail[child]
                    self.match_len[child], self.match_index[child] = self.match_len[f], self.match_index[f]
                queue.append(child)

    def step(self, node: int, ch: str) -> int:
        while True:
            nxt = self.children[node].get(ch)
            if nxt is not None:
                return nxt
            if node == 0:
                return 0
            node = self.fail[node]

    def __bool__(self) -> bool:
        return bool(self.stops)


class StopStringMatcher:
    """Feed text deltas; get back the text that is safe to emit.

    Text that could be the start of a stop string is held back until it either completes
    the stop string (generation ends, the stop string is dropped or kept per
    ``include_stop``) or can no longer match (it is released). When one delta completes
    several stop strings, the one that starts first wins (then the one listed first).
    """

    def __init__(self, stops: Sequence[str] | StopAutomaton, include_stop: bool = False):
        self.automaton = stops if isinstance(stops, StopAutomaton) else StopAutomaton(stops)
        self.stops = self.automaton.stops
        self.include_stop = include_stop
        self._state = 0
        self._pending = ""
        self.matched: str | None = None

    def feed(self, delta: str) -> str:
        if self.matched is not None:
            return ""
        a = self.automaton
        if not a:
            return delta
        text = self._pending + delta
        base = len(self._pending)
        state = self._state
        best: tuple[int, int, int] | None = None  # (start, list index, end)
        for i, ch in enumerate(delta):
            state = a.step(state, ch)
            length = a.match_len[state]
            if length:
                end = base + i + 1
                key = (end - length, a.match_index[state], end)
                if best is None or key < best:
                    best = key
            if best is not None and base + i + 1 - a.longest >= best[0]:
                break  # no stop string can start before the match found
        if best is not None:
            start, index, end = best
            self.matched = a.stops[index]
            self._pending = ""
            return text[:end] if self.include_stop else text[:start]
        self._state = state
        hold = a.depth[state]
        self._pending = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]

    def flush(self) -> str:
        """Release held-back text when generation ends for another reason."""
        out, self._pending = self._pending, ""
        self._state = 0
        return out

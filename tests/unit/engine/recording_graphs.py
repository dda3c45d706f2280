"""A graph backend for the CPU: it "captures" by remembering the forward call and "replays" by
running it again on the same buffers, so the step graphs' bucket, padding and buffer logic
(lmiserve.rolling_batch.runner.graphs, lmiserve.rolling_batch.runner.mixed_graphs) is tested without a GPU.
Ops that read the host copies of a step's lengths see the replayed step's: the graphs keep them
up to date for this backend (a device graph never reads them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class RecordingBackend:
    """Remembers each captured call and runs it again on replay, writing into the captured
    output tensor as a device graph would. ``log`` records what happened."""

    name = "recording"

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
        fn()
        out = fn()
        self.log.append(("capture", out.shape[0]))
        return (fn, out), out

    def replay(self, graph: Any) -> None:
        fn, out = graph
        out.copy_(fn())
        self.log.append(("replay", out.shape[0]))

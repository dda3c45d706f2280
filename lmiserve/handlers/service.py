"""The default handlers' entry point, DJL's way: a module-level ``handle(inputs)``.

DJL calls ``handle`` first with an empty :class:`Input` carrying the model's properties (the
handler builds its service from them), then with each request or batch; an empty input after
that (a warm-up ping) answers nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from .inputs import Input
from .outputs import Output


class Service(Protocol):
    def handle(self, inputs: Input) -> Output: ...


def service_handle(build: Callable[[dict[str, Any]], Service]) -> Callable[[Input], Output | None]:
    """A ``handle`` function whose first call builds the service with ``build(properties)``."""
    built: list[Service] = []

    def handle(inputs: Input) -> Output | None:
        if not built:
            built.append(build(inputs.get_properties()))
            return None
        if inputs.is_empty():
            return None
        return built[0].handle(inputs)

    return handle

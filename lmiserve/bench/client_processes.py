"""Running the load's client shares in separate processes, so that one Python client's CPU does
not bound what it can offer."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

Job = TypeVar("Job")
Result = TypeVar("Result")


def in_processes(run: Callable[[Job], Result], jobs: Sequence[Job]) -> list[Result]:
    """``run`` over ``jobs``: here for one, else one spawned process each (``run`` must be a
    module-level function, as spawn pickles it by name)."""
    if len(jobs) == 1:
        return [run(jobs[0])]
    with ProcessPoolExecutor(len(jobs), mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(run, jobs))

import asyncio
import time

import pytest

from lmiserve.serving.job_queue import JobQueue, QueueFull


def run(coro):
    return asyncio.run(coro)


def test_batch_takes_what_is_waiting_up_to_max_size():
    async def main():
        q = JobQueue(10)
        for i in range(6):
            q.put_nowait(i)
        return await q.get_batch(4, 0.0), await q.get_batch(4, 0.0)

    assert run(main()) == ([0, 1, 2, 3], [4, 5])


def test_batch_waits_for_late_arrivals_within_the_delay():
    async def main():
        q = JobQueue(10)
        q.put_nowait("a")

        async def late():
            await asyncio.sleep(0.05)
            q.put_nowait("b")
            await asyncio.sleep(0.05)
            q.put_nowait("c")

        task = asyncio.create_task(late())
        batch = await q.get_batch(8, 0.5)
        await task
        return batch

    started = time.monotonic()
    assert run(main()) == ["a", "b", "c"]
    assert time.monotonic() - started >= 0.45  # it waited for more until the delay ran out


def test_full_batch_returns_without_waiting_for_the_delay():
    async def main():
        q = JobQueue(10)
        for i in range(3):
            q.put_nowait(i)
        started = time.monotonic()
        batch = await q.get_batch(3, 5.0)
        return batch, time.monotonic() - started

    batch, waited = run(main())
    assert batch == [0, 1, 2] and waited < 1.0


def test_idle_timeout_returns_empty():
    async def main():
        return await JobQueue(1).get_batch(4, 0.1, idle_timeout=0.05)

    assert run(main()) == []


def test_queue_limit_and_put_front():
    async def main():
        q = JobQueue(2)
        q.put_nowait(1)
        q.put_nowait(2)
        with pytest.raises(QueueFull):
            q.put_nowait(3)
        taken = await q.get_batch(2, 0)
        q.put_front(taken)
        return await q.get_batch(1, 0), len(q)

    assert run(main()) == ([1], 1)

"""option.rolling_batch=vllm: generation by an installed vLLM behind lmiserve's engine-client interface.

:class:`VllmEngineClient` runs vLLM's async engine in the API process (vLLM runs its engine core
in processes of its own) and turns its outputs into the same :class:`~lmiserve.wire.SeqDelta`
stream as lmiserve's engine, so tokenization, the output processor, every protocol and the
metrics work unchanged. vLLM is imported only when this backend starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import wire
from ...config import Settings
from ...errors import WorkerDied
from ..process.client import EngineClient, EngineStartError, RequestStream
from . import beam_search
from .cpu import tune_for_cpu
from .engine_args import engine_kwargs, taken
from .engine_info import NOT_INSTALLED, engine_info, one_line, vllm_installed
from .params import (
    SequenceState,
    VllmApi,
    is_engine_dead,
    is_validation_error,
    sampling_params,
)
from .processes import child_pids, reap, shut_down

log = logging.getLogger("lmiserve.vllm")

WATCH_INTERVAL_S = 1.0
SHUTDOWN_TIMEOUT_S = 30.0
REAP_GRACE_S = 5.0


@dataclass
class Running:
    task: asyncio.Task[None]
    vllm_id: str


class VllmEngineClient(EngineClient):
    """vLLM's async engine behind lmiserve's engine-client interface."""

    pid = None  # vLLM's engine runs in processes vLLM manages

    def __init__(self, settings: Settings, model_path: Path):
        super().__init__()
        self.settings = settings
        self.model_path = model_path
        self.engine: Any = None
        self.api: VllmApi | None = None
        self._tasks: dict[str, dict[int, Running]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._watcher: asyncio.Task[None] | None = None
        self._dying = False
        self._stopping = False
        self.cpu_tuning = ""
        self._children_before: frozenset[int] | None = None
        self._totals = {"prompt_tokens": 0, "generated_tokens": 0, "prefix_cache_hit_tokens": 0}
        self.eos_token_ids = beam_search.eos_token_ids(model_path)

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self, timeout: float) -> None:
        if not vllm_installed():
            raise EngineStartError(NOT_INSTALLED)
        try:
            await self._start(timeout)
        except BaseException:  # failed, timed out or cancelled: none of vLLM's processes stays
            if self._children_before is not None:
                reap(self._children_before, REAP_GRACE_S)
            raise
        self.alive = True
        self._refresh_stats()
        self._watcher = asyncio.create_task(self._watch(), name="vllm-watch")

    async def _start(self, timeout: float) -> None:
        try:
            self.api = VllmApi.load()
            from vllm import AsyncEngineArgs, AsyncLLMEngine  # type: ignore[import-not-found]

            wanted = engine_kwargs(self.settings, self.model_path, AsyncEngineArgs)
            self.cpu_tuning = tune_for_cpu(self.settings, wanted)
            kwargs, ignored = taken(wanted, AsyncEngineArgs)
            if ignored:
                log.debug("vLLM %s does not take %s; left to its defaults", self.api.version, ", ".join(ignored))
            args = AsyncEngineArgs(**kwargs)
            log.info("starting vLLM %s: %s", self.api.version, kwargs)
            self._children_before = child_pids()
            self.engine = await asyncio.wait_for(self._build(AsyncLLMEngine, args), timeout)
            self.info = engine_info(self.engine, self.api, wanted)
            if self.cpu_tuning:
                self.info["cpu_tuning"] = self.cpu_tuning
        except TimeoutError:
            raise EngineStartError(f"vLLM did not start within {timeout:.0f} s (model_loading_timeout)") from None
        except EngineStartError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of vLLM to start is a start failure
            raise EngineStartError(f"vLLM could not start: {type(exc).__name__}: {one_line(exc)}") from exc

    @staticmethod
    async def _build(engine_cls: Any, args: Any) -> Any:
        """The engine, built on a worker thread so the server keeps answering while the model
        loads; on the event loop where vLLM insists on the main thread."""
        try:
            return await asyncio.to_thread(engine_cls.from_engine_args, args)
        except ValueError as exc:
            if "main thread" not in str(exc):
                raise
            return engine_cls.from_engine_args(args)

    async def stop(self, grace: float = 10.0) -> None:
        self._stopping = True
        self.alive = False
        if self._watcher is not None:
            self._watcher.cancel()
        error = WorkerDied("the server is stopping")
        for stream in self.streams.values():
            stream.fail(error)
        self.streams.clear()
        await self._cancel_all()
        await self._shutdown(grace)

    async def _shutdown(self, timeout: float) -> None:
        engine, self.engine = self.engine, None
        await shut_down(engine, self._children_before, timeout, REAP_GRACE_S)

    async def _watch(self) -> None:
        """Notice an engine that died while no request was running."""
        while self.alive and not self._dying:
            await asyncio.sleep(WATCH_INTERVAL_S)
            engine = self.engine
            if engine is not None and getattr(engine, "errored", False):
                await self._die(getattr(engine, "dead_error", None))
                return
            self._refresh_stats()  # vLLM's own count moves after aborts

    async def _die(self, cause: BaseException | str | None) -> None:
        """vLLM's engine is dead: fail every request, release it, and report the exit (the model
        then starts a new engine)."""
        if self._dying or self._stopping:
            return
        self._dying = True
        detail = f": {type(cause).__name__}: {cause}" if isinstance(cause, BaseException) else ""
        reason = f"the vLLM engine died{detail}"
        log.error("%s", reason)
        error = WorkerDied(f"the vLLM engine died while handling this request{detail}")
        for stream in self.streams.values():
            stream.fail(error)
        self.streams.clear()
        await self._cancel_all()
        await self._shutdown(SHUTDOWN_TIMEOUT_S)
        self._gone(reason)

    async def _cancel_all(self) -> None:
        tasks = [item.task for group in self._tasks.values() for item in group.values()]
        self._tasks.clear()
        current = asyncio.current_task()
        for task in tasks:
            if task is not current:
                task.cancel()
        await asyncio.gather(*(t for t in tasks if t is not current), return_exceptions=True)

    # --- requests -----------------------------------------------------------------------------
    def submit(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: wire.SamplingParams,
        adapter: str = "",
        **_: object,
    ) -> RequestStream:
        """``adapter`` is always empty here: the model refuses adapters on the vLLM backend. A
        replay starts again from the prompt (this client does not :attr:`resumes`); vLLM keeps no
        deadline."""
        if not self.alive or self._dying or self.engine is None or self.api is None:
            raise WorkerDied("the engine is not running")
        count = max(params.best_of, params.n, 1)
        stream = RequestStream(request_id, count)
        self.streams[request_id] = stream
        if params.num_beams > 1:
            task = asyncio.create_task(self._beam_search(request_id, prompt_ids, params), name=f"vllm-{request_id}")
            self._tasks.setdefault(request_id, {})[0] = Running(task, request_id)
            return stream
        try:
            per_sequence = [sampling_params(params, self.api, index) for index in range(count)]
        except Exception as exc:  # noqa: BLE001 - refused by lmiserve's checks or vLLM's
            self._deliver(
                wire.SeqDelta(request_id=request_id, finish_reason="error", error=str(exc), error_kind="validation")
            )
            return stream
        cumulative = self.api.delta_kind is None
        running = self._tasks.setdefault(request_id, {})
        for index, sp in enumerate(per_sequence):
            state = SequenceState(request_id, index, list(prompt_ids), params, cumulative=cumulative)
            vllm_id = request_id if count == 1 else f"{request_id}#{index}"
            task = asyncio.create_task(self._generate(state, sp, vllm_id), name=f"vllm-{vllm_id}")
            running[index] = Running(task, vllm_id)
        self._refresh_stats()
        return stream

    def _deliver(self, delta: wire.SeqDelta) -> None:
        self._totals["prompt_tokens"] += delta.num_prompt_tokens
        self._totals["prefix_cache_hit_tokens"] += delta.num_cached_tokens
        self._totals["generated_tokens"] += len(delta.token_ids)
        if delta.finish_reason is not None:  # else the 1 s watcher refreshes them
            self._refresh_stats()
        self._on_step(wire.EngineStep(deltas=[delta]))

    def _refresh_stats(self) -> None:
        """The statistics lmiserve's metrics read: the sequences this server has in vLLM (vLLM's
        own waiting queue and KV blocks are inside them) and the tokens it reported."""
        if not self.alive:  # an engine that exited has had its counts folded into the model's
            return
        self.stats = wire.EngineStats(
            running=self._in_vllm(),
            waiting=0,
            kv_blocks_used=0,
            kv_blocks_total=int(self.info.get("kv_blocks", 0) or 0),
            preemptions=0,
            step_seconds=0.0,
            **self._totals,
        )

    def _in_vllm(self) -> int:
        """Sequences vLLM has not finished, those on their way to it too (an aborted one: until dropped)."""
        ours = sum(len(group) for group in self._tasks.values())
        processor = getattr(self.engine, "output_processor", None)
        count = getattr(processor, "get_num_unfinished_requests", None)
        if count is not None:
            with contextlib.suppress(Exception):
                return max(int(count()), ours)
        return ours

    async def _generate(self, state: SequenceState, sp: Any, vllm_id: str) -> None:
        failed = False
        try:
            outputs = self.engine.generate({"prompt_token_ids": state.prompt_ids}, sp, vllm_id)
            async with contextlib.aclosing(outputs):
                async for output in outputs:
                    delta = state.delta(output)
                    if delta is None:
                        continue
                    if delta.token_ids:  # MindIE's per-token batch size: what vLLM holds now
                        delta.batch_size = max(1, self._in_vllm())
                        delta.queue_us = state.queue_us(output)
                    self._deliver(delta)
                    if delta.error is not None:
                        failed = True
                        break
            if not state.finished:  # the outputs ended without saying why
                self._deliver(wire.SeqDelta(request_id=state.request_id, index=state.index, finish_reason="abort"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - one request fails, never the server
            failed = True
            if self._failed(state.request_id, state.index, exc):
                return
        finally:
            self._forget(state.request_id, state.index)
        if failed:  # an error ends every sequence of the request
            self._abort_tasks(state.request_id, None)

    async def _beam_search(self, request_id: str, prompt_ids: list[int], params: wire.SamplingParams) -> None:
        """A beam-search request (:mod:`.beam_search`): its hypotheses once the search ends."""
        try:
            one = functools.partial(beam_search.one_token, self.engine, self.api)
            max_len = int(self.info["max_model_len"])  # always said (engine_info)
            for delta in await beam_search.search(one, request_id, prompt_ids, params, self.eos_token_ids, max_len):
                delta.batch_size = max(1, self._in_vllm())
                self._deliver(delta)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - one request fails, never the server
            self._failed(request_id, 0, exc)
        finally:
            self._forget(request_id, 0)

    def _failed(self, request_id: str, index: int, exc: Exception) -> bool:
        """A request vLLM failed; True where the engine died (which fails them all)."""
        if is_engine_dead(exc) or getattr(self.engine, "errored", False):
            self._spawn(self._die(exc))
            return True
        kind = "validation" if is_validation_error(exc) else ""
        if not kind:
            log.error("vLLM request %s failed: %s: %s", request_id, type(exc).__name__, exc)
        error = str(exc) or type(exc).__name__
        self._deliver(
            wire.SeqDelta(request_id=request_id, index=index, finish_reason="error", error=error, error_kind=kind)
        )
        return False

    def _forget(self, request_id: str, index: int) -> None:
        running = self._tasks.get(request_id)
        if running is not None and index in running and running[index].task is asyncio.current_task():
            del running[index]
            if not running:
                del self._tasks[request_id]
            self._refresh_stats()

    def abort(self, request_id: str, index: int | None = None) -> None:
        stream = self.streams.get(request_id)
        if index is None:
            self.streams.pop(request_id, None)
        aborted = self._abort_tasks(request_id, index)
        if index is not None and index in aborted and stream is not None and not stream.done:
            # this sequence ends here; the request's other sequences go on
            self._deliver(wire.SeqDelta(request_id=request_id, index=index, finish_reason="abort"))

    def _abort_tasks(self, request_id: str, index: int | None) -> list[int]:
        running = self._tasks.get(request_id, {})
        chosen = [i for i in running if index is None or i == index]
        for i in chosen:
            item = running.pop(i)
            item.task.cancel()  # vLLM also aborts a request whose output stream is closed
            self._abort_in_vllm(item.vllm_id)
        if not running:
            self._tasks.pop(request_id, None)
        self._refresh_stats()
        return chosen

    def _abort_in_vllm(self, vllm_id: str) -> None:
        engine = self.engine
        if engine is None:
            return
        try:
            result = engine.abort(vllm_id)
        except Exception as exc:  # noqa: BLE001 - aborting a request vLLM no longer knows
            log.debug("vLLM abort of %s: %s", vllm_id, exc)
            return
        if inspect.isawaitable(result):
            self._spawn(result)

    def _spawn(self, awaitable: Any) -> None:
        task = asyncio.ensure_future(awaitable)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("vLLM background call failed: %s", task.exception())

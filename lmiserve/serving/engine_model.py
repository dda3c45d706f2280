"""A model served by the continuous-batching engine: tokenizer here, engine in its own process."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import wire
from ..config import Settings
from ..errors import ModelNotReady, Overloaded, WorkerDied
from ..generation.admission import Admission, Admitted
from ..generation.output_processor import OutputProcessor, detokenize_step
from ..generation.request import GenerationRequest
from ..generation.tokenizer import load_tokenizer
from ..model_store import resolve_model
from ..rolling_batch.models.architectures import spec_from_config
from ..rolling_batch.models.spec import read_config
from ..rolling_batch.process.client import EngineClient, EngineStartError, ProcessEngineClient
from ..rolling_batch.process.standby import Standby
from ..rolling_batch.runner.sharding import check_shardable
from . import heap
from .adapters import ModelAdapters
from .admission_control import AdmissionControl, EngineLoad
from .engine_launch import engine_client, engine_env
from .handler_model import ModelLoadError
from .model_chat import chat_prompt, chosen_parser, leave_out_thinking
from .model_media import ModelMedia
from .replay import EngineWaiters, ReplayingStream, Replays
from .snapshot import EngineCounters, ModelSnapshot, engine_snapshot
from .speculative_stats import configured, describe_speculative

log = logging.getLogger("lmiserve.model")

MAX_RESTARTS = 3


class EngineModel:
    kind = "engine"

    def __init__(self, settings: Settings, backend: str = "lmi"):
        self.settings = settings
        self.name = settings.model_name
        self.backend = backend
        self.path: Path | None = None
        self.tokenizer: Any = None
        self.client: EngineClient | None = None
        self.failure: str | None = None
        self.max_model_len = 0
        self.vocab_size: int | None = None
        """From the model's config (None for vLLM, which checks prompts itself)."""
        self.architecture = ""
        self.standby: Standby | None = None
        """The next engine process, waiting (option.engine_standby), once the first has started."""
        self._ever_ready = False
        self._closing = False
        self._restarts = 0
        self._ids = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()
        self._processors: weakref.WeakValueDictionary[str, OutputProcessor] = weakref.WeakValueDictionary()
        """The output processor of each request in flight (gone with its request)."""
        self.counters = EngineCounters()
        self.custom_formatters: Any = None
        """The model's custom input/output formatters (lmiserve.handlers.custom_formatters), if any."""
        self.adapters = ModelAdapters(settings, self.name, backend)
        """The model's LoRA adapters (option.enable_lora)."""
        self.media = ModelMedia(self.name, settings, backend)
        self.on_change: Callable[[], None] = lambda: None
        """Called when the engine starts or exits or an adapter changes (the registry's version)."""
        self.adapters.on_change = lambda: self.on_change()
        self.id_prefix = ""
        """Before each request id: unique across the API processes that share the engine."""
        self.registration: dict[str, Any] | None = None  # how the management API registered it
        self.generation = 0
        """How many engines have started: the running one's number."""
        self.replays = Replays()
        self.engine_waiters = EngineWaiters()
        self.first_load_timeout: float | None = None  # a download took part of model_loading_timeout

    @functools.cached_property
    def admission(self) -> AdmissionControl:
        """This process's requests in flight, and whether a new one is admitted
        (:mod:`lmiserve.serving.admission_control`)."""
        engine, model = self.settings.engine, self.settings.model
        limit = engine.max_rolling_batch_size + model.job_queue_size
        return AdmissionControl(
            engine.max_rolling_batch_size, limit, model.predictive_admission, model.max_first_token_wait
        )

    # --- state -------------------------------------------------------------------------
    @property
    def status(self) -> str:
        if self.failure is not None:
            return "Failed"
        if self.client is not None and self.client.alive:
            return "Healthy"
        return "Unhealthy" if self._ever_ready else "Loading"

    def describe(self) -> dict[str, Any]:
        stats = self.client.stats if self.client else None
        info = dict(self.client.info) if self.client else {}
        speculative = describe_speculative(configured(self.settings), self.counters.totals(stats), info)
        return {
            "modelName": self.name,
            "status": self.status,
            "backend": self.backend,
            "enginePid": getattr(self.client, "pid", None),
            "standbyPid": self.standby.pid if self.standby is not None else None,
            "engine": info,
            "inputs": self.media.describe(),
            "stats": None if stats is None else {f: getattr(stats, f) for f in stats.__struct_fields__},
            **({"speculative": speculative} if speculative is not None else {}),
        }

    def metrics_snapshot(self) -> ModelSnapshot:
        snapshot = engine_snapshot(self.client, self.counters)
        snapshot.speculative = configured(self.settings) is not None
        if snapshot.counters is not None:
            snapshot.counters.update(self.replays.counts())
        return snapshot

    # --- lifecycle ----------------------------------------------------------------------
    async def _load_files(self) -> None:
        cfg = self.settings.model

        def load() -> tuple[Path, Any]:
            path = resolve_model(cfg.model_id, self.settings.model_dir)
            if self.backend != "vllm":  # refuse early, in one line, what the engine would refuse
                spec = spec_from_config(read_config(path))
                self.vocab_size, self.architecture = spec.vocab_size, spec.architecture
                if cfg.tensor_parallel_degree != "max":
                    check_shardable(spec, cfg.tensor_parallel_degree)
            return path, load_tokenizer(path, cfg.trust_remote_code)

        self.path, self.tokenizer = await asyncio.to_thread(load)
        if self.backend != "vllm":
            self.media.load(self.path, self.tokenizer)

    async def _start_engine(self) -> None:
        assert self.path is not None
        client = engine_client(self.settings, self.path, self.backend)
        timeout = self.first_load_timeout or float(self.settings.model.model_loading_timeout)
        if isinstance(client, ProcessEngineClient):
            await client.start(timeout, self.standby.take() if self.standby is not None else None)
        else:
            await client.start(timeout=timeout)
        client.on_exit, client.on_deltas, self.first_load_timeout = self._on_exit, self._decode_step, None
        if self._ever_ready:  # a restarted engine: the adapters registered so far, again
            await self.adapters.replay(client)
        else:  # adapters/<name>/ next to the model
            await self.adapters.register_found(client, self.settings.model_dir, self.path)
        self.client = client
        self.max_model_len = int(client.info["max_model_len"])
        self._ever_ready = True
        self.generation += 1
        self.engine_waiters.wake()
        self.on_change()
        self._refill_standby(client)

    def _refill_standby(self, client: EngineClient) -> None:
        """Start the next engine process ahead of need (option.engine_standby)."""
        wanted = self.settings.engine.engine_standby
        if self._closing or not isinstance(client, ProcessEngineClient) or wanted == "false":
            return
        if wanted == "auto" and client.info.get("device") != "cpu":
            return
        if self.standby is None:
            self.standby = Standby(self.architecture, engine_env(self.settings))
        self.standby.refill()

    async def start(self) -> None:
        try:
            await self._load_files()
            await self._start_engine()
        except (EngineStartError, Exception) as exc:
            self.failure = str(exc)
            raise ModelLoadError(self.failure) from None
        log.info("model %s: engine ready (pid %s): %s", self.name, getattr(self.client, "pid", None), self.client.info)
        if self.backend == "vllm":  # this process then holds vLLM's front end (see heap.settle)
            heap.settle()

    def _on_exit(self, client: EngineClient, reason: str) -> None:
        # a restarted engine counts from zero: keep what this one counted, and forget its state
        self.counters.engine_exited(client.stats)
        client.stats = None
        self.on_change()
        if self._closing:
            return
        task = asyncio.create_task(self._restart())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _restart(self) -> None:
        while not self._closing:
            self._restarts += 1
            log.warning("model %s: restarting the engine (attempt %d)", self.name, self._restarts)
            try:
                await self._start_engine()
                self._restarts = 0
                return
            except EngineStartError as exc:
                if self._restarts >= MAX_RESTARTS:
                    self.failure = str(exc)
                    log.error("model %s: the engine cannot be restarted: %s", self.name, exc)
                    self.engine_waiters.wake()
                    return
                await asyncio.sleep(min(30.0, 2.0**self._restarts))

    async def stop(self) -> None:
        self._closing = True
        self.engine_waiters.wake()
        for task in list(self._tasks):
            task.cancel()
        if self.standby is not None:
            await self.standby.close()
        if self.client is not None:
            await self.client.stop()

    # --- engines for replays -------------------------------------------------------------
    replays_here = True
    """Whether requests can outlive an engine crash here (:mod:`.replay`): in the process that
    restarts the engine."""

    @property
    def max_replays(self) -> int:
        return self.settings.engine.max_replays

    @property
    def replay_enabled(self) -> bool:
        # our engine is back within seconds; vLLM takes minutes, which requests should not wait for
        return self.replays_here and self.max_replays > 0 and self.backend != "vllm"

    @property
    def restarting(self) -> bool:
        """The engine died and another is on its way (requests wait for it rather than fail)."""
        alive = self.client is not None and self.client.alive
        return self.replay_enabled and self._ever_ready and not alive and not self._closing and self.failure is None

    async def engine_after(self, generation: int) -> tuple[EngineClient, int]:
        """A live engine client newer than ``generation`` and its generation, now or once the engine
        has restarted; :class:`WorkerDied` when none will come."""
        while True:
            client = self.client
            if client is not None and client.alive and self.generation > generation:
                return client, self.generation
            if not self.restarting and not (client is not None and client.alive):
                raise WorkerDied(self._no_engine())
            await self.engine_waiters.wait()

    def _no_engine(self) -> str:
        if self.failure is not None:
            return f"model {self.name} failed: {self.failure.splitlines()[0]}"
        return f"model {self.name} is stopping" if self._closing else f"model {self.name} has no engine"

    # --- generation ---------------------------------------------------------------------
    def admit(self, request: GenerationRequest) -> Admitted:
        """``request`` checked against this model and tokenized (:mod:`lmiserve.generation.admission`)."""
        admission = Admission.for_model(self.settings.engine, self.max_model_len, self.vocab_size, self.media.vision)
        return admission.admit(request, self.tokenizer)

    chat_prompt = chat_prompt
    reasoning_parser = property(chosen_parser)

    def new_request_id(self) -> str:
        return f"{self.name}-{self.id_prefix}{next(self._ids)}"

    def submit(
        self, request: GenerationRequest, budget: float | None = None, tenant: str | None = None
    ) -> tuple[str, OutputProcessor, Any]:
        """Validate, tokenize and hand to the engine (or, while the engine restarts, to the one
        coming); errors raise before anything is sent. ``budget``: the seconds the request may
        take (its deadline); ``tenant``: who sent it, where requests are shared fairly among
        tenants (None: not)."""
        if self.failure is not None:
            raise ModelNotReady(f"model {self.name} failed: {self.failure.splitlines()[0]}")
        client = self.client
        alive = client is not None and client.alive
        if not alive and not self.restarting:
            raise ModelNotReady(f"model {self.name} is not ready")
        adapter = self.adapters.check_request(request.adapter)
        leave_out_thinking(self, request)
        admitted = self.admit(request)
        params = admitted.params
        width = max(params.n, params.best_of, params.num_beams, 1)
        if alive:
            self.admission.prune(client.streams)  # type: ignore[union-attr]
        decision = self.admission.decide(
            len(admitted.prompt_ids),
            params.max_new_tokens,
            budget,
            EngineLoad.of(client.stats if alive else None),  # type: ignore[union-attr]
            self._in_flight(client) if alive else self.engine_waiters.count,  # type: ignore[arg-type]
            width,
            tenant,
        )
        if not decision.admit:
            raise Overloaded(
                f"model {self.name}: {decision.detail}; retry later",
                retry_after=decision.retry_after,
                reason=decision.reason,
            )
        request_id = self.new_request_id()
        processor = OutputProcessor(self.tokenizer, request_id, admitted.request, list(admitted.prompt_ids))
        prompt_ids = list(admitted.prompt_ids)
        deadline = time.monotonic() + budget if budget else 0.0
        if self.replay_enabled:
            stream: Any = ReplayingStream(self, request_id, prompt_ids, params, adapter, deadline, admitted.images)
            if alive:
                with contextlib.suppress(WorkerDied):  # dying as we speak: the request waits for the next
                    stream.hand_to(client, self.generation)
        else:
            stream = client.submit(request_id, prompt_ids, params, adapter, deadline=deadline, images=admitted.images)  # type: ignore[union-attr]
        self._processors[request_id] = processor
        self.admission.admitted(
            request_id, len(admitted.prompt_ids), params.max_new_tokens, width, tenant, deadline or None
        )
        return request_id, processor, stream

    def _in_flight(self, client: EngineClient) -> int:
        """This process's requests on the engine; where other API processes share the engine, what
        the engine last reported (running and waiting) when that is more."""
        own = len(client.streams)
        shared = self.id_prefix or getattr(getattr(client, "init", None), "listen_path", "")
        stats = client.stats
        return max(own, stats.running + stats.waiting) if shared and stats is not None else own

    def _decode_step(self, deltas: list[wire.SeqDelta]) -> None:
        """One engine step's text, decoded for all its requests at once."""
        for d in deltas:
            if d.token_ids:
                self.admission.progressed(d.request_id, len(d.token_ids))
        get = self._processors.get
        pairs = [(p, d) for d in deltas if d.token_ids and (p := get(d.request_id)) is not None]
        if pairs:
            detokenize_step(pairs)

    def abort(self, request_id: str, index: int | None = None) -> None:
        if self.client is not None:
            self.client.abort(request_id, index)

"""A model served by the continuous-batching engine: tokenizer here, engine in its own process."""

from __future__ import annotations

import asyncio
import itertools
import logging
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import wire
from ..child import child_env
from ..config import Settings
from ..errors import ModelNotReady, Overloaded, ValidationFailed
from ..generation.admission import Admission, Admitted
from ..generation.output_processor import OutputProcessor, detokenize_step
from ..generation.request import GenerationRequest
from ..generation.tokenizer import load_tokenizer
from ..model_store import resolve_model
from ..rolling_batch.client import EngineClient, EngineStartError, ProcessEngineClient
from ..rolling_batch.engine_config import engine_options
from ..rolling_batch.models.spec import read_config, spec_from_config
from ..rolling_batch.sharding import check_shardable
from ..rolling_batch.standby import Standby
from . import engine_sockets, heap
from .adapters import ModelAdapters
from .handler_model import ModelLoadError
from .snapshot import EngineCounters, ModelSnapshot, engine_snapshot

log = logging.getLogger("lmiserve.model")

MAX_RESTARTS = 3


def engine_env(settings: Settings) -> dict[str, str]:
    """The engine process's environment: offline, and the NPU runtime's settings when it may use one."""
    env = child_env()
    # the KV pool and activations of changing shapes fragment the NPU caching allocator less this way
    env.setdefault("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True")
    ids = settings.engine.npu_device_ids
    if ids is not None:
        env["ASCEND_RT_VISIBLE_DEVICES"] = ",".join(i.strip() for i in ids.split(","))
    return env


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
        """The engine process waiting to be the next engine (option.engine_standby), once the
        first engine has started."""
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
        self.on_change: Callable[[], None] = lambda: None
        """Called when the engine starts or exits and when an adapter changes (the registry's
        version counts it: API processes beside this one attach again)."""
        self.adapters.on_change = lambda: self.on_change()
        self.id_prefix = ""
        """Before each request id: unique across the API processes that share the engine."""
        self.registration: dict[str, Any] | None = None
        """How the management API registered the model (url and parameters), else None."""

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
        return {
            "modelName": self.name,
            "status": self.status,
            "backend": self.backend,
            "enginePid": getattr(self.client, "pid", None),
            "standbyPid": self.standby.pid if self.standby is not None else None,
            "engine": dict(self.client.info) if self.client else {},
            "stats": None if stats is None else {f: getattr(stats, f) for f in stats.__struct_fields__},
        }

    def metrics_snapshot(self) -> ModelSnapshot:
        return engine_snapshot(self.client, self.counters)

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

    def _make_client(self) -> EngineClient:
        """The engine client of this model's backend: our engine in a child process, or vLLM."""
        assert self.path is not None
        if self.backend == "vllm":
            from ..rolling_batch.vllm.adapter import VllmEngineClient

            return VllmEngineClient(self.settings, self.path)
        init = wire.InitEngine(
            model_name=self.name,
            model_path=str(self.path),
            options=engine_options(self.settings.model, self.settings.engine),
            log_level=self.settings.server.log_level,
            listen_path=engine_sockets.next_path(),
        )
        heartbeat = float(self.settings.engine.engine_heartbeat_timeout)
        return ProcessEngineClient(init, env=engine_env(self.settings), heartbeat_timeout=heartbeat)

    async def _start_engine(self) -> None:
        client = self._make_client()
        timeout = float(self.settings.model.model_loading_timeout)
        if isinstance(client, ProcessEngineClient):
            await client.start(timeout, self.standby.take() if self.standby is not None else None)
        else:
            await client.start(timeout=timeout)
        client.on_exit = self._on_exit
        client.on_deltas = self._decode_step
        if self._ever_ready:  # a restarted engine: the adapters registered so far, again
            await self.adapters.replay(client)
        else:  # adapters/<name>/ next to the model
            await self.adapters.register_found(client, self.settings.model_dir, self.path)
        self.client = client
        self.max_model_len = int(client.info["max_model_len"])
        self._ever_ready = True
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
                    return
                await asyncio.sleep(min(30.0, 2.0**self._restarts))

    async def stop(self) -> None:
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        if self.standby is not None:
            await self.standby.close()
        if self.client is not None:
            await self.client.stop()

    # --- generation ---------------------------------------------------------------------
    def admit(self, request: GenerationRequest) -> Admitted:
        """``request`` checked against this model and tokenized (:mod:`lmiserve.generation.admission`)."""
        admission = Admission.for_model(self.settings.engine, self.max_model_len, self.vocab_size)
        return admission.admit(request, self.tokenizer)

    def chat_prompt(
        self,
        messages: list[dict],
        tools: list[dict] | None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> str:
        """The conversation rendered with the model's chat template."""
        if self.tokenizer is None:
            raise ModelNotReady(f"model {self.name} is not ready")
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValidationFailed(f"model {self.name} has no chat template; use the completions API")
        try:
            return self.tokenizer.apply_chat_template(
                messages,
                tools=[{"type": "function", "function": t} for t in tools] if tools else None,
                add_generation_prompt=add_generation_prompt and not continue_final_message,
                continue_final_message=continue_final_message,
                tokenize=False,
            )
        except Exception as exc:  # noqa: BLE001 - a template that rejects these messages
            raise ValidationFailed(f"the chat template cannot render these messages: {exc}") from None

    def new_request_id(self) -> str:
        return f"{self.name}-{self.id_prefix}{next(self._ids)}"

    def submit(self, request: GenerationRequest) -> tuple[str, OutputProcessor, Any]:
        """Validate, tokenize and hand to the engine; errors raise before anything is sent."""
        if self.failure is not None:
            raise ModelNotReady(f"model {self.name} failed: {self.failure.splitlines()[0]}")
        client = self.client
        if client is None or not client.alive:
            raise ModelNotReady(f"model {self.name} is not ready")
        adapter = self.adapters.check_request(request.adapter)
        admitted = self.admit(request)
        limit = self.settings.engine.max_rolling_batch_size + self.settings.model.job_queue_size
        in_flight = self._in_flight(client)
        if in_flight >= limit:
            raise Overloaded(
                f"model {self.name} has {in_flight} requests in flight, as many as "
                "max_rolling_batch_size + job_queue_size allow; retry later"
            )
        request_id = self.new_request_id()
        processor = OutputProcessor(self.tokenizer, request_id, admitted.request, list(admitted.prompt_ids))
        stream = client.submit(request_id, list(admitted.prompt_ids), admitted.params, adapter)
        self._processors[request_id] = processor
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
        get = self._processors.get
        pairs = [(p, d) for d in deltas if d.token_ids and (p := get(d.request_id)) is not None]
        if pairs:
            detokenize_step(pairs)

    def abort(self, request_id: str, index: int | None = None) -> None:
        if self.client is not None:
            self.client.abort(request_id, index)

"""Multi-model mode: many models behind one server, loaded on demand within a memory budget.

The pool keeps the loaded models in least-recently-used order. Each model counts the memory it
needs (``required_memory_mb``, else an estimate from its weight files) against the budget
(``multi_model_memory_mb``). Loading one more first unloads the least recently used models that
have no request in flight; a model that still does not fit is refused with 507, which tells
SageMaker to unload models of its choosing and try again.

- Every request holds a :class:`Lease` on its model from before the model is looked up to the last
  byte of the response, so an in-flight request never loses its model: an unload (LRU or asked for)
  takes the model out of the routing table at once, then waits for its leases before stopping it.
- Concurrent first requests for one model share one load.
- Models are found under ``multi_model_root`` by name: ``ROOT/NAME`` or ``ROOT/NAME/model``
  (SageMaker's layout); a ``.tar.gz`` / ``.tgz`` suffix of a target-model name is ignored.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..config import Settings
from ..errors import BadRequest, Conflict, InsufficientMemory, LmiServeError, ModelLoadFailed, NotFound
from ..model_fetch import FetchError, is_remote
from ..model_store import ModelNotFound, package_file
from .fetching_model import fetched_model, fetched_settings
from .handler_model import ModelLoadError
from .model_admin import registration_settings
from .model_factory import build_model
from .model_sources import fetch, needs_fetch
from .registry import ModelRegistry, ServedModel

log = logging.getLogger("lmiserve.models")

MIB = 1024 * 1024
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
ESTIMATE_FACTOR = 1.2  # weights plus what running them takes, when required_memory_mb is not given
DEFAULT_BUDGET_SHARE = 0.8
_ARCHIVE_SUFFIX = re.compile(r"\.(tar\.gz|tgz)$")
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
LOAD_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1800.0)


def machine_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_budget(settings: Settings) -> int:
    """Bytes the loaded models may take together."""
    configured = settings.server.multi_model_memory_mb
    return configured * MIB if configured else int(machine_memory() * DEFAULT_BUDGET_SHARE)


def weights_path(settings: Settings) -> Path:
    model_id = settings.model.model_id
    if model_id and model_id.startswith("pkg://"):
        return package_file(model_id)
    if model_id and Path(model_id).exists():
        return Path(model_id)
    return settings.model_dir


def required_memory(settings: Settings) -> int:
    """Bytes the model takes once loaded: its ``required_memory_mb``, else an estimate."""
    if settings.model.required_memory_mb:
        return settings.model.required_memory_mb * MIB
    try:
        path = weights_path(settings)
    except ModelNotFound:
        return MIB
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.suffix in WEIGHT_SUFFIXES]
    return max(MIB, int(sum(p.stat().st_size for p in files if p.is_file()) * ESTIMATE_FACTOR))


@dataclass(eq=False)
class _Entry:
    name: str
    need: int
    url: str
    task: asyncio.Task[ServedModel] | None = None
    model: ServedModel | None = None
    in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()


class Lease:
    """A request's hold on its model; :meth:`release` (once) when the response is done."""

    def __init__(self, entry: _Entry):
        self._entry: _Entry | None = entry
        self.model: ServedModel = entry.model  # type: ignore[assignment]

    def release(self) -> None:
        entry, self._entry = self._entry, None
        if entry is not None:
            entry.in_flight -= 1
            if entry.in_flight == 0:
                entry.idle.set()


class ModelPool:
    """The loaded models of one registry, kept within a memory budget."""

    def __init__(self, registry: ModelRegistry, settings: Settings, metrics: CollectorRegistry | None = None):
        self.registry = registry
        self.settings = settings
        self.root = Path(settings.server.multi_model_root).expanduser()
        self.budget = memory_budget(settings)
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._room = asyncio.Lock()
        self._metrics = _PoolMetrics(self, metrics or CollectorRegistry())

    # -- what is loaded -------------------------------------------------------------------------

    def used(self) -> int:
        return sum(e.need for e in self._entries.values())

    def resident(self) -> list[str]:
        """Names of the models loaded or loading, least recently used first."""
        return list(self._entries)

    def url(self, name: str) -> str:
        return self._entries[name].url

    def find(self, target: str) -> Path:
        """The model directory under the root for a model name or SageMaker target-model name."""
        name = _ARCHIVE_SUFFIX.sub("", target)
        if _PLAIN_NAME.match(name) and name not in (".", ".."):
            for candidate in (self.root / name / "model", self.root / name):
                if candidate.is_dir():
                    return candidate
        known = sorted(p.name for p in self.root.iterdir() if p.is_dir()) if self.root.is_dir() else []
        raise NotFound(f"model {target!r} is not under {self.root} (models there: {', '.join(known) or 'none'})")

    # -- leases ---------------------------------------------------------------------------------

    async def acquire(self, name: str, *, load: bool) -> Lease:
        """A lease on model ``name``; with ``load``, a model not loaded yet is loaded from the root
        first (404 when it is not there), else 404 at once."""
        target = name
        if load:
            name = _ARCHIVE_SUFFIX.sub("", name)
        for _ in range(3):  # an unload may win the race between a load and its waiters
            entry = self._entries.get(name)
            if entry is None:
                if not load:
                    raise NotFound(f"model {name!r} is not loaded")
                entry = self._start_load(name, str(self.find(target)), {})
            await self._ready(entry)
            if self._entries.get(entry.name) is entry:
                entry.in_flight += 1
                entry.idle.clear()
                self._entries.move_to_end(entry.name)
                return Lease(entry)
        raise InsufficientMemory(f"model {name!r} was unloaded again as soon as it loaded: too little memory")

    # -- loading and unloading ------------------------------------------------------------------

    async def load(self, name: str, url: str, params: dict[str, str] | None = None) -> ServedModel:
        """Load ``url`` as ``name`` (SageMaker's load call): 409 when that name is loaded already."""
        if name in self._entries:
            raise Conflict(f"model {name!r} is already loaded")
        fetched = None
        if is_remote(url):  # a Hub id or an s3:// prefix: its files are the model directory
            try:
                fetched = await asyncio.to_thread(fetch, url, self.settings, of_model=False)
            except FetchError as exc:
                raise BadRequest(f"url {url!r}: {exc}") from None
            if name in self._entries:
                raise Conflict(f"model {name!r} is already loaded")
        entry = self._start_load(name, url, params or {}, fetched)
        return await self._ready(entry)

    async def unload(self, name: str) -> None:
        """Unload ``name`` once its requests in flight are done: 404 when it is not loaded."""
        entry = self._entries.get(name)
        if entry is None:
            raise NotFound(f"model {name!r} is not loaded")
        try:
            await self._ready(entry)
        except LmiServeError:
            raise NotFound(f"model {name!r} is not loaded") from None
        if self._entries.get(name) is entry:
            await self._unload(entry, "request")

    async def close(self) -> None:
        for entry in list(self._entries.values()):
            if entry.task is not None and not entry.task.done():
                entry.task.cancel()
        await asyncio.gather(*(e.task for e in self._entries.values() if e.task), return_exceptions=True)
        self._entries.clear()

    def _start_load(self, name: str, url: str, params: dict[str, str], fetched: Path | None = None) -> _Entry:
        settings = registration_settings(url, {**params, "model_name": name}, self.settings, fetched)
        entry = _Entry(name=name, need=required_memory(settings), url=str(settings.model_dir))
        self._entries[name] = entry  # from here on, concurrent requests for it wait on this one load
        entry.task = asyncio.create_task(self._load(entry, settings))
        return entry

    async def _ready(self, entry: _Entry) -> ServedModel:
        assert entry.task is not None
        return await asyncio.shield(entry.task)

    async def _load(self, entry: _Entry, settings: Settings) -> ServedModel:
        began = time.monotonic()
        try:
            async with self._room:
                await self._make_room(entry)
            if needs_fetch(settings):  # its serving.properties names a Hub id or an s3:// prefix
                model = fetched_model(*await fetched_settings(settings))
            else:
                model = build_model(settings)
            self.registry.add(model)
            log.info("loading model %s from %s (%d MiB)", entry.name, entry.url, entry.need // MIB)
            await model.start()
        except InsufficientMemory:
            self._forget(entry)
            self._metrics.loaded(entry.name, "insufficient_memory")
            raise
        except (ModelLoadError, LmiServeError, FetchError) as exc:
            self._forget(entry)
            self._metrics.loaded(entry.name, "failed")
            log.error("model %s failed to load: %s", entry.name, exc)
            raise ModelLoadFailed(f"model {entry.name!r} failed to load: {exc}") from None
        except BaseException:  # cancelled at shutdown: the app stops what the registry holds
            if self._entries.get(entry.name) is entry:
                del self._entries[entry.name]
            raise
        entry.model = model
        self._metrics.loaded(entry.name, "loaded", time.monotonic() - began)
        log.info("model %s loaded in %.1f s", entry.name, time.monotonic() - began)
        return model

    async def _make_room(self, entry: _Entry) -> None:
        """Unload least recently used idle models until ``entry`` fits, else 507."""
        while True:
            others = [e for e in self._entries.values() if e is not entry]
            used = sum(e.need for e in others)
            if used + entry.need <= self.budget:
                return
            victim = next((e for e in others if e.model is not None and e.in_flight == 0), None)
            if victim is None:
                raise InsufficientMemory(
                    f"model {entry.name!r} needs {entry.need // MIB} MiB; {used // MIB} of the "
                    f"{self.budget // MIB} MiB for models are held by models in use or loading"
                )
            log.info("unloading model %s, the least recently used, to make room for %s", victim.name, entry.name)
            await self._unload(victim, "lru")

    async def _unload(self, entry: _Entry, reason: str) -> None:
        self._forget(entry)  # no new request reaches it from here on
        await entry.idle.wait()
        if entry.model is not None:
            await entry.model.stop()
        self._metrics.unloaded(entry.name, reason)
        log.info("model %s unloaded (%s)", entry.name, reason)

    def _forget(self, entry: _Entry) -> None:
        if self._entries.get(entry.name) is entry:
            del self._entries[entry.name]
        if entry.model is not None and self.registry.models.get(entry.name) is entry.model:
            self.registry.remove(entry.name)
        elif entry.model is None:
            self.registry.models.pop(entry.name, None)


class _PoolMetrics(Collector):
    """Per-model load and unload counts, load time, memory and requests in flight."""

    def __init__(self, pool: ModelPool, registry: CollectorRegistry):
        self.pool = pool
        self.loads = Counter(
            "lmiserve_model_loads",
            "Model loads in multi-model mode, by outcome (loaded, failed, insufficient_memory).",
            ["model", "outcome"],
            registry=registry,
        )
        self.unloads = Counter(
            "lmiserve_model_unloads",
            "Model unloads in multi-model mode, by reason (lru: to make room; request: asked for).",
            ["model", "reason"],
            registry=registry,
        )
        self.load_time = Histogram(
            "lmiserve_model_load_seconds",
            "Time to load a model in multi-model mode.",
            ["model"],
            buckets=LOAD_BUCKETS,
            registry=registry,
        )
        registry.register(self)

    def loaded(self, model: str, outcome: str, seconds: float | None = None) -> None:
        self.loads.labels(model, outcome).inc()
        if seconds is not None:
            self.load_time.labels(model).observe(seconds)

    def unloaded(self, model: str, reason: str) -> None:
        self.unloads.labels(model, reason).inc()

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        memory = GaugeMetricFamily(
            "lmiserve_model_memory_bytes", "Memory counted for each loaded model (multi-model mode).", labels=["model"]
        )
        flight = GaugeMetricFamily(
            "lmiserve_model_requests_in_flight",
            "Requests holding each loaded model (multi-model mode).",
            labels=["model"],
        )
        for name, entry in list(self.pool._entries.items()):
            memory.add_metric([name], entry.need)
            flight.add_metric([name], entry.in_flight)
        yield memory
        yield flight
        yield GaugeMetricFamily(
            "lmiserve_model_memory_budget_bytes", "Memory the loaded models may take together.", value=self.pool.budget
        )

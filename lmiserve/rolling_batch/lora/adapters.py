"""The engine's book of adapters: registered, loaded in host memory, placed in a device slot.

Plain Python, no torch: the weights are whatever ``load`` returns, held and handed on.

- An adapter's weights are loaded when it is registered (``preload``, the default) or when a
  request first needs it. At most ``max_cpu_loras`` are kept; beyond that the least recently
  used one that no request waits for and that is not pinned is unloaded (read again from its
  directory when needed).
- A request holds its adapter from :meth:`AdapterBook.use` to :meth:`AdapterBook.done`, so its
  weights stay loaded; while one of its sequences runs it holds a device slot
  (:meth:`AdapterBook.acquire` / :meth:`AdapterBook.release`). A slot no running request holds may
  be given to another adapter, the least recently used first; a pinned adapter keeps its slot.
- Unregistering takes the name away at once; requests already using the adapter finish with it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("lmiserve.engine")


class AdapterError(Exception):
    """An adapter operation that cannot be done, and its kind (one of the names below); the
    server decides how each kind is answered."""

    NOT_FOUND = "not_found"
    """No adapter by that name is registered."""
    CONFLICT = "conflict"
    """The name is registered already."""
    INVALID = "invalid"
    """The options contradict each other (pin without preload)."""
    UNLOADABLE = "unloadable"
    """The adapter's files cannot be read as an adapter of this model."""
    NO_CAPACITY = "no_capacity"
    """Every device slot is pinned already."""
    DISABLED = "disabled"
    """LoRA is not enabled in this engine."""
    UNKNOWN_ACTION = "unknown_action"
    """The command names no action the engine knows."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(eq=False)
class Adapter:
    name: str
    src: str
    key: int
    """Unique to this registration: keys the prefix cache, so that a name registered again with
    other weights never reuses what the old weights computed."""
    preload: bool = True
    pin: bool = False
    weights: Any = None
    slot: int | None = None
    refs: int = 0
    """Requests (waiting or running) that use the adapter."""
    running: int = 0
    """Requests with a sequence in the running batch: they hold the slot."""
    removed: bool = False
    used_at: int = 0


class AdapterBook:
    def __init__(self, max_loras: int, max_cpu_loras: int, load: Callable[[str], Any]):
        self.max_loras = max_loras
        self.max_cpu_loras = max(max_cpu_loras, max_loras)
        self._load_weights = load
        self.adapters: dict[str, Adapter] = {}
        self.owners: list[Adapter | None] = [None] * max_loras
        self.pending: list[tuple[int, Any]] = []
        """``(slot, weights)`` to copy to the device before the next step runs."""
        self.loads = 0
        """Times weights were read from an adapter's directory."""
        self._keys = itertools.count(1)
        self._clock = itertools.count(1)

    # --- registration ---------------------------------------------------------------------
    def get(self, name: str) -> Adapter:
        adapter = self.adapters.get(name)
        if adapter is None:
            raise AdapterError(AdapterError.NOT_FOUND, f"Adapter {name} is not registered")
        return adapter

    def register(self, name: str, src: str, preload: bool = True, pin: bool = False) -> Adapter:
        if name in self.adapters:
            raise AdapterError(AdapterError.CONFLICT, f"Adapter {name} is already registered")
        if pin and not preload:
            raise AdapterError(AdapterError.INVALID, "Can not set preload to false and pin to true")
        adapter = Adapter(name, src, next(self._keys), preload, False)
        if preload:
            self._load(adapter)
        if pin:
            self._pin(adapter)
        self.adapters[name] = adapter
        return adapter

    def update(self, name: str, preload: bool | None = None, pin: bool | None = None) -> Adapter:
        adapter = self.get(name)
        preload = adapter.preload if preload is None else preload
        pin = adapter.pin if pin is None else pin
        if pin and not preload:
            raise AdapterError(AdapterError.INVALID, "Can not set preload to false and pin to true")
        if preload and adapter.weights is None:
            self._load(adapter)
        if pin and not adapter.pin:
            self._pin(adapter)
        adapter.pin, adapter.preload = pin, preload
        if not preload and adapter.refs == 0:
            adapter.weights = None
        return adapter

    def unregister(self, name: str) -> None:
        adapter = self.get(name)
        del self.adapters[name]
        adapter.removed = True
        adapter.pin = False
        if adapter.refs == 0:
            self._drop(adapter)

    def _pin(self, adapter: Adapter) -> None:
        pinned = sum(1 for a in self.adapters.values() if a.pin)
        if pinned >= self.max_loras:
            raise AdapterError(
                AdapterError.NO_CAPACITY,
                f"{pinned} adapters are pinned already, as many as option.max_loras ({self.max_loras}) slots",
            )
        adapter.pin = True

    # --- host memory -------------------------------------------------------------------------
    def _load(self, adapter: Adapter) -> None:
        if adapter.weights is not None:
            return
        self._make_room()
        try:
            adapter.weights = self._load_weights(adapter.src)
        except AdapterError:
            raise
        except Exception as exc:  # noqa: BLE001 - any reason the adapter cannot be read
            raise AdapterError(AdapterError.UNLOADABLE, str(exc)) from None
        self.loads += 1
        adapter.used_at = next(self._clock)

    def _make_room(self, keep: int | None = None) -> None:
        """Unload idle adapters, least recently used first, until at most ``keep`` are loaded
        (by default one fewer than ``max_cpu_loras``: room for one more)."""
        keep = self.max_cpu_loras - 1 if keep is None else keep
        loaded = [a for a in self.adapters.values() if a.weights is not None]
        while len(loaded) > keep:
            idle = [a for a in loaded if not a.pin and a.refs == 0]
            if not idle:
                if len(loaded) >= self.max_cpu_loras:
                    log.warning(
                        "every loaded adapter is pinned or in use: %d loaded, max_cpu_loras is %d",
                        len(loaded),
                        self.max_cpu_loras,
                    )
                return
            victim = min(idle, key=lambda a: a.used_at)
            victim.weights = None
            loaded.remove(victim)
            log.info("adapter %s unloaded from host memory (least recently used)", victim.name)

    def _drop(self, adapter: Adapter) -> None:
        adapter.weights = None
        if adapter.slot is not None and self.owners[adapter.slot] is adapter:
            self.owners[adapter.slot] = None
        adapter.slot = None

    # --- requests ----------------------------------------------------------------------------
    def use(self, name: str) -> Adapter:
        """A new request uses ``name``: its weights are loaded now if they are not."""
        adapter = self.get(name)
        self._load(adapter)
        adapter.refs += 1
        adapter.used_at = next(self._clock)
        return adapter

    def done(self, adapter: Adapter) -> None:
        adapter.refs -= 1
        if adapter.removed and adapter.refs == 0:
            self._drop(adapter)
        elif adapter.refs == 0:
            if not adapter.preload and not adapter.pin:
                adapter.weights = None
            self._make_room(keep=self.max_cpu_loras)  # back within max_cpu_loras once idle

    # --- device slots ------------------------------------------------------------------------
    def acquire(self, adapter: Adapter) -> bool:
        """A request of ``adapter`` joins the running batch: it gets a slot, or must wait (False)."""
        adapter.used_at = next(self._clock)
        if adapter.slot is None:
            slot = self._free_slot()
            if slot is None:
                return False
            previous = self.owners[slot]
            if previous is not None:
                previous.slot = None
            self.owners[slot] = adapter
            adapter.slot = slot
            self.pending.append((slot, adapter.weights))
        adapter.running += 1
        return True

    def release(self, adapter: Adapter) -> None:
        adapter.running -= 1

    def _free_slot(self) -> int | None:
        for slot, owner in enumerate(self.owners):
            if owner is None:
                return slot
        idle = [o for o in self.owners if o is not None and o.running == 0 and not o.pin]
        if not idle:
            return None
        return min(idle, key=lambda a: a.used_at).slot

    def take_pending(self) -> list[tuple[int, Any]]:
        pending, self.pending = self.pending, []
        return pending

    def describe(self) -> dict[str, int]:
        return {
            "registered": len(self.adapters),
            "loaded": sum(1 for a in self.adapters.values() if a.weights is not None),
            "in_slots": sum(1 for o in self.owners if o is not None),
            "loads": self.loads,
        }

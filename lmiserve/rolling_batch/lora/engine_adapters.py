"""The engine's part in serving adapters: a part of :class:`~..engine.Engine`, kept apart.

It sets up the book and the device slots when ``enable_lora`` is on, carries out the management
commands between steps, resolves a request's adapter when it arrives, and fills the slots the
scheduler handed out before the step that needs them runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ... import wire
from .adapters import Adapter, AdapterBook, AdapterError
from .peft_weights import read_adapter
from .pool import LoraPool

if TYPE_CHECKING:
    from ..engine_config import EngineConfig
    from ..model_runner import ModelRunner
    from ..models.spec import ModelSpec
    from ..sequence import Group


class EngineAdapters:
    """Mixed into the engine, whose configuration, model spec and runner it uses."""

    config: EngineConfig
    spec: ModelSpec
    runner: ModelRunner
    adapters: AdapterBook | None = None

    def _setup_lora(self, dtype: torch.dtype) -> None:
        """The book and the device slots, before the KV cache takes what memory is left."""
        cfg = self.config
        if not cfg.enable_lora:
            return
        if cfg.tensor_parallel_degree > 1:
            raise ValueError("LoRA adapters (option.enable_lora) are not supported with tensor parallelism")
        spec, rank = self.spec, cfg.max_lora_rank

        def load(src: str) -> Any:
            return read_adapter(src, spec, rank, dtype)

        self.adapters = AdapterBook(cfg.max_loras, cfg.max_cpu_loras or cfg.max_loras, load)
        self.runner.model.lora = LoraPool(spec, cfg.max_loras, rank, dtype, cfg.device)

    def lora_info(self) -> dict[str, str | int]:
        if self.adapters is None:
            return {"lora": "off"}
        cfg = self.config
        return {
            "lora": "on",
            "max_loras": cfg.max_loras,
            "max_lora_rank": cfg.max_lora_rank,
            "max_cpu_loras": self.adapters.max_cpu_loras,
            "lora_slot_bytes": self.runner.model.lora.nbytes,
        }

    def adapter_stats(self) -> dict[str, int]:
        if self.adapters is None:
            return {}
        book = self.adapters.describe()
        return {"adapters_loaded": book["loaded"], "adapter_loads": book["loads"]}

    # --- management ---------------------------------------------------------------------
    def adapter_command(self, cmd: wire.AdapterCommand) -> wire.AdapterResult:
        """Carry out a register, update or unregister command; the result says how it went."""
        if self.adapters is None:
            return wire.AdapterResult(op_id=cmd.op_id, kind=AdapterError.DISABLED, error="LoRA is not enabled.")
        try:
            if cmd.action == "register":
                self.adapters.register(cmd.name, cmd.src, cmd.preload is not False, bool(cmd.pin))
            elif cmd.action == "update":
                self.adapters.update(cmd.name, cmd.preload, cmd.pin)
            elif cmd.action == "unregister":
                self.adapters.unregister(cmd.name)
            else:
                error = f"unknown action {cmd.action!r}"
                return wire.AdapterResult(op_id=cmd.op_id, kind=AdapterError.UNKNOWN_ACTION, error=error)
        except AdapterError as exc:
            return wire.AdapterResult(op_id=cmd.op_id, kind=exc.kind, error=exc.message)
        return wire.AdapterResult(op_id=cmd.op_id)

    # --- requests -----------------------------------------------------------------------
    def _use_adapter(self, name: str) -> Adapter:
        """A new request's adapter, loaded; ValueError (a refusal) when there is none by that name."""
        if self.adapters is None:
            raise ValueError(f"the request names adapter {name!r}, but LoRA is not enabled (option.enable_lora)")
        try:
            return self.adapters.use(name)
        except AdapterError as exc:
            raise ValueError(exc.message) from None

    def _adapter_done(self, group: Group) -> None:
        if group.adapter is not None and self.adapters is not None:
            self.adapters.done(group.adapter)

    def _fill_slots(self) -> None:
        """Copy to the device the adapters the scheduler just gave a slot."""
        if self.adapters is not None:
            for slot, weights in self.adapters.take_pending():
                self.runner.model.lora.load(slot, weights)

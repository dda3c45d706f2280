"""The engine's part in serving adapters.

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
    from ..models.decoder import DecoderModel
    from ..models.spec import ModelSpec
    from ..scheduling.sequence import Group


class EngineAdapters:
    """The adapters of one engine: ``book`` is None when LoRA is off."""

    def __init__(self, config: EngineConfig, spec: ModelSpec, model: DecoderModel, dtype: torch.dtype):
        """The book and the model's device slots, before the KV cache takes what memory is left."""
        self.config = config
        self.model = model
        self.book: AdapterBook | None = None
        if not config.enable_lora:
            return
        if config.tensor_parallel_degree > 1:
            raise ValueError("LoRA adapters (option.enable_lora) are not supported with tensor parallelism")
        rank = config.max_lora_rank

        def load(src: str) -> Any:
            return read_adapter(src, spec, rank, dtype)

        self.book = AdapterBook(config.max_loras, config.max_cpu_loras or config.max_loras, load)
        model.lora = LoraPool(spec, config.max_loras, rank, dtype, config.device)

    def info(self) -> dict[str, str | int]:
        if self.book is None:
            return {"lora": "off"}
        cfg = self.config
        return {
            "lora": "on",
            "max_loras": cfg.max_loras,
            "max_lora_rank": cfg.max_lora_rank,
            "max_cpu_loras": self.book.max_cpu_loras,
            "lora_slot_bytes": self.model.lora.nbytes,
        }

    def stats(self) -> dict[str, int]:
        if self.book is None:
            return {}
        book = self.book.describe()
        return {"adapters_loaded": book["loaded"], "adapter_loads": book["loads"]}

    # --- management ---------------------------------------------------------------------
    def adapter_command(self, cmd: wire.AdapterCommand) -> wire.AdapterResult:
        """Carry out a register, update or unregister command; the result says how it went."""
        if self.book is None:
            return wire.AdapterResult(op_id=cmd.op_id, kind=AdapterError.DISABLED, error="LoRA is not enabled.")
        try:
            if cmd.action == "register":
                self.book.register(cmd.name, cmd.src, cmd.preload is not False, bool(cmd.pin))
            elif cmd.action == "update":
                self.book.update(cmd.name, cmd.preload, cmd.pin)
            elif cmd.action == "unregister":
                self.book.unregister(cmd.name)
            else:
                error = f"unknown action {cmd.action!r}"
                return wire.AdapterResult(op_id=cmd.op_id, kind=AdapterError.UNKNOWN_ACTION, error=error)
        except AdapterError as exc:
            return wire.AdapterResult(op_id=cmd.op_id, kind=exc.kind, error=exc.message)
        return wire.AdapterResult(op_id=cmd.op_id)

    # --- requests -----------------------------------------------------------------------
    def use(self, name: str) -> Adapter:
        """A new request's adapter, loaded; ValueError (a refusal) when there is none by that name."""
        if self.book is None:
            raise ValueError(f"the request names adapter {name!r}, but LoRA is not enabled (option.enable_lora)")
        try:
            return self.book.use(name)
        except AdapterError as exc:
            raise ValueError(exc.message) from None

    def done(self, group: Group) -> None:
        if group.adapter is not None and self.book is not None:
            self.book.done(group.adapter)

    def fill_slots(self) -> None:
        """Copy to the device the adapters the scheduler just gave a slot."""
        if self.book is not None:
            for slot, weights in self.book.take_pending():
                self.model.lora.load(slot, weights)

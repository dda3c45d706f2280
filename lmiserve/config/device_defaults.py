"""What an engine setting left empty means on each kind of device: one table.

The engine resolves its settings from it (:func:`lmiserve.rolling_batch.engine_config.engine_config`),
the settings' descriptions say it (:func:`by_device`) and :mod:`.docs` renders the table of
device defaults from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _default(why: str, none: str | None = None) -> Any:
    """A column of the table: what the setting is for, and what an empty default (None) means."""
    return field(metadata={"why": why, "none": none})


@dataclass(frozen=True)
class DeviceDefaults:
    """The defaults of one kind of device; each field is named after the engine setting it fills in."""

    max_rolling_batch_prefill_tokens: int = _default(
        "A step's token budget. On CPUs vLLM's for its CPU server: prompts that arrive together are "
        "prefilled in one step when no stream is decoding."
    )
    max_decode_step_prefill_tokens: int | None = _default(
        "Most prompt tokens in a step that also decodes: every running stream waits for the whole step.",
        none="the whole step budget",
    )
    decode_step_prefill_tokens_per_sequence: int | None = _default(
        "In a step that also decodes, prompt tokens per sequence running or waiting: a prompt holds a few "
        "streams up briefly in small chunks, a full batch prefills its arriving prompts in larger ones.",
        none="no such limit",
    )
    block_size: int = _default(
        "Tokens per KV-cache block, a multiple of 16. On CPUs vLLM's for its CPU server: a decode step "
        "reads each sequence's cache in longer runs (SmolLM2's attention at 32 streams: 9 ms a step against "
        "15 with 16-token blocks); on NPUs the granule in which their attention kernels read the paged cache."
    )


DEVICE_DEFAULTS: dict[str, DeviceDefaults] = {
    "cpu": DeviceDefaults(
        max_rolling_batch_prefill_tokens=2048,
        max_decode_step_prefill_tokens=512,
        decode_step_prefill_tokens_per_sequence=4,
        block_size=128,
    ),
    "cuda": DeviceDefaults(
        max_rolling_batch_prefill_tokens=4096,
        max_decode_step_prefill_tokens=None,
        decode_step_prefill_tokens_per_sequence=None,
        block_size=16,
    ),
    "npu": DeviceDefaults(
        max_rolling_batch_prefill_tokens=4096,
        max_decode_step_prefill_tokens=None,
        decode_step_prefill_tokens_per_sequence=None,
        block_size=128,
    ),
}
"""By kind of device: ``cpu``, ``cuda`` (CUDA GPUs) and ``npu`` (Ascend NPUs)."""

DEVICE_NAMES = {"cpu": "CPUs", "cuda": "CUDA GPUs", "npu": "Ascend NPUs"}


def device_defaults(device: str) -> DeviceDefaults:
    """The defaults of a device (``cpu``, ``cuda:1``, ``npu:0``)."""
    return DEVICE_DEFAULTS[device.partition(":")[0]]


def in_words(defaults: DeviceDefaults, name: str) -> str:
    """The default of setting ``name`` on one kind of device, as ``docs/configuration.md`` says it."""
    value = getattr(defaults, name)
    return DeviceDefaults.__dataclass_fields__[name].metadata["none"] if value is None else str(value)


def by_device(name: str) -> str:
    """The defaults of setting ``name`` in words: ``2048 on CPUs, 4096 on CUDA GPUs and Ascend NPUs``."""
    kinds: dict[str, list[str]] = {}
    for kind, defaults in DEVICE_DEFAULTS.items():
        kinds.setdefault(in_words(defaults, name), []).append(DEVICE_NAMES[kind])
    return ", ".join(f"{value} on {' and '.join(names)}" for value, names in kinds.items())

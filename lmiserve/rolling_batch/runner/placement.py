"""Where the engine runs: its device, dtype and tensor-parallel degree, resolved in the engine
process (which may ask torch what it sees), and the engine's configuration for that place."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from ...config.schema import ModelSettings
from ...devices import cpu_has_native_bf16, resolve_device, resolve_dtype
from ..engine_config import EngineConfig, settings_of
from .parallel import resolve_degree

log = logging.getLogger("lmiserve.engine")


def engine_config(model_path: str, options: dict[str, str]) -> EngineConfig:
    """The engine's configuration from :func:`~..engine_config.engine_options`' strings."""
    return placed_config(model_path, options)[0]


def placed_config(model_path: str, options: dict[str, str]) -> tuple[EngineConfig, str]:
    """:func:`engine_config`, and why its dtype was chosen."""
    model, engine = settings_of(options)
    device = engine_device(model)
    dtype, why = resolve_dtype(model.dtype, device)
    int8 = engine.quantize_activations == "int8"
    if model.dtype == "auto" and device == "cpu" and not cpu_has_native_bf16() and int8:
        dtype, why = "bf16", "auto with int8 activations: the blocks multiply int8 in either dtype; bf16 for the rest"
    elif model.dtype == "auto" and device == "cpu" and not cpu_has_native_bf16():
        from ..ops.cpu_dtype import measured_format

        choice, why = measured_format(Path(model_path), engine.quantize)
        dtype = choice.dtype if choice is not None else "fp32"
        if choice is not None and choice.dense:  # a GGUF model's weights, dequantized at load
            engine = engine.model_copy(update={"quantize": "none"})
    log.info("dtype %s (%s)", dtype, why)
    rows = 0
    if device == "cpu" and dtype == "bf16" and engine.quantize is None and not engine.deterministic:
        from ..ops.cpu_gguf_rows import dense_rows

        choice, rows_why = dense_rows(Path(model_path), int8)
        if choice is not None and choice.dense_rows == 1 and not int8:  # dense everywhere: no blocks kept
            engine = engine.model_copy(update={"quantize": "none"})
        elif choice is not None and choice.dense_rows > 1:
            rows = choice.dense_rows
        if rows_why:
            log.info("%s", rows_why)
            why = f"{why}; {rows_why}"
    degree = resolve_degree(model.tensor_parallel_degree, device)
    config = EngineConfig.from_settings(
        model_path, model, engine, device=device, dtype=dtype, tensor_parallel_degree=degree
    )
    config = dataclasses.replace(config, gguf_dense_rows=rows)
    default_share = config.decode_step_prefill_tokens_per_sequence
    if device == "cpu" and engine.decode_step_prefill_tokens_per_sequence is None and default_share is not None:
        from .prompt_share import measured_share

        share, share_why = measured_share(Path(model_path), dtype, rows, engine.quantize, int8)
        if share is not None:
            measured = share if share < default_share else 0  # dear prompt tokens: a longer ramp
            share = max(share, default_share)  # raised where prompt tokens are cheap, never lowered
            config = dataclasses.replace(
                config, decode_step_prefill_tokens_per_sequence=share, measured_prompt_share=measured
            )
            share_why = f"{share_why}; taken: {share} (never below the device default, {default_share})"
            if measured:
                share_why += ", ramped over proportionally more sequences"
        log.info("%s", share_why)
        why = f"{why}; {share_why}"
    return config, why


def engine_device(model: ModelSettings) -> str:
    """The engine's device: ``option.rolling_batch=npu`` means an NPU, whatever ``auto`` finds."""
    spec = model.device
    if model.rolling_batch != "npu":
        return resolve_device(spec)
    if spec == "auto":
        spec = "npu"
    if not spec.startswith("npu"):
        raise ValueError(f"option.rolling_batch=npu runs on an NPU, but option.device is {spec}; use npu or npu:N")
    return resolve_device(spec)

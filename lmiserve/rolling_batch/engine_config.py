"""What an engine is built with (the model, the device and the limits of its batches and KV cache),
and how it is built from the server's validated settings.

Plain data (no torch), so the API process can read it without importing the engine: where the
engine runs (device, dtype, tensor-parallel degree) is resolved by :mod:`.runner.placement`, in the
engine process. Each field names the setting it comes from (``metadata["setting"]``); a field
named after its setting takes that setting's declared default, and a setting left empty is filled
in from the device's defaults (:mod:`lmiserve.config.device_defaults`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.device_defaults import device_defaults
from ..config.loader import SPECS_BY_KEY
from ..config.schema import EngineSettings, ModelSettings
from ..config.speculative import SpeculativeConfig

_DECLARED: Any = object()


def _setting(key: str, default: Any = _DECLARED) -> Any:
    """A field set from setting ``key``; its default is the setting's own unless given (a resolved value)."""
    return field(default=SPECS_BY_KEY[key].default if default is _DECLARED else default, metadata={"setting": key})


@dataclass
class EngineConfig:
    model_dir: Path = field(metadata={"setting": "option.model_id"})
    """The model's local directory (``option.model_id`` resolved, else the model directory)."""
    dtype: str = _setting("option.dtype", "fp32")
    device: str = _setting("option.device", "cpu")
    max_num_seqs: int = _setting("option.max_rolling_batch_size")
    max_num_batched_tokens: int = _setting(
        "option.max_rolling_batch_prefill_tokens", device_defaults("cpu").max_rolling_batch_prefill_tokens
    )
    max_model_len: int | None = _setting("option.max_model_len")
    block_size: int = _setting("option.block_size", device_defaults("cpu").block_size)
    kv_cache_bytes: int | None = _setting("option.kv_cache_memory")
    enable_prefix_caching: bool = _setting("option.enable_prefix_caching")
    gpu_memory_utilization: float = _setting("option.gpu_memory_utilization")
    ops: str = field(default="auto", metadata={"setting": None})
    """Which ops implementation runs the model; not a setting: ``auto`` picks the device's (tests and the
    NPU self-check name one)."""
    tensor_parallel_degree: int = _setting("option.tensor_parallel_degree")
    max_prefill_seqs: int | None = _setting("option.max_prefill_batch_size")
    max_decode_step_prefill_tokens: int | None = _setting("option.max_decode_step_prefill_tokens")
    """Most prompt tokens in a step that also decodes (None: the whole budget)."""
    decode_step_prefill_tokens_per_sequence: int | None = _setting("option.decode_step_prefill_tokens_per_sequence")
    """In a step that also decodes, most prompt tokens per sequence running or waiting (None: no such limit)."""
    quantize: str | None = _setting("option.quantize")
    """The weights' quantization as asked for (None: the checkpoint's own; :mod:`.quant.loading`)."""
    quantize_activations: str = _setting("option.quantize_activations")
    """``int8``: block weights multiply activations quantized to int8 (CPUs); ``none``."""
    measured_prompt_share: int = field(default=0, metadata={"setting": None})
    """On a CPU: the per-sequence prompt share measured at start-up where it is below the one
    taken (the device default), else 0; not a setting (:mod:`.runner.prompt_share`, the scheduler's
    ``SchedulerConfig.measured_share``)."""
    gguf_dense_rows: int = field(default=0, metadata={"setting": None})
    """On a CPU, in bf16: rows of a step from which a GGUF model's block layers run from their
    weights dequantized to bf16, kept beside the blocks (0: never); not a setting, measured at
    start-up (:mod:`.ops.cpu_gguf_rows`)."""
    enforce_eager: bool = _setting("option.enforce_eager")
    """No device graphs: every step runs kernel by kernel."""
    deterministic: bool = _setting("option.deterministic")
    """A request's tokens do not depend on the rest of the batch (:mod:`.ops.batch_invariant`)."""
    async_scheduling: str = _setting("option.async_scheduling")
    """auto, true or false: overlap each step's host work with the previous step on the device
    (:mod:`.core.overlap`); auto turns it on for CUDA devices."""
    enable_lora: bool = _setting("option.enable_lora")
    max_loras: int = _setting("option.max_loras")
    max_lora_rank: int = _setting("option.max_lora_rank")
    max_cpu_loras: int | None = _setting("option.max_cpu_loras")
    speculative: SpeculativeConfig | None = field(default=None, metadata={"setting": "option.speculative_config"})
    """Speculative decoding (None: off), from ``option.speculative_config``, ``option.speculative_draft_model``
    and ``option.speculative_length``; its ``model`` is a local directory (the API process fetches a Hub
    id or an ``s3://`` prefix before the engine starts, :meth:`EngineSettings.with_draft`)."""

    def __post_init__(self) -> None:
        if isinstance(self.speculative, dict):  # read back from dataclasses.asdict (the tensor-parallel ranks)
            self.speculative = SpeculativeConfig(**self.speculative)

    @classmethod
    def from_settings(
        cls,
        model_path: str,
        model: ModelSettings,
        engine: EngineSettings,
        *,
        device: str,
        dtype: str,
        tensor_parallel_degree: int,
    ) -> EngineConfig:
        """The configuration of an engine on ``device`` (resolved: ``cpu``, ``cuda:0``, ``npu:1``)."""
        defaults = device_defaults(device)
        return cls(
            model_dir=Path(model_path),
            dtype=dtype,
            device=device,
            max_num_seqs=engine.max_rolling_batch_size,
            max_num_batched_tokens=engine.max_rolling_batch_prefill_tokens or defaults.max_rolling_batch_prefill_tokens,
            max_model_len=model.max_model_len,
            block_size=engine.block_size or defaults.block_size,
            kv_cache_bytes=engine.kv_cache_memory,
            enable_prefix_caching=engine.enable_prefix_caching,
            gpu_memory_utilization=engine.gpu_memory_utilization,
            tensor_parallel_degree=tensor_parallel_degree,
            max_prefill_seqs=engine.max_prefill_batch_size,
            max_decode_step_prefill_tokens=engine.max_decode_step_prefill_tokens
            or defaults.max_decode_step_prefill_tokens,
            decode_step_prefill_tokens_per_sequence=_prefill_share(
                model, engine, defaults.decode_step_prefill_tokens_per_sequence
            ),
            quantize=engine.quantize,
            quantize_activations=engine.quantize_activations,
            enforce_eager=engine.enforce_eager,
            deterministic=engine.deterministic,
            async_scheduling=engine.async_scheduling,
            enable_lora=engine.enable_lora,
            max_loras=engine.max_loras,
            max_lora_rank=engine.max_lora_rank,
            max_cpu_loras=engine.cpu_loras,
            speculative=engine.speculative,
        )


def _prefill_share(model: ModelSettings, engine: EngineSettings, default: int | None) -> int | None:
    """``option.decode_step_prefill_tokens_per_sequence``, or when empty the device's, except under a
    bound on the first token's wait (``option.max_first_token_wait`` with predictive admission):
    then a step that also decodes takes the prompts whole (up to
    ``option.max_decode_step_prefill_tokens``), so that a prompt's first token comes in the step
    after it arrives rather than after as many small chunks as a small batch would cut it into."""
    if engine.decode_step_prefill_tokens_per_sequence is not None:
        return engine.decode_step_prefill_tokens_per_sequence
    if model.max_first_token_wait > 0 and model.predictive_admission:
        return None
    return default


def engine_options(model: ModelSettings, engine: EngineSettings) -> dict[str, str]:
    """The settings the engine process needs, as the strings that cross the process boundary."""
    return {"model": model.model_dump_json(), "engine": engine.model_dump_json()}


def settings_of(options: dict[str, str]) -> tuple[ModelSettings, EngineSettings]:
    """The settings :func:`engine_options` sent, read back in the engine process."""
    return ModelSettings.model_validate_json(options["model"]), EngineSettings.model_validate_json(options["engine"])

"""The settings of the continuous-batching engine (``option.*`` keys read by the engine process)."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import field_validator, model_validator

from .device_defaults import by_device
from .fields import Area, optional_setting, parse_size, setting
from .speculative import SpeculativeConfig, parse_speculative


class EngineSettings(Area):
    """The continuous-batching engine (option.rolling_batch=lmi)."""

    max_rolling_batch_size: int = setting(
        256,
        "option.max_rolling_batch_size",
        "Most sequences running at once in the rolling batch.",
        env_aliases=("MAX_BATCH_SIZE",),
        ge=1,
    )
    max_rolling_batch_prefill_tokens: int | None = optional_setting(
        "option.max_rolling_batch_prefill_tokens",
        "Token budget of one engine step (prompt chunks plus one token per decoding sequence); "
        f"empty: {by_device('max_rolling_batch_prefill_tokens')}. Smaller keeps streams smooth, larger admits "
        "prompts faster. option.max_prefill_tokens (MindIE's maxPrefillTokens) is the same key.",
        key_aliases=("option.max_prefill_tokens",),
        ge=1,
    )
    max_decode_step_prefill_tokens: int | None = optional_setting(
        "option.max_decode_step_prefill_tokens",
        "Most prompt tokens in an engine step that also decodes running sequences: every running stream "
        "waits for the whole step, so this bounds the time between two of its tokens. A step with no "
        "sequence decoding takes up to max_rolling_batch_prefill_tokens. "
        f"Empty: {by_device('max_decode_step_prefill_tokens')}.",
        ge=1,
    )
    decode_step_prefill_tokens_per_sequence: int | None = optional_setting(
        "option.decode_step_prefill_tokens_per_sequence",
        "In an engine step that also decodes, most prompt tokens per sequence running or waiting, on top of "
        "16 (in proportion fewer below 8 sequences, or below 16 with 16 as a floor only where the share "
        "measured at start-up is half the one taken or less; never more than "
        "max_decode_step_prefill_tokens): a prompt holds a few streams up briefly in small chunks, while a "
        "full batch prefills its arriving prompts in larger chunks, in fewer steps. "
        f"Empty: {by_device('decode_step_prefill_tokens_per_sequence')}; on a CPU raised to the share at "
        "which a full batch's prompt tokens cost twice its decodes' linear layers, measured at start-up "
        "(8 with AMX); none under option.max_first_token_wait.",
        ge=1,
    )
    kv_cache_memory: int | None = optional_setting(
        "option.kv_cache_memory",
        "Memory for the paged KV cache (bytes, or 2GiB / 512MiB); empty: on CPUs the smaller of 2 GiB and "
        "a quarter of the available memory, on GPUs what gpu_memory_utilization leaves after the weights.",
        allowed="a size such as 2GiB, 512MiB or a number of bytes",
    )
    gpu_memory_utilization: float = setting(
        0.9,
        "option.gpu_memory_utilization",
        "Share of an accelerator's memory lmiserve may use (weights, activations and KV cache).",
        gt=0,
        le=1,
    )
    block_size: int | None = optional_setting(
        "option.block_size",
        f"Tokens per KV-cache block; empty: {by_device('block_size')}, the granule of the NPU attention "
        "kernels. option.cache_block_size (MindIE's cacheBlockSize) is the same key.",
        key_aliases=("option.cache_block_size",),
        ge=1,
        le=1024,
    )
    max_input_token_len: int | None = optional_setting(
        "option.max_input_token_len",
        "Longest prompt, in tokens, a request may bring (MindIE's maxInputTokenLen); longer prompts are "
        "refused with a validation error. Empty: only max_model_len limits prompts.",
        ge=1,
    )
    max_iter_times: int | None = optional_setting(
        "option.max_iter_times",
        "Most tokens one request may generate (MindIE's maxIterTimes): a larger max_new_tokens is lowered "
        "to it. Empty: no cap beyond max_model_len; a MindIE request (/ or /v1/completions) that names "
        "no max_new_tokens / max_tokens then gets MindIE's default, 512.",
        ge=1,
    )
    max_new_tokens_limit: int | None = optional_setting(
        "option.max_new_tokens_limit",
        "Largest max_new_tokens (max_tokens) a request may ask for; larger values are refused with a "
        "validation error. Empty: the context length (max_model_len).",
        ge=1,
    )
    max_n: int = setting(
        128,
        "option.max_n",
        "Most sequences (n) one request may ask for; more are refused. 128: MindIE's range for n.",
        ge=1,
        le=1024,
    )
    max_best_of: int = setting(
        128,
        "option.max_best_of",
        "Most candidate sequences (best_of, or beams) one request may ask for; more are refused. "
        "128: MindIE's range for best_of.",
        ge=1,
        le=1024,
    )
    max_stop_sequences: int = setting(
        1024,
        "option.max_stop_sequences",
        "Most stop strings one request may bring; more are refused. 1024: MindIE's limit. Whatever "
        "the count, the stop strings of one request may have 32768 characters in all.",
        ge=0,
    )
    max_stop_sequence_length: int = setting(
        32768,
        "option.max_stop_sequence_length",
        "Longest stop string, in characters, a request may bring; longer ones are refused. 32768: "
        "MindIE's limit for a single stop string on /v1/completions.",
        ge=1,
    )
    max_prefill_batch_size: int | None = optional_setting(
        "option.max_prefill_batch_size",
        "Most prompts one engine step prefills (MindIE's maxPrefillBatchSize); empty: as many as the "
        "step's token budget admits.",
        ge=1,
    )
    npu_device_ids: str | None = optional_setting(
        "option.npu_device_ids",
        "The Ascend NPUs this server may use, as a comma-separated list of device ids (MindIE's npuDeviceIds); "
        "the engine sees them as npu:0, npu:1, ... through ASCEND_RT_VISIBLE_DEVICES. Empty: all of them.",
        allowed="comma-separated device ids such as 0,1,2,3",
        pattern=r"^\s*\d+(\s*,\s*\d+)*\s*$",
    )
    enable_prefix_caching: bool = setting(
        True, "option.enable_prefix_caching", "Reuse the KV cache of shared prompt prefixes across requests."
    )
    deterministic: bool = setting(
        False,
        "option.deterministic",
        "Batch-invariant mode: a request's greedy tokens (and seeded samples) do not depend on the other "
        "requests in the batch, on how its prompt was chunked or on prefix-cache hits. Costs throughput; "
        "see docs/deterministic.md.",
    )
    quantize: Literal["none", "awq", "gptq", "fp8", "int8"] | None = optional_setting(
        "option.quantize",
        "Quantized weights. Empty: the checkpoint's own scheme (its config.json quantization_config: AWQ, GPTQ, "
        "FP8 or compressed-tensors; a GGUF file's Q4_0, Q4_1 and Q8_0 blocks), else the dtype's. awq or gptq: "
        "the checkpoint must be in that format. fp8: bf16/fp16 weights quantized to e4m3 at load, per output "
        "channel (GPUs of compute capability 8.9 or later). int8: weights quantized at load to int8 in blocks of "
        "32 with one scale each (CPUs). none: every weight dequantized at load to option.dtype. The table in "
        "docs/quantization.md says what runs where.",
        allowed="none, awq, gptq, fp8, int8",
    )
    quantize_activations: Literal["none", "int8"] = setting(
        "none",
        "option.quantize_activations",
        "int8: on CPUs, the linear layers whose weights are in blocks (a GGUF file's Q4_0, Q4_1 and Q8_0, or "
        "option.quantize=int8) multiply each activation row quantized to int8 per block of 32 (as llama.cpp "
        "does), in integer dot products: faster decoding, especially at one stream, but results differ from the "
        "dequantized model's (greedy text may change). none: activations stay in option.dtype. See "
        "docs/quantization.md.",
        allowed="none, int8",
    )
    enforce_eager: bool = setting(
        False,
        "option.enforce_eager",
        "Run every engine step kernel by kernel. By default, on CUDA GPUs, decode steps are captured as "
        "CUDA graphs for batch sizes up to max_rolling_batch_size (at most 512), and steps with prompt "
        "tokens for buckets of sequences and prompt tokens, and replayed.",
    )
    async_scheduling: Literal["auto", "true", "false"] = setting(
        "auto",
        "option.async_scheduling",
        "Schedule and prepare each engine step while the device still runs the previous one, whose sampled "
        "tokens feed the next step on the device; the host's work then overlaps the device's. Steps with beam "
        "search, guided decoding, prompt log-probabilities, penalties or min_new_tokens, and tensor-parallel "
        "engines, run one after the other. auto: on for CUDA GPUs, off elsewhere.",
        allowed="auto, true, false",
    )
    enable_lora: bool = setting(
        False,
        "option.enable_lora",
        "Serve LoRA adapters (PEFT directories) on top of the base model: those in the model directory's "
        "adapters/ folder load at start, others through the adapters management API; each request names "
        "its adapter, and requests for different adapters share one batch.",
    )
    max_loras: int = setting(
        4,
        "option.max_loras",
        "Most distinct adapters in one engine step (the adapter slots on the device); requests for other "
        "adapters wait for a slot.",
        ge=1,
        le=256,
    )
    max_lora_rank: int = setting(
        16,
        "option.max_lora_rank",
        "Highest LoRA rank an adapter may have; the device slots are sized for it, so a larger value costs "
        "memory. An adapter of a higher rank is refused when it is registered.",
        ge=1,
        le=512,
    )
    max_cpu_loras: int | None = optional_setting(
        "option.max_cpu_loras",
        "Adapters whose weights are kept loaded in host memory; beyond it the least recently used unpinned "
        "adapter is unloaded, and read from its directory again when a request needs it. At least "
        "max_loras; empty: max_loras.",
        ge=1,
    )
    engine_heartbeat_timeout: int = setting(
        60,
        "option.engine_heartbeat_timeout",
        "Seconds the engine may go without finishing a step while requests are in flight; then it is "
        "reported unhealthy on /ping, its requests end with an error and it is restarted. 0: never.",
        ge=0,
    )
    max_replays: int = setting(
        2,
        "option.max_replays",
        "Times a request is handed to the restarted engine when the engine dies under it: one that has "
        "sent nothing starts again, one that has streamed continues from the tokens already sent (the "
        "client sees a pause, not an error), within its deadline. A request that was starting at two "
        "consecutive crashes is taken for their cause and ends with an error. 0: a crash ends the "
        "requests in flight with an error.",
        ge=0,
        le=10,
    )
    engine_standby: Literal["auto", "true", "false"] = setting(
        "auto",
        "option.engine_standby",
        "Keep a second engine process waiting, started after each engine start with Python, torch and the "
        "engine's modules imported at low priority: when the engine dies, its replacement starts in that "
        "process and skips the imports. It holds no weights, only those modules' memory (a few hundred MB "
        "of host memory). auto: on when the engine runs on CPUs, off elsewhere; never with vLLM.",
        allowed="auto, true, false",
    )

    speculative_config: str | None = optional_setting(
        "option.speculative_config",
        "Speculative decoding, as vLLM's --speculative-config JSON, e.g. "
        '{"method": "ngram", "num_speculative_tokens": 4} or {"model": "org/draft", "num_speculative_tokens": 5}: '
        "method ngram (prompt lookup, no weights), draft_model, eagle or eagle3; a model (a directory, a Hub id "
        "or s3://, fetched as option.model_id is); lmiserve's own adaptive (default true: a sequence whose "
        "proposals are rarely accepted pauses proposing). vLLM gets it as its speculative_config, less adaptive. "
        "Empty: no speculative decoding "
        "(unless option.speculative_draft_model is set).",
        allowed="a JSON object, as vLLM's --speculative-config",
    )
    speculative_draft_model: str | None = optional_setting(
        "option.speculative_draft_model",
        "LMI's name for a draft model: the same as option.speculative_config's model (a directory, a Hub id or "
        "s3://), proposing option.speculative_length tokens per step.",
    )
    speculative_length: int = setting(
        5,
        "option.speculative_length",
        "LMI's name for the tokens proposed per step (vLLM's num_speculative_tokens), with "
        "option.speculative_draft_model or with an option.speculative_config that does not set them.",
        ge=1,
    )

    @field_validator("kv_cache_memory", mode="before")
    @classmethod
    def _size(cls, v: object) -> object:
        return None if v is None else parse_size(v)

    @field_validator("async_scheduling", "engine_standby", mode="before")
    @classmethod
    def _switch(cls, v: object) -> object:
        if isinstance(v, bool):
            return "true" if v else "false"
        return v.strip().lower() if isinstance(v, str) else v

    @model_validator(mode="after")
    def _lora_cache(self) -> EngineSettings:
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"option.max_cpu_loras ({self.max_cpu_loras}) must be at least option.max_loras ({self.max_loras})"
            )
        return self

    @model_validator(mode="after")
    def _speculative(self) -> EngineSettings:
        try:
            self.speculative  # noqa: B018 - read to check it
        except ValueError as exc:
            given = {"option.speculative_config": self.speculative_config}
            given["option.speculative_draft_model"] = self.speculative_draft_model
            named = ", ".join(f"{k}={v!r}" for k, v in given.items() if v is not None)
            raise ValueError(f"invalid speculative decoding settings ({named}): {exc}") from None
        return self

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """Speculative decoding as configured (None: off); ``option.speculative_length`` gives
        ``num_speculative_tokens`` where the JSON leaves it out. ValueError says what is wrong."""
        text, draft = self.speculative_config, self.speculative_draft_model
        if not text and not draft:
            return None
        try:
            raw = json.loads(text) if text else {}
        except json.JSONDecodeError:
            raw = None  # parse_speculative says what is wrong
        if isinstance(raw, dict) and "num_speculative_tokens" not in raw:
            return parse_speculative({**raw, "num_speculative_tokens": self.speculative_length}, draft)
        return parse_speculative(text, draft)

    def with_draft(self, directory: str) -> EngineSettings:
        """These settings with the draft model (or EAGLE head) read from ``directory``: a fetched copy."""
        spec = self.speculative
        assert spec is not None
        text = json.dumps({**spec.raw, "model": directory})
        return self.model_copy(update={"speculative_config": text, "speculative_draft_model": None})

    @property
    def cpu_loras(self) -> int:
        """Adapters kept loaded in host memory (max_cpu_loras, else max_loras)."""
        return self.max_cpu_loras or self.max_loras

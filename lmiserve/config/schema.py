"""The settings lmiserve understands, one pydantic model per area (:data:`AREAS`): the server's
(:mod:`.server_settings`), the model's (here) and the engine's (:mod:`.engine_settings`).

Each field is declared once with :func:`~.fields.setting`; keys, environment variables, CLI flags,
``config show`` and the configuration table of ``docs/configuration.md`` all come from these declarations.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

from pydantic import ValidationInfo, field_validator, model_validator

from .engine_settings import EngineSettings
from .fields import Area, optional_setting, setting
from .media_settings import MediaSettings
from .server_settings import ServerSettings

__all__ = ["AREAS", "EngineSettings", "MediaSettings", "ModelSettings", "ServerSettings"]

_DTYPES = {
    "auto": "auto",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "bf16": "bf16",
    "bfloat16": "bf16",
}
_ROLLING = {
    "auto": "auto",
    "lmi": "lmi",
    "lmi-dist": "lmi",
    "npu": "npu",
    "vllm": "vllm",
    "disable": "disable",
    "disabled": "disable",
    "false": "disable",
    **dict.fromkeys(("trtllm", "tensorrt-llm", "scheduler", "hf-accelerate"), "auto"),
}
OTHER_BACKENDS = {"trtllm": "TensorRT-LLM", "tensorrt-llm": "TensorRT-LLM", "scheduler": "hf-accelerate",
                  "hf-accelerate": "hf-accelerate"}  # fmt: skip
"""LMI's rolling-batch backends that lmiserve does not ship: such a configuration starts as ``auto``
would, with a warning naming the substitution."""
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?|npu(:\d+)?)$")
_FORMATTER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


def _device(v: str) -> str:
    if not _DEVICE.match(v.lower()):
        raise ValueError("not a device")
    return v.lower()


def _degree(v: str) -> int | str:
    if v.lower() == "max":
        return "max"
    if not v.isdigit() or int(v) < 1:
        raise ValueError("not a degree")
    return int(v)


def _formatter(v: str) -> str:
    if v.lower() in ("json", "jsonlines", "sse"):
        return v.lower()
    if not _FORMATTER.match(v):
        raise ValueError("not a formatter")
    return v


_SPELLINGS: dict[str, Callable[[str], object]] = {
    "engine": lambda v: {"python": "Python", "mpi": "MPI"}.get(v.lower(), v),
    "dtype": lambda v: _DTYPES.get(v.lower(), v),
    "rolling_batch": lambda v: _ROLLING.get(v.lower(), v),
    "device": _device,
    "tensor_parallel_degree": _degree,
    "output_formatter": _formatter,
}
"""The model's text settings read case-blind (and checked), by field."""


class ModelSettings(Area):
    """The served model: what to load, how to run it and how requests reach it."""

    model_name: str | None = optional_setting(
        "model_name",
        "Name of the model in URLs (/predictions/{name}); defaults to the model directory's name.",
        cli="--model-name",
        allowed="a name of letters, digits, '-', '_' and '.'",
        pattern=r"^[A-Za-z0-9_.-]+$",
    )
    engine: Literal["Python", "MPI"] = setting(
        "Python", "engine", "How worker processes are launched; MPI is accepted and behaves as Python."
    )
    model_id: str | None = optional_setting(
        "option.model_id",
        "The model to load: a local Hugging Face directory or .gguf file; a Hugging Face Hub id (org/name, "
        "org/name:QUANT for one GGUF file of a repository), downloaded unless HF_HUB_OFFLINE=1; an S3 prefix "
        "(s3://bucket/prefix/), downloaded; or pkg://PACKAGE/PATH for weights shipped in an installed Python "
        "package. Empty: the model directory itself, else the embedded SmolLM2-135M-Instruct.",
        env_aliases=("HF_MODEL_ID",),
    )
    revision: str | None = optional_setting(
        "option.revision",
        "The Hub revision of a Hub model id: a branch, tag or commit. Empty: main.",
        env_aliases=("HF_REVISION",),
    )
    gguf_file: str | None = optional_setting(
        "option.gguf_file",
        "The GGUF file to take from a Hub repository that holds several (else the :QUANT suffix of the id, "
        "else Q4_K_M, else the first).",
    )
    download_dir: str | None = optional_setting(
        "option.download_dir",
        "Where downloaded models go. Empty: Hub ids in the Hugging Face cache (HF_HOME, HF_HUB_CACHE), S3 "
        "prefixes under lmiserve's cache (LMISERVE_CACHE, else ~/.cache/lmiserve) in downloads/.",
    )
    entry_point: str | None = optional_setting(
        "option.entryPoint",
        "Handler module: a .py file (relative to the model directory) or a dotted module name. "
        "Empty: model.py in the model directory if present, else the built-in handler.",
    )
    handler: str = setting(
        "handle",
        "option.handler",
        "Name of the handler function in the entry point.",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        allowed="a Python identifier",
    )
    rolling_batch: Literal["auto", "lmi", "npu", "vllm", "disable"] = setting(
        "auto",
        "option.rolling_batch",
        "Continuous-batching backend: lmi (our engine on the CPU or a CUDA GPU), npu (our engine on an Ascend "
        "NPU through torch_npu's fused kernels), vllm (an installed vLLM) or disable (dynamic batching through "
        "transformers generate); auto picks our engine for the architectures it supports (Llama, Mistral, "
        "Qwen2, Qwen3, Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, Phi-3/Phi-4, OLMo 2, Granite, Gemma 2, Gemma 3 text; "
        "the Architectures table of docs/engine.md), on an NPU when one is present, an installed vLLM for the others, "
        "else transformers generate (with a warning). LMI's trtllm and scheduler (TensorRT-LLM, hf-accelerate), "
        "which lmiserve does not ship, start as auto with a warning.",
        allowed="auto, lmi, npu, vllm, disable (trtllm and scheduler: as auto)",
    )
    dtype: Literal["auto", "fp32", "fp16", "bf16"] = setting(
        "auto",
        "option.dtype",
        "Weight and compute dtype. auto: bf16 on CPUs with native bf16 (AVX512_BF16/AMX) and on GPUs "
        "that support it, fp16 on other GPUs and NPUs; on other CPUs the engine measures the model's "
        "linear layers in fp32 and in bf16 (and a GGUF model's blocks against its weights dequantized) at "
        "start-up and takes the fastest (the dynamic-batch handler: fp32).",
        allowed="auto, fp32, fp16, bf16",
    )
    device: str = setting(
        "auto",
        "option.device",
        "Where the model runs; auto picks an NPU, then a CUDA GPU, then the CPU.",
        allowed="auto, cpu, cuda, cuda:N, npu, npu:N",
    )
    tensor_parallel_degree: int | Literal["max"] = setting(
        1,
        "option.tensor_parallel_degree",
        "Devices one model copy is sharded across; max uses all visible accelerators.",
        env_aliases=("TENSOR_PARALLEL_DEGREE", "SM_NUM_GPUS"),
        allowed="an integer >= 1 or max",
    )
    pipeline_parallel_degree: int = setting(
        1,
        "option.pipeline_parallel_degree",
        "Pipeline stages one model copy is split into, across devices or nodes: vLLM's pipeline_parallel_size "
        "(option.rolling_batch=vllm only; other backends refuse more than 1).",
        allowed="an integer >= 1",
    )
    output_formatter: str = setting(
        "json",
        "option.output_formatter",
        "Response format: json, jsonlines or sse (or a custom formatter's name).",
        allowed="json, jsonlines, sse, or a formatter function name",
    )
    tgi_compat: bool = setting(
        False, "option.tgi_compat", "Answer the rolling-batch schema the way TGI does (list bodies, SSE streams)."
    )
    bedrock_compat: bool = setting(
        False,
        "option.bedrock_compat",
        "Answer /invocations in Amazon Bedrock's Meta Llama schema ({prompt, temperature, top_p, max_gen_len} in, "
        "{generation, prompt_token_count, generation_token_count, stop_reason} out; streamed as JSON lines when the "
        "X-Amzn-SageMaker-Forwarded-Api header is InvokeEndpointWithResponseStream).",
    )
    enable_streaming: bool = setting(
        False, "option.enable_streaming", "Stream every response, even when the request does not ask for it."
    )
    full_text_enabled: bool = setting(
        False,
        "option.full_text_enabled",
        "MindIE's fullTextEnabled: each event of a MindIE stream (POST / with stream: true) carries the whole "
        "text so far in token.text, not only the text of its new tokens.",
    )
    max_model_len: int | None = optional_setting(
        "option.max_model_len",
        "Longest sequence (prompt plus generated tokens); empty: the model's own limit. "
        "option.max_seq_len (MindIE's maxSeqLen) is the same key.",
        key_aliases=("option.max_seq_len",),
        ge=1,
    )
    trust_remote_code: bool = setting(
        False,
        "option.trust_remote_code",
        "Allow model directories that ship their own modelling code.",
        env_aliases=("HF_MODEL_TRUST_REMOTE_CODE",),
    )
    enable_reasoning: bool | None = optional_setting(
        "option.enable_reasoning",
        "LMI's switch for reasoning models: true splits the thinking from the answer in OpenAI chat, the "
        "Responses API and Databricks chat (with option.reasoning_parser, else auto); false never does. "
        "Empty: on where option.reasoning_parser is set.",
    )
    reasoning_parser: Literal["auto", "deepseek_r1", "qwen3", "granite", "gpt_oss"] | None = optional_setting(
        "option.reasoning_parser",
        "How a reasoning model's thinking is told apart from its answer (docs/reasoning.md): deepseek_r1, "
        "qwen3 (<think>...</think>), granite (its 'thought process' phrases), gpt_oss (harmony channels), "
        "or auto (from the chat template and the tokenizer's tokens).",
    )
    strip_reasoning: bool = setting(
        False,
        "option.strip_reasoning",
        "With a reasoning parser: leave a reasoning model's thinking out of the text of the protocols that "
        "have no field for it (LMI, TGI, MindIE, KServe, OpenAI completions), whole and streamed. Off: they "
        "return the model's raw text, thinking included.",
    )
    batch_size: int = setting(1, "batch_size", "Dynamic batch size: requests gathered into one handler call.", ge=1)
    max_batch_delay: int = setting(
        100, "max_batch_delay", "Longest wait, in milliseconds, to fill a dynamic batch.", ge=0
    )
    max_idle_time: int = setting(
        60, "max_idle_time", "Seconds a worker above minWorkers may stay idle before it is stopped.", ge=0
    )
    min_workers: int = setting(1, "minWorkers", "Worker processes kept running.", ge=1)
    max_workers: int = setting(
        1, "maxWorkers", "Most worker processes; more start while requests wait (each loads the model).", ge=1
    )
    job_queue_size: int = setting(
        1000,
        "job_queue_size",
        "Requests that may wait for a worker (rolling batch: beyond option.max_rolling_batch_size running); "
        "beyond it requests get 503 at once, with a Retry-After header.",
        env_aliases=("MAX_CONCURRENT_REQUESTS",),
        ge=1,
    )
    predictive_admission: bool = setting(
        True,
        "option.predictive_admission",
        "Rolling batch: refuse at once, with 503 and a Retry-After header, a request predicted (from the "
        "engine's measured prefill speed and step time, the requests queued ahead and the batch it would "
        "join) to end after its deadline (predict_timeout, or X-Request-Timeout), or to make a request "
        "already admitted miss its own, rather than admit it to miss it. Off: only job_queue_size limits "
        "the queue.",
    )
    max_first_token_wait: float = setting(
        0.0,
        "option.max_first_token_wait",
        "Rolling batch, with option.predictive_admission: refuse at once, with 503 and a Retry-After header, "
        "a request whose first token is predicted (the prompt tokens queued ahead and its own at the "
        "engine's measured prefill speed, plus the wait for a batch slot) to come more than this many "
        "seconds after it arrives, deadline or not. With a bound, and "
        "option.decode_step_prefill_tokens_per_sequence empty, an engine step that also decodes takes "
        "the prompts whole (up to option.max_decode_step_prefill_tokens) rather than in per-sequence "
        "shares, so that a prompt's first token comes in the step after it arrives. 0: no bound.",
        ge=0,
    )
    predict_timeout: int = setting(
        120,
        "predict_timeout",
        "Seconds a handler may take to answer (or between streamed chunks) before the request fails "
        "with 504 and the worker is restarted. Rolling batch: a request's deadline; generation is aborted "
        "then (504, or 503 with Retry-After if it never left the queue). A client may ask for less with the "
        "X-Request-Timeout header (seconds).",
        env_aliases=("SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS",),
        key_aliases=("option.predict_timeout",),
        ge=1,
    )
    required_memory_mb: int | None = optional_setting(
        "required_memory_mb",
        "Multi-model mode: the memory, in MiB, this model takes once loaded (weights, KV cache, workers). "
        "Empty: estimated as 1.2 x the size of its weight files.",
        ge=1,
    )
    model_loading_timeout: int = setting(
        1800,
        "model_loading_timeout",
        "Seconds a worker may take to load the model.",
        env_aliases=("SAGEMAKER_STARTUP_TIMEOUT",),
        key_aliases=("option.model_loading_timeout",),
        ge=1,
    )

    @field_validator(*_SPELLINGS, mode="before")
    @classmethod
    def _spelling(cls, v: object, info: ValidationInfo) -> object:
        """A text value in the field's canonical spelling (or refused)."""
        return _SPELLINGS[info.field_name](v.strip()) if isinstance(v, str) else v

    @field_validator("tensor_parallel_degree", "pipeline_parallel_degree")
    @classmethod
    def _degree_above_zero(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("not a degree")
        return v

    @model_validator(mode="after")
    def _workers(self) -> ModelSettings:
        if self.min_workers > self.max_workers:
            raise ValueError(f"minWorkers ({self.min_workers}) is larger than maxWorkers ({self.max_workers})")
        return self


AREAS: dict[str, type[Area]] = {
    "server": ServerSettings,
    "model": ModelSettings,
    "engine": EngineSettings,
    "media": MediaSettings,
}

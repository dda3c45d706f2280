"""Between lmiserve's engine messages and vLLM's: sampling parameters in, request outputs out.

Pure functions over the installed vLLM's classes (gathered in a :class:`VllmApi`), so they can
be tested without vLLM. Each sequence of a request (``max(n, best_of)`` of them) is one vLLM
request with ``n=1``: a sequence that a stop string ended can then be aborted on its own, every
sequence streams its own deltas, and lmiserve picks the best ``n`` of ``best_of`` by cumulative
log-probability, as with its own engine. Stop strings are not passed to vLLM: the output
processor above the engine applies them.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import json
from dataclasses import dataclass
from typing import Any

from ... import wire

TYPICAL_P_KEY = "lmiserve_typical_p"
"""Where a request's typical_p travels to :class:`.typical_p.TypicalP` (``SamplingParams.extra_args``)."""
TYPICAL_P_PROCESSOR = "lmiserve.rolling_batch.vllm.typical_p:TypicalP"
"""The logits processor's class path, as vLLM's ``logits_processors`` engine argument takes it."""

VALIDATION_ERRORS = frozenset({"VLLMValidationError", "VLLMClientError"})
"""vLLM's exception classes for a request it refuses (besides ValueError and TypeError)."""


class RequestRefused(ValueError):
    """The vLLM backend cannot run this request as asked."""


def field_names(cls: type) -> frozenset[str]:
    """The keyword arguments a vLLM parameter class takes (msgspec struct, dataclass or plain)."""
    names = getattr(cls, "__struct_fields__", None)
    if names is not None:
        return frozenset(names)
    if dataclasses.is_dataclass(cls):
        return frozenset(f.name for f in dataclasses.fields(cls))
    try:
        return frozenset(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        return frozenset()


@dataclass(frozen=True)
class VllmApi:
    """What the installed vLLM offers to this adapter."""

    sampling_params: type
    delta_kind: Any = None
    """``RequestOutputKind.DELTA`` where vLLM has it (outputs then hold only what is new)."""
    structured: type | None = None
    """``StructuredOutputsParams`` (newer vLLM) or ``GuidedDecodingParams`` (older)."""
    structured_field: str = ""
    """The SamplingParams field that takes it: ``structured_outputs`` or ``guided_decoding``."""
    version: str = "unknown"
    typical_p: bool = False
    """SamplingParams take ``extra_args``, which carry typical_p to the engine's logits processor."""

    @classmethod
    def load(cls) -> VllmApi:
        vllm = importlib.import_module("vllm")
        module = importlib.import_module("vllm.sampling_params")
        params_cls = getattr(vllm, "SamplingParams", None) or module.SamplingParams
        fields = field_names(params_cls)
        kind = getattr(module, "RequestOutputKind", None)
        delta = getattr(kind, "DELTA", None) if "output_kind" in fields else None
        structured, field = None, ""
        for class_name, field_name in (
            ("StructuredOutputsParams", "structured_outputs"),
            ("GuidedDecodingParams", "guided_decoding"),
        ):
            if hasattr(module, class_name) and field_name in fields:
                structured, field = getattr(module, class_name), field_name
                break
        version = str(getattr(vllm, "__version__", "unknown"))
        return cls(params_cls, delta, structured, field, version, typical_p=typical_p_available(fields))


def typical_p_available(sampling_fields: frozenset[str]) -> bool:
    """Whether this vLLM takes :data:`TYPICAL_P_PROCESSOR`: per-request ``extra_args`` and V1 logits
    processors (both of vLLM 0.10 and later)."""
    return "extra_args" in sampling_fields and importlib.util.find_spec("vllm.v1.sample.logits_processor") is not None


def check(params: wire.SamplingParams, api: VllmApi | None = None) -> None:
    """Refuse what the vLLM backend does not do (raises RequestRefused); beam search runs above
    vLLM's sampling (:mod:`.beam_search`), so it never reaches here."""
    if params.do_sample and params.typical_p < 1.0 and not (api is not None and api.typical_p):
        raise RequestRefused(f"typical_p is not available on the vllm backend ({api.version if api else 'vLLM'})")


def _structured(guided: wire.GuidedDecoding, api: VllmApi) -> Any:
    if api.structured is None:
        raise RequestRefused(
            f"constrained decoding is not available with the installed vLLM ({api.version}); "
            "it has neither StructuredOutputsParams nor GuidedDecodingParams"
        )
    if guided.kind == "json_schema":
        return api.structured(json=guided.value)
    if guided.kind == "json_object":
        return api.structured(json_object=True)
    if guided.kind == "regex":
        return api.structured(regex=guided.value)
    if guided.kind == "structural_tag":
        return api.structured(structural_tag=guided.value)
    if guided.kind == "grammar":
        return api.structured(grammar=guided.value)
    if guided.kind == "choice":  # the list, as JSON
        return api.structured(choice=json.loads(guided.value))
    raise RequestRefused(f"constrained decoding of kind {guided.kind!r} is not available on the vllm backend")


def sampling_kwargs(params: wire.SamplingParams, api: VllmApi, index: int = 0) -> dict[str, Any]:
    """vLLM SamplingParams arguments for sequence ``index`` of a request (one vLLM request each)."""
    check(params, api)
    kw: dict[str, Any] = {
        "n": 1,
        "max_tokens": params.max_new_tokens,
        "min_tokens": params.min_new_tokens,
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": params.ignore_eos,
        "repetition_penalty": params.repetition_penalty,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        # every token carries its log-probability, as with lmiserve's own engine
        "logprobs": max(0, params.logprobs),
        "prompt_logprobs": params.prompt_logprobs,
        "detokenize": False,  # text is made once, by lmiserve's output processor
    }
    if params.bad_words:  # vLLM tokenizes them as admission does for our engine
        kw["bad_words"] = list(params.bad_words)
    if params.do_sample:
        kw.update(
            temperature=params.temperature,
            top_k=params.top_k if params.top_k > 0 else -1,
            top_p=params.top_p,
            min_p=params.min_p,
        )
    else:
        kw.update(temperature=0.0, top_k=-1, top_p=1.0, min_p=0.0)
    if params.do_sample and params.typical_p < 1.0:
        kw["extra_args"] = {TYPICAL_P_KEY: params.typical_p}
    if params.seed is not None:
        kw["seed"] = params.seed + index  # the sequences of one seeded request differ, reproducibly
    if api.delta_kind is not None:
        kw["output_kind"] = api.delta_kind
    if params.guided is not None:
        kw[api.structured_field] = _structured(params.guided, api)
    return kw


def one_token_params(api: VllmApi, k: int) -> Any:
    """A beam-search step's request: one greedy token and the top ``k`` log-probabilities."""
    return api.sampling_params(n=1, max_tokens=1, temperature=0.0, logprobs=k, detokenize=False)


def sampling_params(params: wire.SamplingParams, api: VllmApi, index: int = 0) -> Any:
    """A ``vllm.SamplingParams``; vLLM's own checks raise ValueError for values it refuses."""
    return api.sampling_params(**sampling_kwargs(params, api, index))


# --- outputs -----------------------------------------------------------------------------------


def _value(logprob: Any) -> float:
    value = getattr(logprob, "logprob", logprob)
    return float(value) if value is not None else 0.0


def _top(entries: Any, k: int) -> list[wire.TopLogprob]:
    """The ``k`` most likely tokens of one position (vLLM adds the chosen token when it is not
    among them)."""
    ranked = sorted(((int(t), _value(lp)) for t, lp in entries.items()), key=lambda item: -item[1])
    return [wire.TopLogprob(t, v) for t, v in ranked[:k]]


def finish_reason(reason: str | None, stop_reason: int | str | None) -> str | None:
    """vLLM's finish reason in lmiserve's words: an EOS token ends with ``eos_token``, one of the
    request's stop tokens with ``stop_sequence`` (as lmiserve's own engine reports them)."""
    if reason is None:
        return None
    if reason == "stop":
        return "eos_token" if stop_reason is None else "stop_sequence"
    return reason  # "length", "abort"


@dataclass
class SequenceState:
    """What one sequence has reported so far, to turn vLLM's outputs into deltas."""

    request_id: str
    index: int
    prompt_ids: list[int]
    params: wire.SamplingParams
    cumulative: bool = False
    """vLLM reports each output whole (no ``RequestOutputKind.DELTA``): slice what is new."""
    seen: int = 0
    started: bool = False
    prompt_reported: bool = False
    finished: bool = False
    queue_reported: bool = False

    def queue_us(self, output: Any) -> int:
        """MindIE's queue wait of the output's first token: how long vLLM held the request queued
        before scheduling it (its request statistics); a running request waits no further."""
        if self.queue_reported:
            return 0
        self.queue_reported = True
        metrics = getattr(output, "metrics", None)
        queued, scheduled = getattr(metrics, "queued_ts", 0.0), getattr(metrics, "scheduled_ts", 0.0)
        return max(0, int((scheduled - queued) * 1e6)) if queued and scheduled else 0

    def delta(self, output: Any) -> wire.SeqDelta | None:
        """The delta of one vLLM ``RequestOutput``; None when it holds nothing new."""
        if self.finished:
            return None
        completion = output.outputs[0] if output.outputs else None
        ids = list(completion.token_ids) if completion is not None else []
        logprobs = (completion.logprobs if completion is not None else None) or []
        if self.cumulative:
            ids, logprobs = ids[self.seen :], logprobs[self.seen :]
        self.seen += len(ids)
        reason = None
        stop_reason = None
        if completion is not None:
            reason = completion.finish_reason
            stop_reason = getattr(completion, "stop_reason", None)
        if reason is None and getattr(output, "finished", False):
            reason = "abort"
        if reason == "error":
            self.finished = True
            return wire.SeqDelta(
                request_id=self.request_id, index=self.index, finish_reason="error", error="vLLM failed this request"
            )
        delta = wire.SeqDelta(
            request_id=self.request_id,
            index=self.index,
            token_ids=ids,
            finish_reason=finish_reason(reason, stop_reason),
            cumulative_logprob=float(getattr(completion, "cumulative_logprob", None) or 0.0),
        )
        if logprobs:
            delta.logprobs = [_value((entries or {}).get(t)) for t, entries in zip(ids, logprobs)]
            if self.params.logprobs > 0:
                delta.top_logprobs = [_top(entries or {}, self.params.logprobs) for entries in logprobs]
        self._prompt_details(output, delta)
        if not ids and delta.finish_reason is None and delta.prompt_logprobs is None:
            return None
        if not self.started:
            self.started = True
            delta.num_prompt_tokens = len(self.prompt_ids)
            delta.num_cached_tokens = int(getattr(output, "num_cached_tokens", None) or 0)
        self.finished = delta.finish_reason is not None
        return delta

    def _prompt_details(self, output: Any, delta: wire.SeqDelta) -> None:
        rows = getattr(output, "prompt_logprobs", None)
        if self.params.prompt_logprobs is None or self.prompt_reported or not rows:
            return
        self.prompt_reported = True
        values: list[float | None] = [None]
        tops: list[list[wire.TopLogprob]] = []
        k = self.params.prompt_logprobs
        for position, entries in enumerate(rows[1:], start=1):
            token = self.prompt_ids[position] if position < len(self.prompt_ids) else None
            chosen = entries.get(token) if entries else None
            values.append(None if chosen is None else _value(chosen))
            if k > 0:
                tops.append(_top(entries or {}, k))
        delta.prompt_logprobs = values
        if k > 0:
            delta.prompt_top_logprobs = tops


def is_validation_error(exc: BaseException) -> bool:
    """A request vLLM refused (as opposed to a failure while running it)."""
    if isinstance(exc, (ValueError, TypeError)):
        return True
    return any(cls.__name__ in VALIDATION_ERRORS for cls in type(exc).__mro__)


def is_engine_dead(exc: BaseException) -> bool:
    """vLLM's engine is gone (EngineDeadError in V1, AsyncEngineDeadError in V0)."""
    return any(cls.__name__ in ("EngineDeadError", "AsyncEngineDeadError") for cls in type(exc).__mro__)

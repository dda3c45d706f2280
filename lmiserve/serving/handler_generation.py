"""Text generation through a handler model, for the protocols the engine answers.

A model served by handler workers (``option.rolling_batch=disable``, an architecture the
engine does not run, or a user's ``model.py``) answers OpenAI, TGI, MindIE, Databricks and
KServe V2 requests with the same responders as an engine model: :class:`HandlerGeneration`
offers what :func:`~lmiserve.serving.respond` needs of a model (``submit``, ``abort``, the
tokenizer and the chat template). Each request reaches the handler as DJL hands a request
over, in LMI's schema: ``{"inputs": prompt, "parameters": {...}, "stream": true}`` with
``details`` asked, so the built-in handler answers with its token ids; the answer is read by
:class:`~lmiserve.serving.handler_deltas.HandlerDeltas`.

The built-in handler decodes with transformers ``generate``: greedy or sampled (temperature,
typical-p, top-k, top-p, min-p, seed), the repetition, presence and frequency penalties,
``max_new_tokens``, stop strings, each token's log-probability and its top alternatives, the
prompt's log-probabilities; ``n`` choices are ``n`` handler answers. A request asking for
anything else (``best_of`` above ``n``, beams, the prompt's top alternatives, bad words,
guided output) is refused, naming it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import weakref
from pathlib import Path
from typing import Any

import orjson

from .. import wire
from ..errors import LmiServeError, ModelNotReady, NotFound, ValidationFailed
from ..formatters.lmi_dynamic import MAX_SEED
from ..generation.admission import Admission
from ..generation.output_processor import OutputProcessor
from ..generation.request import GenerationRequest
from ..generation.tokenizer import load_tokenizer
from ..model_store import resolve_model
from .engine_model import EngineModel
from .handler_deltas import HandlerDeltas
from .handler_model import HandlerModel
from .model_chat import chat_prompt, chosen_parser, leave_out_thinking
from .model_factory import EMBEDDING_HANDLER, TEXT_GENERATION_HANDLER
from .model_media import ModelMedia

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")

_NEUTRAL = {"min_p": 0.0, "typical_p": 1.0}

DEFAULT_CONTEXT = 2048
"""The context length where neither ``option.max_model_len`` nor the model's config gives one
(the built-in handler's own rule)."""


def unsupported(request: GenerationRequest) -> list[str]:
    """What ``request`` asks that a handler does not apply."""
    p = request.params
    asked = {
        "best_of above n": p.best_of > max(p.n, 1),
        "beam search": p.num_beams > 1,
        "bad words": bool(p.bad_words),
        "top alternatives of prompt tokens": bool(p.prompt_logprobs),
        "guided output (a schema, grammar or required tool call)": p.guided is not None,
        "a LoRA adapter": bool(request.adapter),
    }
    return [name for name, on in asked.items() if on]


def handler_parameters(request: GenerationRequest, index: int = 0) -> dict[str, Any]:
    """The request's parameters in LMI's dynamic-batch schema, ``details`` asked, for its choice
    ``index`` (a seeded request's later choices draw from the seeds after its own)."""
    p = request.params
    out: dict[str, Any] = {"max_new_tokens": p.max_new_tokens, "details": True}
    if p.do_sample:
        out.update(do_sample=True, temperature=p.temperature, top_k=max(p.top_k, 0), top_p=p.top_p)
        out.update({k: getattr(p, k) for k in ("min_p", "typical_p") if getattr(p, k) != _NEUTRAL[k]})
    out.update({k: getattr(p, k) for k in ("presence_penalty", "frequency_penalty") if getattr(p, k)})
    if p.prompt_logprobs is not None:
        out["decoder_input_details"] = True
    if p.logprobs > 0:
        out["top_n_tokens"] = p.logprobs
    if p.ignore_eos:
        out["ignore_eos_token"] = True
    if p.min_new_tokens:
        out["min_new_tokens"] = p.min_new_tokens
    if p.stop_token_ids:
        out["stop_token_ids"] = list(p.stop_token_ids)
    if p.seed is not None:
        out["seed"] = (p.seed + index) % (MAX_SEED + 1)
    if p.repetition_penalty != 1.0:
        out["repetition_penalty"] = p.repetition_penalty
    if request.stop:
        out["stop_sequences"] = list(request.stop)
    return out


class HandlerGeneration:
    """A handler model as a text generator (see the module docstring)."""

    kind = "handler"
    custom_formatters = None
    client = None

    def __init__(self, model: HandlerModel):
        self.model = model
        self.name = model.name
        self.tokenizer: Any = None
        self.max_model_len = 0
        self.media = ModelMedia(model.name, model.settings, "handler")
        self._ids = itertools.count()
        self._streams: weakref.WeakValueDictionary[str, HandlerDeltas] = weakref.WeakValueDictionary()
        """The requests in flight (gone with their answers)."""
        self._lock = asyncio.Lock()

    @property
    def settings(self) -> Any:
        return self.model.settings

    async def load(self) -> None:
        """The model's tokenizer and context length, in this process, once."""
        if self.tokenizer is not None:
            return
        async with self._lock:
            if self.tokenizer is None:
                self.tokenizer, self.max_model_len = await asyncio.to_thread(self._load)

    def _load(self) -> tuple[Any, int]:
        """The built-in handler's model (as its worker finds it); for a user's handler, the model
        ``option.model_id`` names, or the model directory where it holds a tokenizer."""
        cfg, model_dir = self.settings.model, self.settings.model_dir
        builtin = self.model.entry_point == TEXT_GENERATION_HANDLER
        if not builtin and not cfg.model_id and not any((model_dir / f).is_file() for f in TOKENIZER_FILES):
            raise NotFound(f"model {self.name} is served by a handler without a tokenizer; it does not generate text")
        try:
            path = resolve_model(cfg.model_id, model_dir)
            tokenizer = load_tokenizer(path, cfg.trust_remote_code)
        except (OSError, ValueError) as exc:
            raise NotFound(f"model {self.name} has no tokenizer this server can read ({exc})") from None
        return tokenizer, cfg.max_model_len or _context_length(path)

    chat_prompt = chat_prompt
    reasoning_parser = property(chosen_parser)
    """The conversation rendered with the model's chat template (what the engine model does)."""

    def submit(
        self, request: GenerationRequest, budget: float | None = None, tenant: str | None = None
    ) -> tuple[str, OutputProcessor, HandlerDeltas]:
        """Check, tokenize and queue for the handler; errors raise before anything is queued."""
        if self.tokenizer is None:
            raise ModelNotReady(f"model {self.name} is not ready")
        refused = unsupported(request)
        if refused:
            raise ValidationFailed(
                f"model {self.name} is served by a handler (transformers generate), which does not apply: "
                + ", ".join(refused)
            )
        leave_out_thinking(self, request)
        admitted = Admission.for_model(self.settings.engine, self.max_model_len).admit(request, self.tokenizer)
        final = admitted.request
        prompt = final.prompt
        if request.truncate is not None:  # the handler gets the prompt as it was cut
            prompt = self.tokenizer.decode(list(admitted.prompt_ids), skip_special_tokens=True)
        request_id = f"{self.name}-handler-{next(self._ids)}"
        responses = []
        try:
            for index in range(max(final.params.n, 1)):  # one handler answer per choice
                body = {"inputs": prompt, "parameters": handler_parameters(final, index), "stream": True}
                item = wire.JobItem(
                    request_id=f"{request_id}.{index}",
                    properties={"Content-Type": "application/json"},
                    body=orjson.dumps(body),
                )
                responses.append(self.model.submit(item))
        except LmiServeError:
            for response in responses:
                response.finished = True
            raise
        stream = HandlerDeltas(request_id, responses, self._tokenize, final.params.max_new_tokens)
        self._streams[request_id] = stream
        processor = OutputProcessor(self.tokenizer, request_id, final, list(admitted.prompt_ids))
        return request_id, processor, stream

    def _tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def abort(self, request_id: str, index: int | None = None) -> None:
        stream = self._streams.get(request_id) if index is not None else self._streams.pop(request_id, None)
        if stream is not None:
            stream.close(index)


_GENERATORS: weakref.WeakKeyDictionary[HandlerModel, HandlerGeneration] = weakref.WeakKeyDictionary()


async def text_generator(model: HandlerModel) -> HandlerGeneration:
    """The handler model as a text generator, its tokenizer loaded (one per model)."""
    generator = _GENERATORS.get(model)
    if generator is None:
        generator = _GENERATORS[model] = HandlerGeneration(model)
    await generator.load()
    return generator


def _context_length(path: Path) -> int:
    config = (path if path.is_dir() else path.parent) / "config.json"
    try:
        value = json.loads(config.read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return DEFAULT_CONTEXT
    return int(value) if isinstance(value, int) and value > 0 else DEFAULT_CONTEXT


def generates_text(model: Any) -> bool:
    """Whether generation requests go to ``model``: an engine model, or a handler model other than
    the embedding handler."""
    if isinstance(model, HandlerModel):
        return model.entry_point != EMBEDDING_HANDLER
    return isinstance(model, EngineModel)


async def generator_of(model: Any) -> Any:
    """What generates text for ``model``: the engine model itself, or its handler as a
    :class:`HandlerGeneration`; NotFound for a model that does not generate text."""
    if not generates_text(model):
        raise NotFound(f"model {model.name} does not generate text (it is an embedding model)")
    return await text_generator(model) if isinstance(model, HandlerModel) else model

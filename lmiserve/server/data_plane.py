"""What the inference endpoints do, whatever the transport: KServe V2 health, metadata and
inference, and a handler model's answer to a body.

REST routes and the gRPC servicer both call a :class:`DataPlane`; they only translate requests
in and answers (a :class:`~lmiserve.serving.Reply`, or an
:class:`~lmiserve.errors.LmiServeError`) out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from .. import __version__, wire
from ..errors import BadRequest, HandlerFailure, LmiServeError, NotFound
from ..formatters import kserve, kserve_handler, kserve_infer
from ..serving import (
    TEXT_GENERATION_HANDLER,
    EngineModel,
    HandlerModel,
    ModelRegistry,
    Reply,
    ServedModel,
    TextModel,
    generator_of,
    respond,
)
from .errors import stream_error_chunk
from .metrics import ServerMetrics


async def _handler_chunks(stream, content_type: str) -> AsyncIterator[bytes]:  # type: ignore[no-untyped-def]
    try:
        async for chunk in stream.chunks():
            yield chunk
    except LmiServeError as err:
        yield stream_error_chunk(err, content_type)


class DataPlane:
    def __init__(self, registry: ModelRegistry, metrics: ServerMetrics | None = None):
        self.registry = registry
        self.metrics = metrics

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self.registry.ping()[0]

    def model(self, name: str | None, version: str = "") -> ServedModel:
        """The named model (or the only one when no name is given) at ``version``; every
        model has one version, ``1``."""
        model = self.registry.model(name or None)
        if version and version != kserve.MODEL_VERSION:
            raise NotFound(f"model {model.name!r} has no version {version!r} (versions: {kserve.MODEL_VERSION})")
        return model

    @staticmethod
    def takes_tensors(model: ServedModel) -> bool:
        """Whether V2 inference goes to the model's own handler as it came (a user's handler, or
        the embedding handler) rather than to text generation."""
        return isinstance(model, HandlerModel) and model.entry_point != TEXT_GENERATION_HANDLER

    async def text_model(self, name: str | None, version: str = "") -> TextModel:
        """What generates text for the named model (its engine, or the built-in text-generation
        handler); a user's handler answers V2 itself."""
        model = self.model(name, version)
        if self.takes_tensors(model) or not isinstance(model, EngineModel | HandlerModel):
            raise BadRequest(
                f"model {model.name!r} is served by a custom handler; KServe V2 text generation answers for "
                "models on the engine or the built-in text-generation handler"
            )
        return await generator_of(model)

    def model_ready(self, name: str | None, version: str = "") -> bool:
        return self.model(name, version).status == "Healthy"

    def server_metadata(self) -> dict:
        return kserve.server_metadata(__version__)

    def model_metadata(self, name: str | None, version: str = "") -> dict:
        model = self.model(name, version)
        generates = isinstance(model, EngineModel) or (
            isinstance(model, HandlerModel) and not self.takes_tensors(model)
        )
        return kserve.model_metadata(model.name, generates)

    # --- inference ---------------------------------------------------------------------------
    async def infer_reply(
        self,
        model: TextModel,
        request: kserve.InferRequest,
        seconds: float | None = None,
        disconnected: Callable[[], Awaitable[None]] | None = None,
        tenant: str | None = None,
    ) -> tuple[Reply, kserve_infer.InferResponder]:
        """Generate for a V2 inference request: the answer (the REST one), and the responder
        that holds the response or the error. A generation gets the model's
        ``predict_timeout``, or ``seconds`` when that is less; ``tenant`` is who sent it."""
        responder = kserve_infer.InferResponder(kserve_infer.plan(request), model.name)
        observer = self.metrics.observer(model.name) if self.metrics is not None else None
        limit = float(model.settings.model.predict_timeout)
        limit = limit if seconds is None else min(limit, seconds)
        requests = responder.plan.generation_requests()
        return await respond(model, requests, responder, limit, observer, disconnected, tenant), responder

    async def infer(
        self, name: str | None, version: str, request: kserve.InferRequest, seconds: float | None = None
    ) -> kserve.InferResponse:
        """The answer to a V2 inference request, for a transport that sends its own messages."""
        served = self.model(name, version)
        if self.takes_tensors(served):
            return await self.infer_handler(served, request)  # type: ignore[arg-type]
        _, answer = await self.infer_reply(await self.text_model(name, version), request, seconds)
        if answer.error is not None:
            raise answer.error
        assert answer.response is not None
        return answer.response

    async def infer_handler(self, model: HandlerModel, request: kserve.InferRequest) -> kserve.InferResponse:
        """A user's handler gets the V2 request as REST JSON (as DJL's Python engine gets any body)
        and answers with output tensors."""
        item = wire.JobItem(
            request_id=request.id or kserve.new_request_id(),
            properties={"Content-Type": "application/json"},
            body=kserve_handler.request_body(request),
        )
        head, stream = await model.answer(item)
        if head.streaming:
            model.cancel(stream)
            raise HandlerFailure("the handler streamed its answer; V2 inference needs one body of output tensors")
        if head.code != 200:
            raise HandlerFailure(
                f"the handler answered {head.code}: {bytes(head.body or b'')[:500].decode(errors='replace')}"
            )
        return kserve_handler.response_tensors(model.name, request.id, bytes(head.body or b""))

    async def answer_handler(self, model: HandlerModel, item: wire.JobItem) -> Reply:
        """A handler model's answer to a body as it came: the handler's status, headers and body,
        streamed when the handler streams (a failure after the first byte ends the stream with
        LMI's error line)."""
        head, stream = await model.answer(item)
        if head.streaming:
            content_type = next((v for k, v in head.headers.items() if k.lower() == "content-type"), "")
            chunks = _handler_chunks(stream, content_type)
            return Reply(head.code, media_type=None, headers=head.headers, chunks=chunks)
        return Reply(head.code, head.body, None, head.headers)

"""What the KServe V2 endpoints do, whatever the transport: health, metadata and inference.

REST routes and the gRPC servicer both call a :class:`DataPlane`; they only translate
requests in and answers (or :class:`~lmiserve.errors.LmiServeError`) out.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ... import __version__, wire
from ...errors import BadRequest, HandlerFailure, NotFound
from ...formatters import kserve, kserve_handler
from ...serving import (
    DeadlinePassed,
    EngineModel,
    HandlerModel,
    ModelRegistry,
    ServedModel,
    expired,
    output_error,
    run_to_end,
    submit_all,
    unless_gone,
)
from ..metrics import ServerMetrics


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

    def engine_model(self, name: str | None, version: str = "") -> EngineModel:
        model = self.model(name, version)
        if not isinstance(model, EngineModel):
            raise BadRequest(
                f"model {model.name!r} is served by a custom handler; KServe V2 inference answers for "
                "text-generation models on the engine only"
            )
        return model

    def model_ready(self, name: str | None, version: str = "") -> bool:
        return self.model(name, version).status == "Healthy"

    def server_metadata(self) -> dict:
        return kserve.server_metadata(__version__)

    def model_metadata(self, name: str | None, version: str = "") -> dict:
        model = self.model(name, version)
        return kserve.model_metadata(model.name, isinstance(model, EngineModel))

    async def infer(
        self,
        name: str | None,
        version: str,
        request: kserve.InferRequest,
        seconds: float | None = None,
        disconnected: Callable[[], Awaitable[None]] | None = None,
    ) -> kserve.InferResponse | None:
        """The answer, or None when the client went away first (what ran for it is stopped).
        A generation gets the model's ``predict_timeout``, or ``seconds`` when that is less."""
        served = self.model(name, version)
        if isinstance(served, HandlerModel):
            return await unless_gone(self.infer_handler(served, request), disconnected)
        model = self.engine_model(name, version)
        plan = kserve.plan(request)
        observer = self.metrics.observer(model.name) if self.metrics is not None else None
        limit = float(model.settings.model.predict_timeout)
        limit = limit if seconds is None else min(limit, seconds)
        gens = submit_all(model, plan.generation_requests())
        try:
            outs = await run_to_end(model, gens, limit, observer, disconnected)
        except DeadlinePassed:
            raise expired([g.output for g in gens], limit) from None
        if outs is None:
            return None
        failed = next((o for o in outs if o.error is not None), None)
        if failed is not None:
            raise output_error(failed)
        return plan.response(model.name, [plan.text(o) for o in outs])

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

"""The KServe V2 gRPC service (``inference.GRPCInferenceService``), run by grpc.aio in the
HTTP server's event loop on ``grpc_port``.

Messages are translated to and from :mod:`lmiserve.formatters.kserve` structures and answered
by the :class:`~lmiserve.server.data_plane.DataPlane`; errors become gRPC status codes in :func:`grpc_status`.
A request that sends ``raw_input_contents`` gets ``raw_output_contents`` back.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

# Child processes are started with fork+exec only; grpc's fork handlers would just log that
# they skip themselves each time. Set before grpc is first imported; the environment still wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc  # noqa: E402

from ...config import Settings
from ...errors import BadRequest, LmiServeError
from ...formatters import kserve
from ...serving import ModelRegistry
from ..data_plane import DataPlane
from ..metrics import ServerMetrics
from ..security import ApiKeys
from ..tls import ServerTls
from . import grpc_predict_v2_pb2 as pb
from . import grpc_predict_v2_pb2_grpc as pb_grpc
from .auth import ApiKeyInterceptor

log = logging.getLogger("lmiserve.grpc")

GRACE_S = 5.0
_CODES = {
    "bad_request": grpc.StatusCode.INVALID_ARGUMENT,
    "validation": grpc.StatusCode.INVALID_ARGUMENT,
    "payload_too_large": grpc.StatusCode.INVALID_ARGUMENT,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "conflict": grpc.StatusCode.ALREADY_EXISTS,
    "overloaded": grpc.StatusCode.UNAVAILABLE,
    "not_ready": grpc.StatusCode.UNAVAILABLE,
    "worker_died": grpc.StatusCode.UNAVAILABLE,
    "timeout": grpc.StatusCode.DEADLINE_EXCEEDED,
}


def grpc_status(err: LmiServeError) -> grpc.StatusCode:
    """The gRPC status code of an error (INTERNAL for anything not listed)."""
    return _CODES.get(err.kind, grpc.StatusCode.INTERNAL)


# --- messages ----------------------------------------------------------------------------


def _value(p: pb.InferParameter) -> Any:
    which = p.WhichOneof("parameter_choice")
    return getattr(p, which) if which else None


def _parameters(params: Any) -> dict[str, Any]:
    return {key: _value(value) for key, value in params.items()}


def infer_request(msg: pb.ModelInferRequest) -> kserve.InferRequest:
    raw = list(msg.raw_input_contents)
    if raw and len(raw) != len(msg.inputs):
        raise BadRequest(f"raw_input_contents has {len(raw)} entries for {len(msg.inputs)} inputs")
    tensors = []
    for i, t in enumerate(msg.inputs):
        if raw:
            if t.HasField("contents"):
                raise BadRequest(f"input {t.name!r}: contents must be empty when raw_input_contents is used")
            data = kserve.decode_raw(t.datatype, raw[i], t.name)
        elif t.datatype in kserve.CONTENTS_FIELD:
            data = list(getattr(t.contents, kserve.CONTENTS_FIELD[t.datatype]))
        elif t.datatype in kserve.DATATYPES:
            raise BadRequest(f"input {t.name!r}: {t.datatype} tensors travel in raw_input_contents only")
        else:
            data = []  # make_tensor names the unknown datatype
        tensors.append(kserve.make_tensor(t.name, t.datatype, list(t.shape), data, _parameters(t.parameters)))
    outputs = [kserve.RequestedOutput(o.name, _parameters(o.parameters)) for o in msg.outputs]
    return kserve.InferRequest(msg.id, tensors, _parameters(msg.parameters), outputs or None)


def infer_response(resp: kserve.InferResponse, raw: bool) -> pb.ModelInferResponse:
    msg = pb.ModelInferResponse(model_name=resp.model_name, model_version=resp.model_version, id=resp.id)
    for o in resp.outputs:
        tensor = msg.outputs.add(name=o.name, datatype=o.datatype, shape=o.shape)
        if raw:
            msg.raw_output_contents.append(kserve.encode_raw(o.datatype, o.data))
        else:
            values = [v.encode() for v in o.data] if o.datatype == kserve.BYTES else o.data
            getattr(tensor.contents, kserve.CONTENTS_FIELD[o.datatype]).extend(values)
    return msg


def _tensors(items: list[dict[str, Any]]) -> list[pb.ModelMetadataResponse.TensorMetadata]:
    return [pb.ModelMetadataResponse.TensorMetadata(**t) for t in items]


# --- the service -------------------------------------------------------------------------

Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Any]]


def _rpc(method: Handler) -> Handler:
    """Answer an error as a gRPC status: the error's code and its detail."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except LmiServeError as err:
            await context.abort(grpc_status(err), err.detail)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # noqa: BLE001 - any other failure is INTERNAL, the server goes on
            log.exception("gRPC %s failed", method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")

    return wrapper


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, registry: ModelRegistry, metrics: ServerMetrics | None = None):
        self.plane = DataPlane(registry, metrics)

    @_rpc
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.plane.live())

    @_rpc
    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.plane.ready())

    @_rpc
    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.plane.model_ready(request.name, request.version))

    @_rpc
    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(**self.plane.server_metadata())

    @_rpc
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        meta = self.plane.model_metadata(request.name, request.version)
        return pb.ModelMetadataResponse(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=_tensors(meta["inputs"]),
            outputs=_tensors(meta["outputs"]),
        )

    @_rpc
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        # the client's gRPC deadline, if it set one, caps the model's predict_timeout; a cancelled
        # call cancels this coroutine, which stops the generation
        remaining = context.time_remaining()
        resp = await self.plane.infer(request.model_name, request.model_version, infer_request(request), remaining)
        return infer_response(resp, raw=bool(request.raw_input_contents))


# --- start and stop ----------------------------------------------------------------------


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def start_grpc(
    registry: ModelRegistry, settings: Settings, metrics: ServerMetrics | None = None
) -> grpc.aio.Server | None:
    """Serve gRPC on ``grpc_port`` (None when it is 0 or the HTTP port). If the port is taken,
    a configured ``grpc_port`` stops start-up; the default one only logs an error."""
    host, port = settings.server.host, settings.server.grpc_port
    if not port:
        return None
    if port == settings.server.port:
        log.warning("grpc_port %d is the HTTP port; the KServe V2 gRPC service is off", port)
        return None
    limit = settings.server.max_request_size
    keys = ApiKeys.from_settings(settings)
    server = grpc.aio.server(
        interceptors=[ApiKeyInterceptor(keys)] if keys.enabled else None,
        options=[
            ("grpc.so_reuseport", 0),  # a port another server holds is an error, not shared
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", -1),
        ],
    )
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(registry, metrics), server)
    address = _address(host, port)
    tls = ServerTls.from_settings(settings)
    try:
        bound = server.add_secure_port(address, tls.grpc_credentials()) if tls else server.add_insecure_port(address)
    except RuntimeError as exc:
        bound, reason = 0, str(exc)
    else:
        reason = "the port is in use"
    if not bound:
        source = settings.sources.get("grpc_port")
        message = f"cannot serve gRPC on {address}: {reason}; choose another grpc_port, or 0 to turn gRPC off"
        log.error(message)
        if source is not None and source.kind != "default":
            raise RuntimeError(message)
        log.error("the KServe V2 gRPC service is off; the HTTP routes are served")
        return None
    await server.start()
    log.info("KServe V2 gRPC (inference.GRPCInferenceService) on %s%s", address, " over TLS" if tls else "")
    return server


async def stop_grpc(server: grpc.aio.Server | None) -> None:
    if server is not None:
        await server.stop(GRACE_S)

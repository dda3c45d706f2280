"""API keys on the KServe V2 gRPC service: the ``authorization`` metadata (``Bearer KEY``) or
``x-api-key``, checked like the HTTP routes'; ServerLive and ServerReady stay open."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from ..security import ApiKeys, presented_key

SERVICE = "/inference.GRPCInferenceService/"
OPEN_METHODS = frozenset({SERVICE + "ServerLive", SERVICE + "ServerReady"})


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Answers UNAUTHENTICATED to a call without a valid key (every method of the service is unary)."""

    def __init__(self, keys: ApiKeys):
        self.keys = keys

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method in OPEN_METHODS:
            return handler
        metadata = {
            k.lower().encode(): (v if isinstance(v, bytes) else v.encode("latin-1"))
            for k, v in (details.invocation_metadata or ())
        }
        if self.keys.check(presented_key(metadata)):
            return handler

        async def deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a valid API key is required")

        return grpc.unary_unary_rpc_method_handler(
            deny,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

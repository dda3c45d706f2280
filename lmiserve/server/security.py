"""API keys, the management API's reach, and where models may be loaded from.

With API keys configured (``api_keys`` / ``SERVING_API_KEYS``, ``api_keys_file``) every route but
``/ping`` and the health routes asks for ``Authorization: Bearer KEY`` or ``X-Api-Key: KEY``;
keys are compared in constant time against every configured key. A missing or wrong key gets
401 with ``WWW-Authenticate: Bearer`` in the error shape of the route's protocol. The
management API (``/models``) answers loopback clients only unless ``management_api=on``.
Keys never reach a log line or an error message.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import re
from pathlib import Path

from ..config import ConfigError, Settings
from ..errors import Forbidden, LmiServeError, NotFound, Unauthorized
from .asgi import HttpMiddleware
from .errors import error_response

log = logging.getLogger("lmiserve.security")

OPEN_PATHS = frozenset({"/ping", "/health", "/v2/health/live", "/v2/health/ready"})
BODY_LOG_LIMIT = 4096
_TGI_PATHS = frozenset({"/", "/generate", "/generate_stream", "/tokenize", "/info"})


class ApiKeys:
    """The configured keys, kept as SHA-256 digests so that every comparison has the same length."""

    def __init__(self, keys: list[str]):
        self._digests = [hashlib.sha256(k.encode()).digest() for k in keys if k]

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiKeys:
        server = settings.server
        keys = [k.strip() for k in (server.api_keys.get_secret_value() if server.api_keys else "").split(",")]
        if server.api_keys_file:
            path = Path(server.api_keys_file)
            try:
                text = path.read_text()
            except OSError as exc:
                raise ConfigError(f"api_keys_file {path}: cannot be read ({exc.strerror})") from None
            keys += [line.split("#", 1)[0].strip() for line in text.splitlines()]
        return cls([k for k in keys if k])

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def __len__(self) -> int:
        return len(self._digests)

    def check(self, presented: str | None) -> bool:
        """Whether ``presented`` is one of the keys; compares against all of them, always."""
        digest = hashlib.sha256((presented or "").encode()).digest()
        found = False
        for known in self._digests:
            found |= hmac.compare_digest(digest, known)
        return found and presented is not None


def presented_key(headers: dict[bytes, bytes]) -> str | None:
    auth = headers.get(b"authorization")
    if auth:
        scheme, _, value = auth.decode("latin-1").partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    key = headers.get(b"x-api-key")
    return key.decode("latin-1").strip() if key else None


def protocol_for_path(path: str) -> str:
    """The protocol whose error body a refused request gets, from its path alone."""
    if path.startswith("/v1/") or path == "/detokenize":
        return "openai"
    if path == "/v2" or path.startswith("/v2/"):
        return "kserve"
    if path.startswith("/serving-endpoints/"):
        return "databricks"
    if path in _TGI_PATHS:
        return "tgi"
    return "lmi"


def is_management(path: str) -> bool:
    """The management API's paths (models and adapters); ``/models/{name}/invoke`` (multi-model
    inference) is not one."""
    if path == "/adapters" or path.startswith("/adapters/"):
        return True
    return path == "/models" or (path.startswith("/models/") and not _INVOKE.match(path))


def management_reach(settings: Settings) -> str:
    """``management_api``; in multi-model mode ``on`` unless set, since SageMaker's own load and
    unload calls come from outside the container."""
    if settings.server.multi_model and str(settings.sources.get("management_api", "default")) == "default":
        return "on"
    return settings.server.management_api


_INVOKE = re.compile(r"^/models/[^/]+/invoke$")


def is_loopback(scope) -> bool:  # type: ignore[no-untyped-def]
    client = scope.get("client")
    if not client:
        return False
    try:
        return ipaddress.ip_address(client[0]).is_loopback
    except ValueError:
        return False


class SecurityMiddleware(HttpMiddleware):
    """Refuses requests without a valid key (401) and management calls the configuration does not
    allow (404 when off, 403 from a non-loopback client when local)."""

    def __init__(self, app, keys: ApiKeys, management: str = "local", log_bodies: bool = False):  # type: ignore[no-untyped-def]
        super().__init__(app)
        self.keys = keys
        self.management = management
        self.log_bodies = log_bodies

    async def http(self, scope, receive, send):  # type: ignore[no-untyped-def]
        path = scope.get("path", "")
        error = self._refusal(scope, path)
        if error is not None:
            response = error_response(error, "lmi" if is_management(path) else protocol_for_path(path))
            return await response(scope, receive, send)
        if self.log_bodies:
            receive = _logging_receive(scope, receive)
        return await self.app(scope, receive, send)

    def _refusal(self, scope, path: str) -> LmiServeError | None:  # type: ignore[no-untyped-def]
        if path in OPEN_PATHS:
            return None
        if is_management(path):
            if self.management == "off":
                return NotFound(f"{scope.get('method', 'GET')} {path}: the management API is off")
            if self.management == "local" and not is_loopback(scope):
                return Forbidden("the management API answers clients on this host only (management_api=local)")
        if self.keys.enabled and not self.keys.check(presented_key(dict(scope.get("headers") or []))):
            return Unauthorized()
        return None


def _logging_receive(scope, receive):  # type: ignore[no-untyped-def]
    """``receive`` that logs the request's first ``BODY_LOG_LIMIT`` bytes once the body is read."""
    seen = bytearray()

    async def wrapped():  # type: ignore[no-untyped-def]
        message = await receive()
        if message["type"] == "http.request":
            if len(seen) < BODY_LOG_LIMIT:
                seen.extend(message.get("body", b"")[: BODY_LOG_LIMIT - len(seen)])
            if not message.get("more_body"):
                log.info("%s %s body: %s", scope.get("method"), scope.get("path"), seen.decode("utf-8", "replace"))
        return message

    return wrapped

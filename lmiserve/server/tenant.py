"""Who a generation request is for: its tenant, where requests are shared fairly among tenants.

The header named by ``tenant_header`` names the tenant (a request without it belongs to the
tenant ""). Without that setting but with API keys configured, each key is a tenant, known by a
digest of the key (never the key itself). Otherwise there are no tenants (None).
"""

from __future__ import annotations

import hashlib

from starlette.requests import Request

from ..config import Settings
from .security import presented_key

MAX_TENANT_CHARS = 128


def tenant_of(request: Request, settings: Settings) -> str | None:
    server = settings.server
    if server.tenant_header:
        return request.headers.get(server.tenant_header, "")[:MAX_TENANT_CHARS]
    if (server.api_keys is not None and server.api_keys.get_secret_value().strip()) or server.api_keys_file:
        key = presented_key({k.lower(): v for k, v in request.headers.raw})
        return "key:" + hashlib.sha256((key or "").encode()).hexdigest()[:16]
    return None

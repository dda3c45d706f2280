"""A request's tenant: the configured header, else the API key it presents (by digest), else none."""

from types import SimpleNamespace

from starlette.requests import Request

from lmiserve.config.server_settings import ServerSettings
from lmiserve.server.tenant import tenant_of


def request(**headers: str) -> Request:
    raw = [(k.replace("_", "-").lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/invocations", "headers": raw})


def settings(**server) -> SimpleNamespace:
    return SimpleNamespace(server=ServerSettings(**server))


def test_no_tenants_unless_configured():
    assert tenant_of(request(x_tenant_id="a"), settings()) is None


def test_the_configured_header_names_the_tenant():
    s = settings(tenant_header="X-Tenant-Id")
    assert tenant_of(request(x_tenant_id="acme"), s) == "acme"
    assert tenant_of(request(), s) == ""


def test_with_api_keys_each_key_is_a_tenant_never_named_by_the_key_itself():
    s = settings(api_keys="k1,k2")
    one, two = tenant_of(request(authorization="Bearer k1"), s), tenant_of(request(x_api_key="k2"), s)
    assert one and two and one != two
    assert tenant_of(request(x_api_key="k1"), s) == one
    assert "k1" not in one

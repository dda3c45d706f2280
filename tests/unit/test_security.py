"""API keys, the management API's reach, model roots and remote code, on the app in-process."""

import contextlib
import json
import os

import pytest
from starlette.testclient import TestClient

from lmiserve.config import load_settings
from lmiserve.config.show import render
from lmiserve.errors import Forbidden
from lmiserve.server.app import create_app
from lmiserve.server.security import ApiKeys
from lmiserve.serving.handler_model import ModelLoadError
from lmiserve.serving.model_admin import model_location
from lmiserve.serving.model_factory import build_model
from lmiserve.serving.model_paths import remote_code_refusal
from lmiserve.serving.registry import ModelRegistry

KEY = "k-3f9a1c0e5d7b"


def settings_for(tmp_path, **env):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    return load_settings(model, env={k.upper(): v for k, v in env.items()}, cli={})


def client_for(settings, host="127.0.0.1"):
    """The app without its lifespan (no model, no gRPC), seen from ``host``."""
    return contextlib.closing(TestClient(create_app(ModelRegistry(), settings), client=(host, 40000)))


@pytest.fixture
def keyed(tmp_path):
    with client_for(settings_for(tmp_path, serving_api_keys=f"other-key, {KEY}")) as c:
        yield c


# --- API keys ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "check"),
    [
        ("/invocations", lambda b: b["code"] == 401 and b["message"] == "Unauthorized"),
        ("/predictions/m", lambda b: b["code"] == 401 and "error" in b),
        ("/v1/chat/completions", lambda b: b["error"]["type"] == "invalid_request_error" and b["error"]["code"] == 401),
        ("/generate", lambda b: b["error_type"] == "unauthorized"),
        ("/v2/models/m/infer", lambda b: set(b) == {"error"}),
        ("/serving-endpoints/m/invocations", lambda b: b["error_code"] == "UNAUTHENTICATED"),
    ],
)
def test_missing_key_is_401_in_the_protocol_shape(keyed, path, check):
    r = keyed.post(path, json={"inputs": "hi"})
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert check(r.json())
    assert KEY not in r.text


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {KEY}"},
        {"Authorization": f"Bearer {KEY}x"},
        {"Authorization": "Bearer "},
        {"X-Api-Key": KEY[:-1]},
    ],
)
def test_wrong_key_is_401(keyed, headers):
    r = keyed.post("/invocations", json={"inputs": "hi"}, headers=headers)
    assert r.status_code == 401 and KEY not in r.text


@pytest.mark.parametrize(
    "headers", [{"Authorization": f"Bearer {KEY}"}, {"authorization": f"bearer {KEY}"}, {"X-Api-Key": KEY}]
)
def test_right_key_passes(keyed, headers):
    r = keyed.post("/predictions/nope", json={"inputs": "hi"}, headers=headers)
    assert r.status_code == 404  # past the key check, to the route: no such model
    assert keyed.get("/models", headers=headers).status_code == 200


@pytest.mark.parametrize("path", ["/ping", "/health", "/v2/health/live", "/v2/health/ready"])
def test_health_routes_stay_open(keyed, path):
    assert keyed.get(path).status_code != 401


def test_metrics_and_management_need_the_key(keyed):
    assert keyed.get("/metrics").status_code == 401
    assert keyed.get("/models").status_code == 401
    assert keyed.post("/models", params={"url": "/tmp"}).status_code == 401


def test_no_keys_configured_no_key_asked(tmp_path):
    with client_for(settings_for(tmp_path)) as c:
        assert c.post("/predictions/nope", json={}).status_code == 404


def test_keys_from_a_file(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"# keys of the team\n\n  {KEY}  # main\nsecond\n")
    with client_for(settings_for(tmp_path, serving_api_keys_file=str(keys))) as c:
        assert c.get("/models", headers={"X-Api-Key": KEY}).status_code == 200
        assert c.get("/models", headers={"X-Api-Key": "second"}).status_code == 200
        assert c.get("/models", headers={"X-Api-Key": "# keys of the team"}).status_code == 401
        assert c.get("/models").status_code == 401


def test_unreadable_keys_file_is_a_clear_error(tmp_path):
    settings = settings_for(tmp_path, serving_api_keys_file=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="api_keys_file .*missing: cannot be read"):
        ApiKeys.from_settings(settings)


def test_key_check_compares_whole_keys():
    keys = ApiKeys(["abc", "", "defg"])
    assert len(keys) == 2
    assert keys.check("abc") and keys.check("defg")
    assert not keys.check("ab") and not keys.check("abcd") and not keys.check("") and not keys.check(None)
    assert not ApiKeys([]).enabled and not ApiKeys([]).check("")


def test_config_show_never_prints_keys(tmp_path):
    settings = settings_for(tmp_path, serving_api_keys=KEY)
    text = render(settings)
    assert "api_keys" in text and KEY not in text
    assert KEY not in repr(settings.server)


# --- the management API ----------------------------------------------------------------------


def test_management_local_by_default_refuses_remote_clients(tmp_path):
    settings = settings_for(tmp_path)
    assert settings.server.management_api == "local"
    with client_for(settings, host="10.1.2.3") as c:
        for method, path in [("GET", "/models"), ("POST", "/models"), ("PUT", "/models/m"), ("DELETE", "/models/m")]:
            r = c.request(method, path, params={"url": "/tmp"})
            assert r.status_code == 403, (method, path)
            assert "management_api=local" in r.json()["error"]
        assert c.post("/predictions/nope", json={}).status_code == 404  # inference is not affected
    with client_for(settings, host="::1") as c:
        assert c.get("/models").status_code == 200


def test_management_off_and_on(tmp_path):
    with client_for(settings_for(tmp_path, serving_management_api="off")) as c:
        assert c.get("/models").status_code == 404
        assert c.post("/models", params={"url": "/tmp"}).status_code == 404
    with client_for(settings_for(tmp_path, serving_management_api="on"), host="10.1.2.3") as c:
        assert c.get("/models").status_code == 200


# --- model roots ---------------------------------------------------------------------------


def test_registration_stays_inside_model_roots(tmp_path):
    root = tmp_path / "root"
    (root / "m").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "link").symlink_to(outside)
    roots = [root.resolve()]
    assert model_location(str(root / "m"), roots) == ((root / "m").resolve(), None)
    assert model_location(f"file://{root}/m", roots)[0] == (root / "m").resolve()
    for url in [str(outside), f"{root}/m/../../outside", f"file://{root}/../outside", str(root / "link"), "/etc"]:
        with pytest.raises(Forbidden, match="model_roots"):
            model_location(url, roots)


def test_default_model_root_is_the_model_directory(tmp_path):
    settings = settings_for(tmp_path)
    from lmiserve.serving.model_paths import model_roots

    assert model_roots(settings) == [settings.model_dir.resolve()]
    configured = settings_for(tmp_path, serving_model_roots=f"{tmp_path}/a, {tmp_path}/b")
    assert model_roots(configured) == [(tmp_path / "a").resolve(), (tmp_path / "b").resolve()]


# --- remote code -----------------------------------------------------------------------------


def custom_code_model(tmp_path, properties=""):
    d = tmp_path / "custom"
    d.mkdir()
    config = {"architectures": ["MyModel"], "auto_map": {"AutoModelForCausalLM": "modeling_my.MyModel"}}
    (d / "config.json").write_text(json.dumps(config))
    (d / "modeling_my.py").write_text("raise SystemExit('remote code ran')\n")
    (d / "serving.properties").write_text(properties)
    return d


def test_trust_remote_code_is_off_by_default(tmp_path):
    assert settings_for(tmp_path).model.trust_remote_code is False


def test_custom_code_model_refused_without_trust_remote_code(tmp_path):
    d = custom_code_model(tmp_path)
    settings = load_settings(d, env={}, cli={})
    with pytest.raises(ModelLoadError, match="option.trust_remote_code=true"):
        build_model(settings)
    trusted = load_settings(d, env={}, cli={"option.trust_remote_code": "true"})
    assert remote_code_refusal(trusted) is None


def test_environment_secrets_absent_from_settings_text(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value")
    settings = load_settings(tmp_path, env=dict(os.environ), cli={})
    assert "aws-secret-value" not in render(settings)

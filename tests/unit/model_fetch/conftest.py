from __future__ import annotations

import pytest

from tests.hub_server import HubServer


@pytest.fixture(scope="module")
def hub():
    server = HubServer()
    yield server
    server.stop()


@pytest.fixture
def hub_env(hub, monkeypatch):
    """This process talks to the loopback Hub, with no token unless a test sets one."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # make test runs with HF_HUB_OFFLINE=1
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_TOKEN_PATH", "/nonexistent/token")  # no stored login either
    return hub


@pytest.fixture(scope="module")
def s3_server():
    from tests.aws.s3_server import S3Server

    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """This process's S3 is the loopback server (credentials from the environment)."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    s3_server.denied.clear()
    s3_server.bytes_per_s = None
    return s3_server

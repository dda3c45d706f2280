"""Downloads go through the proxy the environment names (HTTP_PROXY), as huggingface_hub's and
boto3's own requests do, and around it for the hosts NO_PROXY names."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from lmiserve.model_fetch import FetchOptions, fetch_model
from lmiserve.model_fetch.connections import Connections
from tests.aws.quiet_server import QuietHTTPServer


class ForwardingProxy:
    """A plain HTTP proxy on 127.0.0.1: absolute-URI GETs forwarded, each URL recorded."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        proxy = self
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                proxy.seen.append(self.path)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "proxy-connection")}
                try:
                    answer = direct.open(urllib.request.Request(self.path, headers=headers), timeout=30)
                except urllib.error.HTTPError as error:
                    answer = error
                body = answer.read()
                self.send_response(answer.status if hasattr(answer, "status") else answer.code)
                for key, value in answer.headers.items():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = QuietHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def proxy():
    server = ForwardingProxy()
    yield server
    server.stop()


def test_the_files_come_through_the_proxy_the_environment_names(hub_env, proxy, tmp_path: Path, monkeypatch):
    hub_env.add("org/proxied", {"config.json": b"{}", "model.safetensors": b"w" * 3000})
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    path = fetch_model("org/proxied", None, FetchOptions(download_dir=tmp_path))
    assert (path / "model.safetensors").read_bytes() == b"w" * 3000
    assert any(url.endswith("/org/proxied/resolve/" + path.name + "/model.safetensors") for url in proxy.seen)


def test_no_proxy_hosts_are_reached_directly(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "s3.internal")
    connections = Connections(2)
    assert connections.proxy_for("https://huggingface.co/x") == "http://proxy.internal:3128"
    assert connections.proxy_for("https://s3.internal/bucket/key") is None
    assert connections.proxy_for("http://plain.example/x") is None  # no HTTP_PROXY

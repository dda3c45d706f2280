"""HTTPS and TLS gRPC (``ssl_certfile``, ``ssl_keyfile``, ``ssl_ca_certs``), as MindIE's documents
address the server (``https://{ip}:{port}``): real clients over TLS with a certificate made by the
test, mutual TLS refusing a client without a certificate of the CA, plain HTTP failing at once
rather than hanging, and clear start-up errors for a missing or mismatched key."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from tests.integration.engine_server import serving_dir
from tests.server_process import ServerProcess, free_port
from tests.tls_certs import make_certs

PROMPT = "What is Deep Learning?"


def trust(certs, cert: tuple[str, str] | None = None) -> ssl.SSLContext:
    """A client's TLS context: the test CA, and a client certificate when given."""
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    if cert is not None:
        ctx.load_cert_chain(*cert)
    return ctx


class TlsServer(ServerProcess):
    """A server on https, asked (its /ping too) with the test CA and the client certificate, if any."""

    def __init__(self, model_dir, certs, client_cert=None, env=None):
        self.certs, self.client_cert = certs, client_cert
        self.grpc_port = free_port()
        super().__init__(model_dir, env={"SERVING_GRPC_PORT": str(self.grpc_port), **(env or {})})
        self.url = f"https://127.0.0.1:{self.port}"

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, verify=trust(self.certs, kwargs.pop("cert", self.client_cert)),
            timeout=kwargs.pop("timeout", 60), **kwargs,
        )  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def tls_properties(certs, mutual: bool = False) -> str:
    text = f"ssl_certfile={certs.server_cert}\noption.ssl_keyfile={certs.server_key}\n"
    return text + (f"ssl_ca_certs={certs.ca}\n" if mutual else "")


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_llama_dir, certs):
    # also MindIE's fullTextEnabled, on this server rather than a server of its own
    extra = tls_properties(certs) + "option.full_text_enabled=true\n"
    root = serving_dir(tmp_path_factory.mktemp("tls") / "m", tiny_llama_dir, extra)
    with TlsServer(root, certs) as s:
        s.wait_ready()
        yield s


def test_the_openai_client_streams_over_https(server):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="none", http_client=httpx.Client(verify=str(server.certs.ca)))
    chunks = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=5, stream=True, temperature=0
    ))  # fmt: skip
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].delta.content or "" for c in chunks)
    assert "on https://" in server.log()


def test_tgis_client_streams_over_https(server, monkeypatch):
    from text_generation import Client

    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(server.certs.ca))  # what the client's requests read
    tokens = list(Client(server.url + "/generate_stream").generate_stream(PROMPT, max_new_tokens=4))
    assert len(tokens) == 4 and tokens[-1].details.finish_reason == "length"


def test_mindie_full_text_stream_and_kserve_generate_stream_over_https(server):
    """option.full_text_enabled (MindIE's fullTextEnabled): each event's token.text is the text so far."""
    with server.client() as c:
        body = {"inputs": PROMPT, "stream": True, "parameters": {"max_new_tokens": 3}}
        r = c.post("/", json=body)
        events = [json.loads(line[len("data: ") :]) for line in r.text.split("\n\n") if line]
        assert r.status_code == 200 and len(events) == 3
        texts = [e["token"]["text"] for e in events]
        assert texts[-1] == events[-1]["generated_text"] and all(b.startswith(a) for a, b in zip(texts, texts[1:]))
        plain = c.post("/generate_stream", json=body)  # TGI's route: the new text only
        pieces = [json.loads(line[len("data:") :])["token"]["text"] for line in plain.text.split("\n\n") if line]
        assert "".join(pieces) == texts[-1]
        with c.stream("POST", "/v2/models/tiny/generate_stream", json={"text_input": PROMPT, "max_tokens": 3}) as r:
            assert r.status_code == 200 and sum(1 for line in r.iter_lines() if line.startswith("data:")) >= 1


def test_tritonclient_grpc_infers_over_tls(server):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(
        f"127.0.0.1:{server.grpc_port}", ssl=True, root_certificates=str(server.certs.ca)
    )
    prompt = grpcclient.InferInput("text_input", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([PROMPT.encode()], dtype=np.object_))
    result = client.infer("tiny", [prompt], parameters={"max_tokens": 4, "temperature": 0})
    assert result.as_numpy("text_output")[0]
    assert "over TLS" in server.log()


def test_plain_http_and_a_client_that_does_not_trust_the_certificate_fail_at_once(server):
    started = time.monotonic()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{server.port}/ping", timeout=10)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(server.url + "/ping", timeout=10)
    assert time.monotonic() - started < 10  # a failure, not a wait for the timeout


def test_mutual_tls_refuses_a_client_without_the_cas_certificate(tmp_path, tiny_llama_dir, certs):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    root = serving_dir(tmp_path / "m", tiny_llama_dir, tls_properties(certs, mutual=True))
    mine = (str(certs.client_cert), str(certs.client_key))
    with TlsServer(root, certs, client_cert=mine) as s:
        s.wait_ready()
        with s.client() as c:
            assert c.post("/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 2}}).status_code == 200
        for cert in (None, (str(certs.stranger_cert), str(certs.stranger_key))):
            with pytest.raises(httpx.HTTPError), s.client(cert=cert) as c:
                c.get("/ping")
        address = f"127.0.0.1:{s.grpc_port}"
        good = grpcclient.InferenceServerClient(
            address, ssl=True, root_certificates=str(certs.ca), private_key=mine[1], certificate_chain=mine[0]
        )
        assert good.is_server_live()
        bare = grpcclient.InferenceServerClient(address, ssl=True, root_certificates=str(certs.ca))
        with pytest.raises(InferenceServerException):
            bare.is_server_live()


@pytest.mark.parametrize(
    "lines,message",
    [
        (lambda c: f"ssl_certfile={c.server_cert}\nssl_keyfile={c.other_key}\n", "does not match ssl_certfile"),
        (
            lambda c: f"ssl_certfile={c.server_cert}\nssl_keyfile=/nope/key.pem\n",
            "ssl_keyfile /nope/key.pem: no such file",
        ),
        (lambda c: f"ssl_certfile={c.server_cert}\n", "ssl_certfile needs ssl_keyfile"),
        (lambda c: f"ssl_keyfile={c.server_key}\n", "need ssl_certfile"),
    ],
    ids=["mismatched-key", "missing-key", "no-key", "no-certificate"],
)
def test_a_missing_or_mismatched_key_stops_start_up_with_the_setting_named(
    tmp_path, tiny_llama_dir, certs, lines, message
):
    root = serving_dir(tmp_path / "m", tiny_llama_dir, lines(certs))
    cmd = [sys.executable, "-m", "lmiserve", "serve", "--model-dir", str(root), "--port", str(free_port())]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "SERVING_GRPC_PORT": "0"}
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stdout + done.stderr

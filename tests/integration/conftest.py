import pytest

from tests.integration.engine_server import start
from tests.server_process import free_port


@pytest.fixture(scope="session")
def engine_server(tiny_llama_dir, tmp_path_factory):
    """One server on the tiny Llama with the engine's default settings and a gRPC port, shared by the
    protocol modules that only send it requests (a module that needs other settings, or counts
    what the server did, starts its own)."""
    grpc_port = free_port()
    env = {"SERVING_GRPC_PORT": str(grpc_port)}
    with start(tmp_path_factory.mktemp("engine-server") / "m", tiny_llama_dir, env=env) as s:
        s.wait_ready()
        s.http_address = s.url.removeprefix("http://")
        s.grpc_address = f"127.0.0.1:{grpc_port}"
        yield s

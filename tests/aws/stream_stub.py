"""A stand-in for the SageMaker runtime on 127.0.0.1, for what moto does not emulate.

It answers ``InvokeEndpointWithResponseStream`` with a prepared event-stream body, written as HTTP
chunks cut at random points, or either call with a prepared ModelError. Requests are kept for
the tests to inspect.
"""

from __future__ import annotations

import json
import random
import threading
from http.server import BaseHTTPRequestHandler

from .event_stream import split_randomly
from .quiet_server import QuietHTTPServer


class RuntimeStub:
    def __init__(self) -> None:
        self.stream_body = b""
        self.content_type = "application/jsonlines"
        self.model_error: dict | None = None
        self.requests: list[dict] = []
        self.seed = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                stub.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                if stub.model_error is None and self.path.endswith("/invocations-response-stream"):
                    self._stream()
                else:
                    self._model_error()

            def _stream(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/vnd.amazon.eventstream")
                self.send_header("X-Amzn-SageMaker-Content-Type", stub.content_type)
                self.send_header("x-Amzn-Invoked-Production-Variant", "AllTraffic")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for piece in split_randomly(stub.stream_body, random.Random(stub.seed), most=40):
                    self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def _model_error(self) -> None:
                body = json.dumps(stub.model_error or {}).encode()
                self.send_response(424)
                self.send_header("Content-Type", "application/json")
                self.send_header("x-amzn-ErrorType", "ModelError")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = QuietHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> RuntimeStub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

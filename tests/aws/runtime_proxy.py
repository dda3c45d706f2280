"""The SageMaker runtime on 127.0.0.1, in front of a real lmiserve server, for what moto does not do.

moto answers ``InvokeEndpoint`` with canned results and has no ``InvokeEndpointWithResponseStream``.
This proxy does what SageMaker's front end does for an endpoint: it forwards the body and the
headers SageMaker passes on (content type, accept, custom attributes, target model, inference
component) to the container's ``/invocations``; it answers in the runtime's shapes: the body as is,
each streamed chunk as an event-stream ``PayloadPart``, a container's error as ``ModelError`` (424),
and an endpoint that ``exists`` does not know as ``ValidationError`` (400).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

import httpx

from .event_stream import payload_part
from .quiet_server import QuietHTTPServer

FORWARDED = {
    "X-Amzn-SageMaker-Custom-Attributes": "X-Amzn-SageMaker-Custom-Attributes",
    "X-Amzn-SageMaker-Target-Model": "X-Amzn-SageMaker-Target-Model",
    "X-Amzn-SageMaker-Inference-Component": "X-Amzn-SageMaker-Inference-Component",
}


class RuntimeProxy:
    def __init__(self, container_url: str, exists: Callable[[str], bool]) -> None:
        self.requests: list[dict] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                _, _, endpoint, action = self.path.split("/", 3)
                proxy.requests.append({"endpoint": endpoint, "action": action, "headers": dict(self.headers)})
                if not exists(endpoint):
                    message = f"Endpoint {endpoint} of account 123456789012 not found."
                    return self._error(400, "ValidationError", {"message": message})
                streaming = action == "invocations-response-stream"
                headers = {"Content-Type": self.headers.get("Content-Type", "application/json")}
                accept = self.headers.get("X-Amzn-SageMaker-Accept" if streaming else "Accept")
                if accept:
                    headers["Accept"] = accept
                headers.update({to: self.headers[name] for name, to in FORWARDED.items() if name in self.headers})
                with httpx.stream(
                    "POST", container_url + "/invocations", content=body, headers=headers, timeout=300
                ) as answer:
                    if answer.status_code != 200:
                        answer.read()
                        return self._model_error(answer)
                    if streaming:
                        return self._stream(answer)
                    data = answer.read()
                    self.send_response(200)
                    self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
                    self.send_header("x-Amzn-Invoked-Production-Variant", "AllTraffic")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def _stream(self, answer: httpx.Response) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/vnd.amazon.eventstream")
                self.send_header("X-Amzn-SageMaker-Content-Type", answer.headers.get("content-type", ""))
                self.send_header("x-Amzn-Invoked-Production-Variant", "AllTraffic")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for chunk in answer.iter_raw():
                    event = payload_part(chunk)
                    self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def _model_error(self, answer: httpx.Response) -> None:
                text = answer.text
                self._error(
                    424,
                    "ModelError",
                    {
                        "ErrorCode": "CLIENT_ERROR_FROM_MODEL",
                        "Message": f'Received client error ({answer.status_code}) from primary with message "{text}".',
                        "OriginalMessage": text,
                        "OriginalStatusCode": answer.status_code,
                    },
                )

            def _error(self, status: int, kind: str, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("x-amzn-ErrorType", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._server = QuietHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> RuntimeProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

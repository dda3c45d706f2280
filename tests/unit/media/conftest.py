"""A media server on 127.0.0.1 and pictures made with Pillow, for the media tests."""

from __future__ import annotations

import io
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest
from PIL import Image

from tests.aws.quiet_server import QuietHTTPServer


def picture(width: int = 7, height: int = 5) -> Image.Image:
    """An RGB picture whose every pixel differs from its neighbours."""
    image = Image.new("RGB", (width, height))
    image.putdata([((x * 37) % 256, (y * 53) % 256, (x * y * 11) % 256) for y in range(height) for x in range(width)])
    return image


def encoded(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


class MediaServer:
    """``/name`` answers the bytes ``add(name, data)`` gave it, and a few fixed routes:
    ``/huge`` (an endless body, no Content-Length), ``/declared-huge`` (Content-Length 1 GB),
    ``/slow`` (headers, then nothing for 3 s), ``/redirect?to=URL`` (302), ``/loop`` (302 to
    itself); anything else is a 404. ``hosts`` records each request's Host header."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.hosts: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                server.hosts.append(self.headers.get("Host", ""))
                path, _, query = self.path.partition("?")
                if path == "/huge":
                    self.send_response(200)
                    self.end_headers()
                    for _ in range(2000):  # 128 MB at most; the client hangs up long before
                        self.wfile.write(b"\0" * 65536)
                elif path == "/declared-huge":
                    self.send_response(200)
                    self.send_header("Content-Length", str(10**9))
                    self.end_headers()
                    self.wfile.write(b"\0" * 1024)
                elif path == "/slow":
                    self.send_response(200)
                    self.send_header("Content-Length", "100")
                    self.end_headers()
                    self.wfile.flush()
                    time.sleep(3)
                elif path == "/redirect":
                    self._redirect(query.removeprefix("to="))
                elif path == "/loop":
                    self._redirect("/loop")
                elif path.lstrip("/") in server.files:
                    data = server.files[path.lstrip("/")]
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                else:
                    self.send_error(404)

            def _redirect(self, location: str) -> None:
                self.send_response(302)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = QuietHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, name: str, data: bytes) -> str:
        self.files[name] = data
        return f"{self.url}/{name}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(scope="module")
def media_server():
    server = MediaServer()
    yield server
    server.stop()

"""moto's S3 as a real HTTP server on 127.0.0.1, for the tests that fetch models from ``s3://``.

On top of moto it answers ranged GETs reading only the range, counts the object bytes it sends (per key: a test asserts a model was downloaded
once, or only its missing part after a resume), can send them slowly (``bytes_per_s``: a download
a test kills half-way), and answers ``AccessDenied`` for the buckets in ``denied`` (as S3 does for a
bucket whose policy refuses the caller, which moto does not evaluate).
"""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code><Message>Access Denied</Message>'
    b"<RequestId>0</RequestId></Error>"
)


class _QuietHandler(MotoRequestHandler):
    def log_request(self, *args: object) -> None:
        pass


class S3Server:
    def __init__(self) -> None:
        self.sent: collections.Counter[str] = collections.Counter()
        self.bytes_per_s: float | None = None
        self.denied: set[str] = set()
        self._lock = threading.Lock()
        app = DomainDispatcherApplication(create_backend_app)
        self._server = make_server("127.0.0.1", 0, self._wrap(app), threaded=True, request_handler=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def env(self) -> dict[str, str]:
        """What a process needs to reach this server as its S3."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def client(self):  # type: ignore[no-untyped-def]
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def _bucket(self, bucket: str):  # type: ignore[no-untyped-def]
        client = self.client()
        if bucket not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
            client.create_bucket(Bucket=bucket)
        return client

    def upload_dir(self, directory: Path, bucket: str, prefix: str) -> None:
        client = self._bucket(bucket)
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(directory)}")

    def put(self, bucket: str, prefix: str, files: dict[str, bytes]) -> None:
        """``files`` (name -> bytes) under ``s3://bucket/prefix/``, the bucket made if need be."""
        client = self._bucket(bucket)
        for name, data in files.items():
            client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=data)

    def sent_from(self, bucket: str) -> int:
        """Object bytes sent from ``bucket`` so far."""
        with self._lock:
            return sum(n for path, n in self.sent.items() if path.startswith(f"/{bucket}/"))

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _wrap(self, app):  # type: ignore[no-untyped-def]
        def counting_app(environ, start_response):  # type: ignore[no-untyped-def]
            path = environ.get("PATH_INFO", "")
            bucket = path.lstrip("/").partition("/")[0]
            if bucket in self.denied:
                start_response("403 Forbidden", [("Content-Type", "application/xml")])
                return [DENIED]
            if environ["REQUEST_METHOD"] != "GET" or path.count("/") < 2:
                return app(environ, start_response)
            ranged = self._range(path, environ.get("HTTP_RANGE", ""), start_response)
            return self._counted(path, ranged if ranged is not None else app(environ, start_response))

        return counting_app

    def _range(self, path: str, header: str, start_response):  # type: ignore[no-untyped-def]
        """A ``bytes=A-B`` GET answered from the object's buffer, reading only the range, as S3 does
        (moto reads and copies the whole object for each range, under a lock per object: on a large
        object that, not the client, would set the pace)."""
        from urllib.parse import unquote

        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        if not header.startswith("bytes=") or "," in header:
            return None
        first, _, last = header[len("bytes=") :].partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            return None
        bucket, _, key_name = unquote(path).lstrip("/").partition("/")
        try:
            key = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].get_object(bucket, key_name)
        except Exception:  # noqa: BLE001 - moto answers (NoSuchBucket, NoSuchKey)
            return None
        if key is None or int(first) >= key.size:
            return None
        begin, end = int(first), min(int(last), key.size - 1) if last else key.size - 1
        with key.lock:
            key._value_buffer.seek(begin)
            data = key._value_buffer.read(end - begin + 1)
        start_response(
            "206 Partial Content",
            [
                ("Content-Length", str(len(data))),
                ("Content-Range", f"bytes {begin}-{end}/{key.size}"),
                ("ETag", key.etag),
                ("Accept-Ranges", "bytes"),
            ],
        )
        return [data]

    def _counted(self, path: str, body):  # type: ignore[no-untyped-def]
        for block in body:
            for offset in range(0, len(block), 256 * 1024):
                piece = block[offset : offset + 256 * 1024]
                if self.bytes_per_s:
                    time.sleep(len(piece) / self.bytes_per_s)
                with self._lock:
                    self.sent[path] += len(piece)
                yield piece

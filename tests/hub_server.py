"""A Hugging Face Hub on 127.0.0.1 for the tests that fetch models by repository id (``HF_ENDPOINT``).

It serves the two routes a download takes, as the Hub does:
- ``GET /api/models/ORG/NAME/revision/REV?blobs=true``: the revision's commit and its files, with
  sizes, git blob ids and LFS sha256s;
- ``GET``/``HEAD /ORG/NAME/resolve/REV/PATH``, with ``Range``.

A repository may require a token (``Authorization: Bearer``): without it, or with another, both
routes answer 401 with ``X-Error-Code: RepoNotFound``, as the Hub answers for a private repository
(403 ``GatedRepo`` for a gated one).
An unknown repository or revision is a 404 with the Hub's error code. The server counts the bytes
it sends per file and can send them slowly (``bytes_per_s``).
"""

from __future__ import annotations

import collections
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote, urlparse

from tests.aws.quiet_server import QuietHTTPServer

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pth")


@dataclass
class Repo:
    files: dict[str, bytes]
    token: str | None = None
    revisions: dict[str, str] = field(default_factory=dict)
    """Branch or tag -> commit."""
    gated: bool = False
    """Refused with the Hub's ``GatedRepo`` error (403) rather than as private (401)."""


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


class HubServer:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.sent: collections.Counter[str] = collections.Counter()
        self.bytes_per_s: float | None = None
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                hub._answer(self, body=True)

            def do_HEAD(self) -> None:  # noqa: N802
                hub._answer(self, body=False)

        self._server = QuietHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(
        self, repo_id: str, files: dict[str, bytes] | Path, token: str | None = None, revision: str = "main"
    ) -> str:
        """Publish ``files`` (or a directory's files) as ``revision`` of ``repo_id``; the commit id."""
        if isinstance(files, Path):
            files = {str(p.relative_to(files)): p.read_bytes() for p in sorted(files.rglob("*")) if p.is_file()}
        commit = hashlib.sha1(json.dumps(sorted((k, git_blob_id(v)) for k, v in files.items())).encode()).hexdigest()
        repo = self.repos.setdefault(repo_id, Repo({}, token))
        repo.files.update(files)
        repo.token = token
        repo.revisions[revision] = commit
        return commit

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- internals ------------------------------------------------------------------------------

    def _error(self, handler: BaseHTTPRequestHandler, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("X-Error-Code", code)
        handler.send_header("X-Error-Message", message)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(handler.path).path)
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"]:
            repo_id = "/".join(parts[2:4])
            revision = parts[5] if len(parts) > 5 and parts[4] == "revision" else "main"
            name = None
        elif len(parts) >= 5 and parts[2] == "resolve":
            repo_id, revision, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        else:
            return self._error(handler, 404, "EntryNotFound", "not a route of this server")
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._error(handler, 404, "RepoNotFound", "Repository not found")
        if repo.token is not None and handler.headers.get("Authorization") != f"Bearer {repo.token}":
            if repo.gated:
                return self._error(handler, 403, "GatedRepo", f"Access to model {repo_id} is restricted.")
            return self._error(handler, 401, "RepoNotFound", "Invalid credentials in Authorization header")
        commit = repo.revisions.get(revision, revision if revision in repo.revisions.values() else None)
        if commit is None:
            return self._error(handler, 404, "RevisionNotFound", f"Invalid rev id: {revision}")
        if name is None:
            return self._info(handler, repo_id, repo, commit)
        data = repo.files.get(name)
        if data is None:
            return self._error(handler, 404, "EntryNotFound", f"{name} does not exist")
        self._file(handler, repo_id, name, data, commit, body)

    def _info(self, handler: BaseHTTPRequestHandler, repo_id: str, repo: Repo, commit: str) -> None:
        siblings = []
        for name, data in sorted(repo.files.items()):
            entry: dict = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
            if name.endswith(LFS_SUFFIXES):
                entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            siblings.append(entry)
        payload = json.dumps({"id": repo_id, "modelId": repo_id, "sha": commit, "siblings": siblings}).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def _file(
        self, handler: BaseHTTPRequestHandler, repo_id: str, name: str, data: bytes, commit: str, body: bool
    ) -> None:
        start, end = 0, len(data)
        ranged = handler.headers.get("Range")
        if ranged and ranged.startswith("bytes="):
            first, _, last = ranged[len("bytes=") :].partition("-")
            start, end = int(first), min(int(last) + 1, len(data)) if last else len(data)
        lfs = name.endswith(LFS_SUFFIXES)
        handler.send_response(206 if ranged else 200)
        handler.send_header("Content-Length", str(end - start))
        handler.send_header("Accept-Ranges", "bytes")
        handler.send_header("X-Repo-Commit", commit)
        handler.send_header("ETag", f'"{hashlib.sha256(data).hexdigest() if lfs else git_blob_id(data)}"')
        if ranged:
            handler.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        handler.end_headers()
        if not body:
            return
        for offset in range(start, end, 64 * 1024):
            piece = data[offset : min(offset + 64 * 1024, end)]
            if self.bytes_per_s:
                time.sleep(len(piece) / self.bytes_per_s)
            handler.wfile.write(piece)
            with self._lock:
                self.sent[f"{repo_id}/{name}"] += len(piece)

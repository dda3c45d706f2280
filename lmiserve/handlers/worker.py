"""A handler worker process: loads the model's handler and serves jobs sent by the server.

Started as ``python -m lmiserve.handlers.worker --fd N`` with one end of a socket pair.
The first message is :class:`~lmiserve.wire.InitWorker`; the handler is then called once
with an empty Input carrying the model's properties (its initialisation), and afterwards
with each job: one request, or a dynamic batch of them.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .. import wire
from ..child import describe, run_child
from ..errors import LmiServeError
from .inputs import Input
from .loader import load_handler
from .outputs import BatchMismatch, Output, Response, split_output

log = logging.getLogger("lmiserve.worker")


def _error_body(code: int, message: str, error: str) -> bytes:
    return json.dumps({"code": code, "message": message, "error": error}).encode("utf-8")


class Worker:
    def __init__(self, sock: socket.socket, handler: Callable[[Input], Any]):
        self.sock = sock
        self.handler = handler

    def _fail_all(self, job: wire.Job, code: int, message: str, error: str) -> None:
        for item in job.items:
            wire.send(
                self.sock,
                wire.ResponseHead(
                    request_id=item.request_id,
                    code=code,
                    message=message,
                    headers={"Content-Type": "application/json"},
                    body=_error_body(code, message, error),
                ),
            )

    def run_job(self, job: wire.Job) -> None:
        inputs = [Input(item.properties, [("data", item.body)]) for item in job.items]
        n = len(inputs)
        request = inputs[0] if n == 1 else Input({"batch_size": str(n)}, batch=inputs)
        try:
            output = self.handler(request)
            if not isinstance(output, Output):
                raise TypeError(f"handle() must return an Output, not {type(output).__name__}")
            responses = split_output(output, n)
        except LmiServeError as exc:
            self._fail_all(job, exc.status, exc.title, exc.detail)
            return
        except BatchMismatch as exc:
            self._fail_all(job, 424, "invoke handler failure", str(exc))
            return
        except Exception as exc:
            log.error("handler failed:\n%s", traceback.format_exc())
            self._fail_all(job, 424, "invoke handler failure", describe(exc))
            return
        streams: list[tuple[str, Iterator[bytes]]] = []
        for item, response in zip(job.items, responses):
            self._send_head(item.request_id, response)
            if response.stream is not None:
                streams.append((item.request_id, response.stream))
        self._pump(streams)

    def _send_head(self, request_id: str, response: Response) -> None:
        wire.send(
            self.sock,
            wire.ResponseHead(
                request_id=request_id,
                code=response.code,
                message=response.message,
                headers=response.headers,
                body=response.body,
                streaming=response.stream is not None,
            ),
        )

    def _pump(self, streams: list[tuple[str, Iterator[bytes]]]) -> None:
        """Forward every stream's chunks, round-robin, until all have ended."""
        active = list(streams)
        while active:
            for entry in list(active):
                request_id, stream = entry
                try:
                    data = next(stream)
                except StopIteration:
                    wire.send(self.sock, wire.ResponseEnd(request_id=request_id))
                    active.remove(entry)
                    continue
                except Exception as exc:
                    log.error("stream failed:\n%s", traceback.format_exc())
                    wire.send(self.sock, wire.ResponseEnd(request_id=request_id, error=describe(exc)))
                    active.remove(entry)
                    continue
                wire.send(self.sock, wire.ResponseChunk(request_id=request_id, data=data))

    def serve(self) -> None:
        while True:
            msg = wire.recv(self.sock)
            if msg is None or isinstance(msg, wire.Shutdown):
                return
            if isinstance(msg, wire.Job):
                self.run_job(msg)
                wire.send(self.sock, wire.JobDone(job_id=msg.job_id))


def _start(sock: socket.socket, init: wire.InitWorker) -> Callable[[], None]:
    """Load the handler and call it once with the model's properties (its initialisation)."""
    handler = load_handler(Path(init.model_dir), init.entry_point or "", init.handler)
    result = handler(Input(init.properties))
    if isinstance(result, Output) and result.code >= 400:
        raise RuntimeError(f"initialisation answered {result.code}: {result.message}")
    wire.send(sock, wire.WorkerReady(pid=os.getpid()))
    return Worker(sock, handler).serve


def main(argv: list[str] | None = None) -> int:
    label = lambda i: f"{i.model_name} worker-{i.worker_id}"  # noqa: E731
    return run_child(sys.argv[1:] if argv is None else argv, wire.InitWorker, label, wire.WorkerFailed, _start)


if __name__ == "__main__":
    sys.exit(main())

"""A threading HTTP server for test stand-ins that stays quiet when a client drops its connection.

socketserver prints the traceback of every error in a handler thread to stderr, where a test that
checks what the CLI printed would find it: a client that closes a kept-alive connection is no error.
"""

from __future__ import annotations

import sys
from http.server import ThreadingHTTPServer


class QuietHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

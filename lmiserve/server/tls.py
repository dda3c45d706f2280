"""TLS for the HTTP port and the gRPC port (``ssl_certfile``, ``ssl_keyfile``, ``ssl_ca_certs``).

The files are read and the key checked against the certificate once, before anything is served, so a
missing file or a key of another certificate stops start-up with a message naming the setting.
With ``ssl_ca_certs`` both ports ask for a client certificate and refuse a client without one that
chains to those CAs (mutual TLS). Without ``ssl_certfile`` nothing changes: plain HTTP and gRPC."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Settings


class TlsError(ValueError):
    """A TLS setting that cannot be used; the message names it."""


@dataclass(frozen=True)
class ServerTls:
    certfile: str
    keyfile: str
    ca_certs: str | None

    @classmethod
    def from_settings(cls, settings: Settings) -> ServerTls | None:
        s = settings.server
        if not s.ssl_certfile:
            if s.ssl_keyfile or s.ssl_ca_certs:
                raise TlsError("ssl_keyfile and ssl_ca_certs need ssl_certfile, the server's certificate")
            return None
        if not s.ssl_keyfile:
            raise TlsError("ssl_certfile needs ssl_keyfile, the certificate's private key")
        for key in ("ssl_certfile", "ssl_keyfile", "ssl_ca_certs"):
            path = getattr(s, key)
            if path and not Path(path).is_file():
                raise TlsError(f"{key} {path}: no such file")
        tls = cls(s.ssl_certfile, s.ssl_keyfile, s.ssl_ca_certs or None)
        tls.context()  # the key against the certificate, the CA file readable
        return tls

    def context(self) -> ssl.SSLContext:
        """The server's TLS context (what uvicorn builds from the same files)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            ctx.load_cert_chain(self.certfile, self.keyfile)
        except ssl.SSLError as exc:
            raise TlsError(
                f"ssl_keyfile {self.keyfile} does not match ssl_certfile {self.certfile}, or one is not PEM ({exc})"
            ) from None
        if self.ca_certs:
            try:
                ctx.load_verify_locations(self.ca_certs)
            except ssl.SSLError as exc:
                raise TlsError(f"ssl_ca_certs {self.ca_certs}: not PEM CA certificates ({exc})") from None
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def uvicorn_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"ssl_certfile": self.certfile, "ssl_keyfile": self.keyfile}
        if self.ca_certs:
            options.update(ssl_ca_certs=self.ca_certs, ssl_cert_reqs=ssl.CERT_REQUIRED)
        return options

    def grpc_credentials(self) -> Any:
        import grpc

        cert = Path(self.certfile).read_bytes()
        key = Path(self.keyfile).read_bytes()
        ca = Path(self.ca_certs).read_bytes() if self.ca_certs else None
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)

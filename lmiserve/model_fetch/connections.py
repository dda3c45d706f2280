"""The HTTP connections a download uses: through the proxy the environment names (``HTTPS_PROXY``,
``HTTP_PROXY``, ``NO_PROXY``, as huggingface_hub and boto3 honour them), trusting the CA bundle it
names (``REQUESTS_CA_BUNDLE``, ``SSL_CERT_FILE``, ``AWS_CA_BUNDLE``), else certifi's, else the system's."""

from __future__ import annotations

import os
import threading
import urllib.request
from urllib.parse import urlsplit

import urllib3

CA_VARIABLES = ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "AWS_CA_BUNDLE")


def ca_bundle() -> str | None:
    for name in CA_VARIABLES:
        if os.environ.get(name):
            return os.environ[name]
    try:
        import certifi
    except ImportError:
        return None  # the system's store
    return str(certifi.where())


class Connections:
    """A pool per proxy (and one direct), made on first use; ``streams`` connections each."""

    def __init__(self, streams: int) -> None:
        self.streams = streams
        self._pools: dict[str | None, urllib3.PoolManager] = {}
        self._lock = threading.Lock()
        self._proxies = urllib.request.getproxies()

    def proxy_for(self, url: str) -> str | None:
        parts = urlsplit(url)
        proxy = self._proxies.get(parts.scheme)
        if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
            return None
        return proxy

    def pool(self, url: str) -> urllib3.PoolManager:
        proxy = self.proxy_for(url)
        with self._lock:
            pool = self._pools.get(proxy)
            if pool is None:
                options = dict(
                    maxsize=self.streams,
                    block=True,
                    retries=False,
                    timeout=urllib3.Timeout(30, 120),
                    ca_certs=ca_bundle(),
                )
                pool = urllib3.ProxyManager(proxy, **options) if proxy else urllib3.PoolManager(**options)
                self._pools[proxy] = pool
            return pool

"""A media part's bytes, from wherever its source says (see :mod:`lmiserve.media.sources`).

Inline data (a data URL or bare base64) is bounded on its base64 length before decoding and on its
decoded length after. Local files follow :mod:`lmiserve.media.local`. URLs are fetched with httpx:

- the host and every address it resolves to are checked (:mod:`lmiserve.media.addresses`), and the
  connection goes to a checked address (the Host header and TLS server name stay the URL's host);
- a 3xx is refused ("redirect refused") unless ``allow_redirects``; then each hop is checked again,
  at most :data:`MAX_REDIRECTS` of them, and each must be http or https;
- any other status but 2xx is "cannot fetch ... (HTTP 404 Not Found)";
- the body is streamed and refused as soon as it passes the kind's limit (a Content-Length past it
  is refused before reading); ``Accept-Encoding: identity`` is asked for, and the limit applies to
  the bytes after any content decoding;
- ``fetch_timeout_s`` bounds everything for one URL: resolving, connecting, redirects and the body.

Without a ``client``, each call makes its own httpx client that ignores the proxy and netrc
environment variables (``trust_env=False``): the address rules are about the server this process
connects to. Pass a client to share connections or to go through a proxy.
"""

from __future__ import annotations

import asyncio
import errno

import httpx

from lmiserve.media.addresses import checked_addresses, shown_url
from lmiserve.media.errors import disallowed, too_large, unreachable
from lmiserve.media.local import read_local
from lmiserve.media.policy import MediaPolicy
from lmiserve.media.refs import MediaRef
from lmiserve.media.sources import classify

MAX_REDIRECTS = 5
REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CLASSIFY_IN_THREAD = 1 << 20
"""Sources longer than this (inline data) are decoded in a worker thread."""


async def load_bytes(ref: MediaRef, policy: MediaPolicy, client: httpx.AsyncClient | None = None) -> bytes:
    """The part's bytes, at most the kind's limit; :class:`MediaError` otherwise."""
    limit = policy.max_bytes(ref.kind)
    if len(ref.source) > _CLASSIFY_IN_THREAD:
        source = await asyncio.to_thread(classify, ref.source, ref.kind, ref.where, max_bytes=limit)
    else:
        source = classify(ref.source, ref.kind, ref.where, max_bytes=limit)
    if source.form == "inline":
        if len(source.data) > limit:
            raise too_large(ref.where, ref.kind, limit)
        return source.data
    if source.form == "path":
        return await read_local(source.value, ref, policy)
    return await fetch_url(source.value, ref, policy, client)


async def fetch_url(text: str, ref: MediaRef, policy: MediaPolicy, client: httpx.AsyncClient | None = None) -> bytes:
    try:
        url = httpx.URL(text)
    except (httpx.InvalidURL, UnicodeError) as e:
        raise disallowed(ref.where, text[:100], f"not a valid URL: {e}") from None
    try:
        async with asyncio.timeout(policy.fetch_timeout_s):
            if client is not None:
                return await _follow(client, url, ref, policy)
            async with httpx.AsyncClient(trust_env=False, timeout=policy.fetch_timeout_s) as own:
                return await _follow(own, url, ref, policy)
    except (TimeoutError, httpx.TimeoutException):
        raise unreachable(ref.where, shown_url(url), f"timed out after {policy.fetch_timeout_s:g} s") from None


async def _follow(client: httpx.AsyncClient, url: httpx.URL, ref: MediaRef, policy: MediaPolicy) -> bytes:
    for hop in range(MAX_REDIRECTS + 1):
        if url.scheme not in ("http", "https"):
            raise disallowed(ref.where, shown_url(url), f"scheme {url.scheme!r}: only http and https are fetched")
        addresses = await checked_addresses(url, policy, ref.where)
        result = await _get(client, url, addresses, ref, policy)
        if isinstance(result, bytes):
            return result
        if not policy.allow_redirects:
            raise disallowed(
                ref.where,
                shown_url(url),
                f"redirect refused: {result[0]} to {shown_url(result[1])}; see option.media_allow_redirects",
            )
        if hop == MAX_REDIRECTS:
            raise unreachable(ref.where, shown_url(url), f"more than {MAX_REDIRECTS} redirects")
        url = result[1]
    raise AssertionError("unreachable")


async def _get(
    client: httpx.AsyncClient, url: httpx.URL, addresses: list[str], ref: MediaRef, policy: MediaPolicy
) -> bytes | tuple[str, httpx.URL]:
    """The body, or (``HTTP 302``, the next URL) for a redirect. Each address in turn until one
    connects."""
    failure: Exception | None = None
    for address in addresses:
        request = client.build_request(
            "GET",
            url.copy_with(host=address),
            headers={"Host": url.netloc.decode("ascii"), "Accept-Encoding": "identity"},
            extensions={"sni_hostname": url.raw_host.decode("ascii")} if url.scheme == "https" else None,
        )
        try:
            response = await client.send(request, stream=True, follow_redirects=False)
        except httpx.ConnectError as e:
            failure = e
            continue
        except httpx.TimeoutException:
            raise
        except httpx.HTTPError as e:
            raise unreachable(ref.where, shown_url(url), cause(e)) from None
        try:
            return await _body(response, url, ref, policy)
        finally:
            await response.aclose()
    raise unreachable(ref.where, shown_url(url), cause(failure) if failure else "no address")


async def _body(
    response: httpx.Response, url: httpx.URL, ref: MediaRef, policy: MediaPolicy
) -> bytes | tuple[str, httpx.URL]:
    status = f"HTTP {response.status_code}"
    if response.status_code in REDIRECTS:
        location = response.headers.get("location")
        if not location:
            raise unreachable(ref.where, shown_url(url), f"{status} without a Location")
        try:
            return status, url.join(location)
        except (httpx.InvalidURL, UnicodeError):
            raise unreachable(ref.where, shown_url(url), f"{status} to a bad Location") from None
    if not 200 <= response.status_code < 300:
        phrase = f" {response.reason_phrase}" if response.reason_phrase else ""
        raise unreachable(ref.where, shown_url(url), f"{status}{phrase}")
    limit = policy.max_bytes(ref.kind)
    length = response.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large(ref.where, ref.kind, limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > limit:
                raise too_large(ref.where, ref.kind, limit)
            chunks.append(chunk)
    except httpx.TimeoutException:
        raise
    except httpx.HTTPError as e:
        raise unreachable(ref.where, shown_url(url), cause(e)) from None
    return b"".join(chunks)


def cause(error: BaseException) -> str:
    """``connection refused``, or the error's own words."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ECONNREFUSED:
            return "connection refused"
        if "connection refused" in str(seen).lower():
            return "connection refused"
        seen = seen.__cause__ or seen.__context__
    return str(error) or type(error).__name__

"""Media fetched by URL from a server on 127.0.0.1: which hosts and addresses may be reached,
redirects, sizes, time limits and failures, each as the client sees it."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from lmiserve.media import MediaError, MediaPolicy, MediaRef, load_bytes, resolve_media
from lmiserve.media.addresses import address_problem
from tests.unit.media.conftest import encoded, picture

WHERE = "messages[0].content[1]"
LOOPBACK = MediaPolicy(allowed_domains=("127.0.0.1",))


def _load(source: str, policy: MediaPolicy, kind: str = "image", client: httpx.AsyncClient | None = None) -> bytes:
    return asyncio.run(load_bytes(MediaRef(kind, source, WHERE), policy, client))


def _refused(source: str, policy: MediaPolicy, kind: str = "image") -> MediaError:
    with pytest.raises(MediaError) as caught:
        _load(source, policy, kind)
    assert caught.value.status == 400
    assert str(caught.value).startswith(f"{WHERE}: ")
    return caught.value


def test_a_loopback_url_is_refused_by_default_and_fetched_once_its_host_is_allowed(media_server):
    png = encoded(picture(), "PNG")
    url = media_server.add("pic.png", png)
    error = _refused(url, MediaPolicy())
    assert error.reason == "disallowed"
    assert "127.0.0.1 is a loopback address" in str(error)
    assert "option.allowed_media_domains" in str(error)
    assert _load(url, LOOPBACK) == png
    assert _load(url, MediaPolicy(allow_private=True)) == png


def test_a_host_name_is_checked_by_every_address_it_resolves_to(media_server):
    url = media_server.add("named.png", b"named").replace("127.0.0.1", "localhost")
    error = _refused(url, MediaPolicy())
    assert "localhost resolves to" in str(error) and "a loopback address" in str(error)
    # allowed by name: ::1 (where nothing listens) is tried, then 127.0.0.1
    assert _load(url, MediaPolicy(allowed_domains=("LOCALHOST",))) == b"named"


def test_a_host_outside_allowed_media_domains_is_refused_without_a_connection(media_server):
    url = media_server.add("pic2.png", b"x")
    before = len(media_server.hosts)
    error = _refused(url, MediaPolicy(allowed_domains=("images.example.com", ".cdn.example.com")))
    assert "host 127.0.0.1 is not in option.allowed_media_domains" in str(error)
    assert len(media_server.hosts) == before


def test_the_connection_goes_to_the_checked_address_with_the_urls_host(media_server, monkeypatch):
    resolved: list[str] = []

    async def fake_getaddrinfo(self, host, port, **kwargs):
        resolved.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", fake_getaddrinfo)
    url = media_server.add("pinned.png", b"pinned").replace("127.0.0.1", "media.test")
    assert _load(url, MediaPolicy(allowed_domains=("*.test",))) == b"pinned"
    assert resolved == ["media.test"]  # resolved once, for the check; the connection used the result
    assert media_server.hosts[-1] == f"media.test:{media_server.port}"
    assert "media.test resolves to 127.0.0.1, a loopback address" in str(_refused(url, MediaPolicy()))


def test_a_redirect_is_refused_by_default_and_followed_with_each_hop_checked_when_allowed(media_server):
    media_server.add("target.png", b"target")
    url = f"{media_server.url}/redirect?to=/target.png"
    error = _refused(url, LOOPBACK)
    assert f"redirect refused: HTTP 302 to {media_server.url}/target.png" in str(error)
    follow = MediaPolicy(allowed_domains=("127.0.0.1",), allow_redirects=True)
    assert _load(url, follow) == b"target"
    away = f"{media_server.url}/redirect?to=http://localhost:{media_server.port}/target.png"
    assert "host localhost is not in option.allowed_media_domains" in str(_refused(away, follow))
    to_ftp = f"{media_server.url}/redirect?to=ftp://127.0.0.1/target.png"
    assert "scheme 'ftp': only http and https" in str(_refused(to_ftp, follow))
    assert "more than 5 redirects" in str(_refused(f"{media_server.url}/loop", follow))


def test_a_missing_file_is_unreachable_with_its_status(media_server):
    error = _refused(f"{media_server.url}/nothing-here.png", LOOPBACK)
    assert error.reason == "unreachable"
    assert str(error) == f"{WHERE}: cannot fetch {media_server.url}/nothing-here.png (HTTP 404 Not Found)"


def test_a_slow_server_is_unreachable_after_the_time_limit(media_server):
    error = _refused(f"{media_server.url}/slow", MediaPolicy(allowed_domains=("127.0.0.1",), fetch_timeout_s=0.5))
    assert str(error) == f"{WHERE}: cannot fetch {media_server.url}/slow (timed out after 0.5 s)"


def test_a_closed_port_is_unreachable_as_connection_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    error = _refused(f"http://127.0.0.1:{port}/x.png", LOOPBACK)
    assert error.reason == "unreachable" and "(connection refused)" in str(error)


def test_a_body_past_the_limit_is_refused_with_or_without_a_content_length(media_server):
    small = MediaPolicy(allowed_domains=("127.0.0.1",), max_image_bytes=100 * 1024)
    error = _refused(f"{media_server.url}/huge", small)
    assert str(error) == f"{WHERE}: image larger than 100 KiB" and error.reason == "too_large"
    assert str(_refused(f"{media_server.url}/declared-huge", LOOPBACK)) == f"{WHERE}: image larger than 20 MiB"
    exact = media_server.add("exact.bin", b"\1" * 1000)
    assert _load(exact, MediaPolicy(allowed_domains=("127.0.0.1",), max_image_bytes=1000)) == b"\1" * 1000
    assert "larger than 999 bytes" in str(
        _refused(exact, MediaPolicy(allowed_domains=("127.0.0.1",), max_image_bytes=999))
    )


def test_only_http_and_https_urls_are_fetched():
    assert "scheme 'ftp': only http and https" in str(_refused("ftp://example.com/a.png", MediaPolicy()))
    assert "scheme 'gopher'" in str(_refused("gopher://127.0.0.1:70/", MediaPolicy()))
    assert str(_refused("http:///x.png", MediaPolicy())) == f"{WHERE}: URL not allowed: http:///x.png (no host)"


def test_a_given_client_is_used_and_left_open(media_server):
    url = media_server.add("shared.png", b"shared")

    async def twice() -> list[bytes]:
        async with httpx.AsyncClient() as client:
            first = await load_bytes(MediaRef("image", url, WHERE), LOOPBACK, client)
            second = await load_bytes(MediaRef("image", url, WHERE), LOOPBACK, client)
            assert not client.is_closed
            return [first, second]

    assert asyncio.run(twice()) == [b"shared", b"shared"]


def test_images_from_several_urls_decode_together_and_one_bad_url_fails_the_request(media_server):
    urls = [media_server.add(f"many{i}.png", encoded(picture(i + 1, 2), "PNG")) for i in range(4)]
    refs = [MediaRef("image", url, f"messages[0].content[{i}]") for i, url in enumerate(urls)]
    images = asyncio.run(resolve_media(refs, LOOPBACK))
    assert [i.width for i in images] == [1, 2, 3, 4]
    refs.append(MediaRef("image", f"{media_server.url}/gone.png", "messages[1].content[0]"))
    with pytest.raises(MediaError, match=r"^messages\[1\]\.content\[0\]: cannot fetch .* \(HTTP 404"):
        asyncio.run(resolve_media(refs, LOOPBACK))


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
        ("127.0.0.53", "a loopback address"),
        ("::1", "a loopback address"),
        ("::ffff:127.0.0.1", "a loopback address"),
        ("10.1.2.3", "a private address"),
        ("192.168.0.1", "a private address"),
        ("fd00::1", "a private address"),
        ("169.254.169.254", "a link-local address"),
        ("fe80::1", "a link-local address"),
        ("0.0.0.0", "an unspecified address"),
        ("224.0.0.1", "a multicast address"),
        ("100.64.0.1", "not a public address"),
    ],
)
def test_which_addresses_are_public(address, problem):
    import ipaddress

    assert address_problem(ipaddress.ip_address(address)) == problem

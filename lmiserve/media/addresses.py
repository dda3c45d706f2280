"""Which hosts a media URL may reach: the host against ``allowed_media_domains``, and every
address it resolves to against the public internet (see :mod:`lmiserve.media.policy` for the
rules). The fetch then connects to an address checked here, never resolving the name again, so a
name that resolves to a public address for the check and to a private one for the connection
(DNS rebinding) reaches nothing."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import httpx

from lmiserve.media.errors import disallowed, unreachable
from lmiserve.media.policy import MediaPolicy

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def host_of(url: httpx.URL) -> str:
    """The host as checked and resolved: an IP address, or the ASCII (IDNA) name in lower case."""
    try:
        return str(ipaddress.ip_address(url.host))
    except ValueError:
        return url.raw_host.decode("ascii").lower().rstrip(".")


def shown_url(url: httpx.URL) -> str:
    """The URL for a message: no user name or password, no query, at most 100 characters."""
    text = f"{url.scheme}://{url.netloc.decode('ascii', 'replace')}{url.path}"
    return text if len(text) <= 100 else text[:97] + "..."


def address_problem(ip: IPAddress) -> str | None:
    """Why an address is not a public one (``a loopback address``), or None."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for name in ("unspecified", "loopback", "link_local", "multicast", "private", "reserved"):
        if getattr(ip, f"is_{name}"):
            article = "an" if name == "unspecified" else "a"
            return f"{article} {name.replace('_', '-')} address"
    if not ip.is_global:
        return "not a public address"
    return None


async def checked_addresses(url: httpx.URL, policy: MediaPolicy, where: str) -> list[str]:
    """The addresses ``url``'s host may be reached at, in resolver order; MediaError if the host or
    any of its addresses is refused, or the name does not resolve."""
    host = host_of(url)
    if not host:
        raise disallowed(where, shown_url(url), "no host")
    named = policy.host_allowed(host)
    if named is False:
        raise disallowed(where, shown_url(url), f"host {host} is not in option.allowed_media_domains")
    try:
        addresses: list[IPAddress] = [ipaddress.ip_address(host)]
    except ValueError:
        addresses = await _resolve(url, host, where)
    if not named and not policy.allow_private:
        for ip in addresses:
            if problem := address_problem(ip):
                what = f"{ip} is" if str(ip) == host else f"{host} resolves to {ip},"
                raise disallowed(
                    where,
                    shown_url(url),
                    f"{what} {problem}; name the host in option.allowed_media_domains to allow it",
                )
    return [str(ip) for ip in addresses]


async def _resolve(url: httpx.URL, host: str, where: str) -> list[IPAddress]:
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise unreachable(
            where, shown_url(url), f"cannot resolve {host}: {getattr(e, 'strerror', None) or e}"
        ) from None
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        ip = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
        if ip not in addresses:
            addresses.append(ip)
    if not addresses:
        raise unreachable(where, shown_url(url), f"cannot resolve {host}")
    return addresses

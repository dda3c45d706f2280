"""What a request's media may be: sizes, counts, where it may be fetched from.

Defaults follow MindIE's limits (an image or audio file at most 20 MB, a video at most 512 MB, at
most 20 media parts in a request; MB taken as MiB) and vLLM's server settings for where media may
come from (``allowed_local_media_path``: no local files unless set; ``allowed_media_domains``: any
public host unless set).

Host rules (:meth:`MediaPolicy.host_allowed`): an entry of ``allowed_domains`` matches a host
exactly (case-insensitive, a trailing dot ignored); an entry written ``.example.com`` or
``*.example.com`` matches every host below ``example.com`` but not ``example.com`` itself. A host
matched by an entry may resolve to any address, private and loopback included: naming a host is how
an operator allows an internal server. Any other host must resolve only to public addresses unless
``allow_private``.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from lmiserve.media.errors import PLURALS, too_many
from lmiserve.media.refs import KINDS, MediaRef

MiB = 1 << 20
_HOST = re.compile(r"^(\*\.|\.)?[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*$")
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


@dataclass(frozen=True)
class MediaPolicy:
    max_image_bytes: int = 20 * MiB
    max_video_bytes: int = 512 * MiB
    max_audio_bytes: int = 20 * MiB
    max_parts: int = 20
    """Image, video and audio parts together, in one request (MindIE: 20)."""
    limit_per_prompt: dict[str, int] = field(default_factory=dict, hash=False)
    """``option.limit_mm_per_prompt``: at most this many parts of a kind; a kind not named is
    limited by ``max_parts`` only."""
    fetch_timeout_s: float = 10.0
    """For one URL: name resolution, connecting, every redirect and the whole body."""
    allowed_domains: tuple[str, ...] | None = None
    """``option.allowed_media_domains``; None: any host whose addresses are public."""
    allowed_local_path: str | None = None
    """``option.allowed_local_media_path``; None: no local files."""
    allow_redirects: bool = False
    allow_private: bool = False
    max_image_pixels: int = 64 * MiB
    """Width times height (64 Mi pixels: 8192 x 8192), checked from the header before decoding."""
    max_image_side: int = 16384

    def __post_init__(self) -> None:
        if self.allowed_domains is not None:  # as given in code: the same normal form as from_options
            normal = tuple(_entry(_normal_host(d.strip())) for d in self.allowed_domains if d.strip())
            object.__setattr__(self, "allowed_domains", normal)

    def max_bytes(self, kind: str) -> int:
        return {"image": self.max_image_bytes, "video": self.max_video_bytes, "audio": self.max_audio_bytes}[kind]

    def host_allowed(self, host: str) -> bool | None:
        """True: named by ``allowed_domains`` (any address will do); None: not named, but no list is
        set (public addresses only); False: refused."""
        if self.allowed_domains is None:
            return None
        host = _normal_host(host)
        for entry in self.allowed_domains:
            if entry.startswith("."):
                if host.endswith(entry) and len(host) > len(entry):
                    return True
            elif host == entry:
                return True
        return False

    def check_counts(self, refs: list[MediaRef]) -> None:
        """Raise :class:`MediaError` naming the first part past a limit."""
        if len(refs) > self.max_parts:
            raise too_many(refs[self.max_parts].where, f"at most {self.max_parts} images, videos and audio files")
        seen = dict.fromkeys(KINDS, 0)
        for ref in refs:
            seen[ref.kind] += 1
            limit = self.limit_per_prompt.get(ref.kind)
            if limit is not None and seen[ref.kind] > limit:
                raise too_many(ref.where, f"at most {limit} {PLURALS[ref.kind]}; option.limit_mm_per_prompt")

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> MediaPolicy:
        """From serving.properties keys without their ``option.`` prefix; ValueError on a bad value."""
        kwargs: dict[str, object] = {}
        if (text := options.get("allowed_media_domains", "").strip()) != "":
            kwargs["allowed_domains"] = parse_domains(text)
        if (text := options.get("allowed_local_media_path", "").strip()) != "":
            if not os.path.isabs(text):
                raise ValueError(f"allowed_local_media_path must be an absolute path, not {text!r}")
            kwargs["allowed_local_path"] = os.path.normpath(text)
        if (text := options.get("limit_mm_per_prompt", "").strip()) != "":
            kwargs["limit_per_prompt"] = parse_limits(text)
        if (text := options.get("media_fetch_timeout", "").strip()) != "":
            try:
                seconds = float(text)
            except ValueError:
                seconds = math.nan
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"media_fetch_timeout must be a number of seconds > 0, not {text!r}")
            kwargs["fetch_timeout_s"] = seconds
        for key, name in (
            ("media_allow_redirects", "allow_redirects"),
            ("media_allow_private_addresses", "allow_private"),
        ):
            if (text := options.get(key, "").strip()) != "":
                kwargs[name] = parse_bool(key, text)
        return cls(**kwargs)  # type: ignore[arg-type]


def parse_bool(key: str, text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError(f"{key} must be true or false, not {text!r}")


def parse_domains(text: str) -> tuple[str, ...]:
    """``a.com, b.org`` or ``["a.com", "b.org"]``; ``*.a.com`` is kept as ``.a.com``."""
    if text.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"allowed_media_domains is not a JSON list: {e}") from None
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            raise ValueError("allowed_media_domains must be a JSON list of host names")
    else:
        items = text.split(",")
    domains: list[str] = []
    for item in items:
        host = _entry(_normal_host(item.strip()))
        if not host:
            continue
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if not _HOST.match(host):
                raise ValueError(
                    f"allowed_media_domains: {item.strip()!r} is not a host name (write hosts only: no scheme, "
                    "port or path)"
                ) from None
        domains.append(host)
    return tuple(domains)


def parse_limits(text: str) -> dict[str, int]:
    """``{"image": 2, "video": 1}``; vLLM's ``{"video": {"count": 1, ...}}`` form is read for its count."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"limit_mm_per_prompt is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f'limit_mm_per_prompt must be a JSON object such as {{"image": 2}}, not {text!r}')
    limits: dict[str, int] = {}
    for kind, count in value.items():
        if kind not in KINDS:
            raise ValueError(f"limit_mm_per_prompt: unknown kind {kind!r} (one of {', '.join(KINDS)})")
        if isinstance(count, dict) and "count" in count:
            count = count["count"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"limit_mm_per_prompt: {kind} must be a whole number >= 0, not {count!r}")
        limits[kind] = count
    return limits


def _entry(host: str) -> str:
    return host[1:] if host.startswith("*.") else host


def _normal_host(host: str) -> str:
    host = host.lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host

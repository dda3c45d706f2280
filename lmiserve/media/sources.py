"""What a media part's ``source`` string is, from its text alone (the file system is never looked
at, so a client cannot probe which paths exist):

1. ``data:`` — a data URL. It must be base64 (``data:image/png;base64,...``), and its media type's
   major type must be the part's kind (``image/*`` for an image); a data URL without a type is
   refused, as ``text/plain`` is its default.
2. ``http://`` or ``https://`` — a URL to fetch.
3. ``file://`` — a local path (``file:///abs/path``; ``file://localhost/abs/path``; percent-escapes
   decoded). ``file://`` with another host is refused.
4. Any other ``scheme://`` — refused (only http and https are fetched).
5. Bare base64 (MindIE's "base64-encoded jpg"): text of the standard base64 alphabet
   (``A-Z a-z 0-9 + / =``) and whitespace only that, once whitespace is removed, is at least
   :data:`MIN_BARE_BASE64` characters, a multiple of 4 long, and accepted by strict decoding
   (``b64decode(validate=True)``). A JPEG's base64 starts ``/9j/``, so a leading ``/`` does not
   make a path.
6. Anything else is a local path (absolute, or relative to ``allowed_local_media_path``). A path
   such as ``/data/x.jpg`` has a ``.`` and so is never base64; only an extension-less path made of
   letters, digits and ``/`` alone, 64 characters or more and a multiple of 4 long, would be taken
   for base64 (and then fail as "not an image"). Base64-alphabet text too long to be a path (over
   4096 characters) that does not decode is refused as bad base64 rather than as a path.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from lmiserve.media.errors import bad_encoding, disallowed, shown, too_large

MIN_BARE_BASE64 = 64
"""The shortest bare base64 text taken as base64 (48 bytes: smaller than any real picture's file)."""
PATH_MAX = 4096

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_BASE64_TEXT = re.compile(r"^[A-Za-z0-9+/=\s]+$")
_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Source:
    form: str
    """``"inline"`` (a data URL or bare base64, decoded), ``"url"`` or ``"path"``."""
    value: str
    """The URL or the path; empty for inline data."""
    data: bytes = b""
    """Inline data, decoded."""
    media_type: str | None = None
    """A data URL's media type (``image/png``)."""


def classify(source: str, kind: str, where: str, *, max_bytes: int | None = None) -> Source:
    """Raise :class:`MediaError` for a refused scheme, a bad data URL or bad base64, or inline data
    past ``max_bytes`` (its base64 length is checked before decoding)."""
    text = source.strip()
    if not text:
        raise bad_encoding(where, "empty media source")
    if text[:5].lower() == "data:":
        return _data_url(text, kind, where, max_bytes)
    if match := _SCHEME.match(text):
        scheme = match.group(1).lower()
        if scheme in ("http", "https"):
            return Source("url", text)
        if scheme == "file":
            return Source("path", _file_url_path(text, where))
        raise disallowed(where, shown(text, 60), f"scheme {scheme!r}: only http and https are fetched")
    if _BASE64_TEXT.match(text):
        compact = _compact(text, kind, where, max_bytes)
        if len(compact) >= MIN_BARE_BASE64 and len(compact) % 4 == 0:
            try:
                return Source("inline", "", base64.b64decode(compact, validate=True))
            except (binascii.Error, ValueError):
                pass
        if len(compact) > PATH_MAX:
            raise bad_encoding(where, "not valid base64 (and too long to be a file path)")
    return Source("path", text)


def encoded_limit(max_bytes: int) -> int:
    """The base64 length of ``max_bytes`` bytes."""
    return 4 * ((max_bytes + 2) // 3)


def _data_url(text: str, kind: str, where: str, max_bytes: int | None) -> Source:
    header, comma, payload = text[5:].partition(",")
    if not comma:
        raise bad_encoding(where, "bad data URL (no comma before the data)")
    params = [p.strip() for p in header.split(";")]
    media_type = params[0].lower()
    if "base64" not in (p.lower() for p in params[1:]):
        raise bad_encoding(where, "data URL is not base64 (write data:<type>;base64,<data>)")
    major, _, minor = media_type.partition("/")
    if major != kind or not minor:
        raise bad_encoding(where, f"data URL type {shown(media_type, 40) or '(none)'!r} is not {kind}/*")
    compact = _compact(payload, kind, where, max_bytes)
    try:
        data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as e:
        raise bad_encoding(where, f"data URL is not valid base64 ({e})") from None
    return Source("inline", "", data, media_type)


def _compact(text: str, kind: str, where: str, max_bytes: int | None) -> str:
    """Whitespace removed; too long refused first on the raw length (base64 wrapped at 76
    characters a line adds at most 2 characters of line break per 76), then on the exact one."""
    limit = encoded_limit(max_bytes) if max_bytes is not None else None
    if limit is not None and len(text) > limit + limit // 38 + 64:
        raise too_large(where, kind, max_bytes or 0)
    compact = _WHITESPACE.sub("", text)
    if limit is not None and len(compact) > limit:
        raise too_large(where, kind, max_bytes or 0)
    return compact


def _file_url_path(text: str, where: str) -> str:
    parts = urlsplit(text)
    if parts.netloc not in ("", "localhost"):
        raise disallowed(where, shown(text, 60), "a file URL must name this machine: file:///path")
    if parts.query or parts.fragment:
        raise disallowed(where, shown(text, 60), "a file URL takes no query or fragment")
    return unquote(parts.path)

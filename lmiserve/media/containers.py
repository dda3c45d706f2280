"""Is this video or audio file one of the accepted containers? A check of its first bytes (the
decoder that reads it later does the rest):

- video (MindIE: MP4, AVI, WMV): an ISO base media file (MP4; a QuickTime ``qt`` brand is MOV) has an
  ``ftyp`` box at offset 4; AVI is ``RIFF....AVI ``; WMV is an ASF file, which starts with the ASF
  header object's GUID.
- audio (MindIE: MP3, WAV, FLAC): MP3 starts with an ``ID3`` tag or an MPEG audio frame header
  (11 sync bits, then a valid version, layer, bitrate and sample rate; AAC's ADTS frames, layer 0,
  are not MP3); WAV is ``RIFF....WAVE``; FLAC is ``fLaC``.
"""

from __future__ import annotations

from lmiserve.media.errors import not_media

ASF_HEADER = bytes.fromhex("3026B2758E66CF11A6D900AA0062CE6C")
WHAT = {"video": "an MP4, AVI or WMV video", "audio": "an MP3, WAV or FLAC audio file"}


def video_format(data: bytes) -> str | None:
    if data[4:8] == b"ftyp":
        return "MOV" if data[8:12] == b"qt  " else "MP4"
    if data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return "AVI"
    if data[:16] == ASF_HEADER:
        return "WMV"
    return None


def audio_format(data: bytes) -> str | None:
    if data[:3] == b"ID3" or _mpeg_audio_frame(data[:4]):
        return "MP3"
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "WAV"
    if data[:4] == b"fLaC":
        return "FLAC"
    return None


def check_container(data: bytes, kind: str, where: str) -> str:
    """The format's name (``MP4``, ``MOV``, ``AVI``, ``WMV``, ``MP3``, ``WAV``, ``FLAC``), or
    :class:`MediaError` ``where: not an MP4, AVI or WMV video``."""
    if kind == "video":
        found = video_format(data)
    elif kind == "audio":
        found = audio_format(data)
    else:
        raise ValueError(f"containers are for video and audio, not {kind!r}")
    if found is None:
        raise not_media(where, WHAT[kind], "empty" if not data else "unknown container")
    return found


def _mpeg_audio_frame(head: bytes) -> bool:
    if len(head) < 4 or head[0] != 0xFF or head[1] & 0xE0 != 0xE0:
        return False
    version = (head[1] >> 3) & 0b11
    layer = (head[1] >> 1) & 0b11
    bitrate = head[2] >> 4
    rate = (head[2] >> 2) & 0b11
    return version != 0b01 and layer != 0 and bitrate != 0b1111 and rate != 0b11

"""A request's media, all at once: the counts checked first, then every image fetched and decoded
concurrently (decoding in worker threads), or one video or audio file loaded and its container
checked. The first failure cancels the rest and is raised."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any, TypeVar

import httpx

from lmiserve.media.containers import check_container
from lmiserve.media.fetch import load_bytes
from lmiserve.media.images import DecodedImage, decode_image
from lmiserve.media.policy import MediaPolicy
from lmiserve.media.refs import MediaRef

T = TypeVar("T")


async def resolve_images(
    refs: Sequence[MediaRef],
    policy: MediaPolicy,
    client: httpx.AsyncClient | None = None,
    *,
    exif_transpose: bool = False,
) -> list[DecodedImage]:
    """The image parts of ``refs`` decoded, in order; ``refs`` may hold the request's video and
    audio parts too, which count towards the limits but are not loaded here."""
    policy.check_counts(list(refs))
    images = [ref for ref in refs if ref.kind == "image"]
    if not images:
        return []

    async def one(ref: MediaRef, shared: httpx.AsyncClient | None) -> DecodedImage:
        data = await load_bytes(ref, policy, shared)
        return await asyncio.to_thread(decode_image, data, ref.where, policy, exif_transpose=exif_transpose)

    if client is not None or not any(_is_url(ref) for ref in images):
        return await _all(one(ref, client) for ref in images)
    async with httpx.AsyncClient(trust_env=False, timeout=policy.fetch_timeout_s) as shared:
        return await _all(one(ref, shared) for ref in images)


async def load_media(ref: MediaRef, policy: MediaPolicy, client: httpx.AsyncClient | None = None) -> bytes:
    """A video or audio part's bytes, in one of its accepted containers (:mod:`.containers`)."""
    if ref.kind not in ("video", "audio"):
        raise ValueError(f"load_media is for video and audio; decode images with resolve_images ({ref.where})")
    data = await load_bytes(ref, policy, client)
    check_container(data, ref.kind, ref.where)
    return data


async def _all(coros: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _is_url(ref: MediaRef) -> bool:
    return ref.source.lstrip()[:8].lower().startswith(("http://", "https://"))

"""A request's media, all at once: the counts checked first, then every image (and, for a model
that reads video, every video) fetched and decoded concurrently (decoding in worker threads), or
one video or audio file loaded and its container checked. The first failure cancels the rest and
is raised."""

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
from lmiserve.media.videos import DecodedVideo, FrameSampling, Sizer, decode_video

T = TypeVar("T")


async def resolve_media(
    refs: Sequence[MediaRef],
    policy: MediaPolicy,
    client: httpx.AsyncClient | None = None,
    *,
    exif_transpose: bool = False,
    video: tuple[FrameSampling, Sizer] | None = None,
) -> list[DecodedImage | DecodedVideo]:
    """The image parts of ``refs`` decoded, in order, and (given the model's frame ``video`` rules)
    its video parts among them; ``refs`` may hold other parts, which count towards the limits but
    are not loaded here."""
    policy.check_counts(list(refs))
    kinds = ("image", "video") if video is not None else ("image",)
    wanted = [ref for ref in refs if ref.kind in kinds]
    if not wanted:
        return []

    async def one(ref: MediaRef, shared: httpx.AsyncClient | None) -> DecodedImage | DecodedVideo:
        data = await load_bytes(ref, policy, shared)
        if ref.kind == "image":
            return await asyncio.to_thread(decode_image, data, ref.where, policy, exif_transpose=exif_transpose)
        assert video is not None
        check_container(data, "video", ref.where)
        return await asyncio.to_thread(decode_video, data, ref.where, policy, *video)

    if client is not None or not any(_is_url(ref) for ref in wanted):
        return await _all(one(ref, client) for ref in wanted)
    async with httpx.AsyncClient(trust_env=False, timeout=policy.fetch_timeout_s) as shared:
        return await _all(one(ref, shared) for ref in wanted)


async def load_media(ref: MediaRef, policy: MediaPolicy, client: httpx.AsyncClient | None = None) -> bytes:
    """A video or audio part's bytes, in one of its accepted containers (:mod:`.containers`)."""
    if ref.kind not in ("video", "audio"):
        raise ValueError(f"load_media is for video and audio; decode images with resolve_media ({ref.where})")
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

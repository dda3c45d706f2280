"""Media parts of a request (an image, a video or an audio file, by URL, data URL, base64 or local
path) turned into checked bytes or decoded pictures, in the API process: no torch, no engine.

    refs = [MediaRef("image", part["image_url"]["url"], "messages[0].content[1]")]
    images = await resolve_media(refs, MediaPolicy.from_options(options))

Every refusal is a :class:`MediaError` (400) whose message starts with the part's place.
"""

from lmiserve.media.containers import check_container
from lmiserve.media.errors import MediaError
from lmiserve.media.fetch import load_bytes
from lmiserve.media.images import DecodedImage, decode_image
from lmiserve.media.policy import MediaPolicy
from lmiserve.media.refs import KINDS, MediaRef
from lmiserve.media.resolve import load_media, resolve_media
from lmiserve.media.sources import Source, classify
from lmiserve.media.videos import DecodedVideo, FrameSampling, decode_video

__all__ = [
    "KINDS",
    "DecodedImage",
    "DecodedVideo",
    "FrameSampling",
    "MediaError",
    "MediaPolicy",
    "MediaRef",
    "Source",
    "check_container",
    "classify",
    "decode_image",
    "decode_video",
    "load_bytes",
    "load_media",
    "resolve_media",
]

"""Image bytes into RGB pixels, with the checks that keep a request from costing more than its
picture: only JPEG, PNG, WEBP, GIF and BMP are parsed (no other Pillow decoder ever sees request
bytes), animated GIF and WEBP are refused, and the size is checked from the header before any pixel
is decoded (``max_image_side`` each way, ``max_image_pixels`` in all), so a small file that
unpacks to gigabytes (a decompression bomb) costs nothing.

The result is what transformers' image processors and vLLM make of a picture: ``.convert("RGB")``
(transparency dropped, not composited on white; a palette image's colours expanded).

EXIF orientation is not applied by default: vLLM's server and transformers' processors (given an
image) use the stored pixels as they are, and a model's reference outputs come from those.
``exif_transpose=True`` turns a phone photo stored sideways upright, as transformers' own
``load_image`` helper does; the size checks then apply to the turned picture as well.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass

from PIL import Image, ImageOps

from lmiserve.media.errors import MediaError, not_media, too_many_pixels
from lmiserve.media.policy import MediaPolicy

FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")
_WHAT = "a JPEG, PNG, WEBP, GIF or BMP image"


@dataclass(frozen=True)
class DecodedImage:
    width: int
    height: int
    pixels: bytes
    """RGB, row-major, ``width * height * 3`` bytes."""
    digest: str
    """sha256 of the pixels and size (:func:`image_digest`): the same picture sent as PNG bytes, as
    a data URL or by URL has one digest; a JPEG of it has another (lossy)."""

    def to_pil(self) -> Image.Image:
        return Image.frombytes("RGB", (self.width, self.height), self.pixels)


def image_digest(width: int, height: int, pixels: bytes) -> str:
    h = hashlib.sha256(b"RGB")
    h.update(width.to_bytes(4, "big") + height.to_bytes(4, "big"))
    h.update(pixels)
    return h.hexdigest()


def decode_image(data: bytes, where: str, policy: MediaPolicy, *, exif_transpose: bool = False) -> DecodedImage:
    """Raise :class:`MediaError` (``where: not a ... image (why)`` or ``where: image too large
    (why)``) for anything but a picture within the policy's size."""
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
        with image:
            if image.format not in FORMATS:  # a subclass plugin reporting another name
                raise not_media(where, _WHAT, f"format {image.format}")
            if getattr(image, "is_animated", False):
                raise not_media(where, "a still image", f"animated {image.format}: send its frames as images")
            _check_size(image.size, where, policy)
            image.load()
            if exif_transpose:
                image = ImageOps.exif_transpose(image)
                _check_size(image.size, where, policy)
            rgb = image.convert("RGB")
    except Image.DecompressionBombError as e:
        raise too_many_pixels(where, str(e)) from None
    except Image.UnidentifiedImageError:
        raise not_media(where, _WHAT, "cannot identify image file") from None
    except (MediaError, MemoryError):
        raise
    except Exception as e:  # OSError, SyntaxError, ValueError, EOFError; a malformed file may raise others
        raise not_media(where, _WHAT, str(e) or type(e).__name__) from None
    width, height = rgb.size
    pixels = rgb.tobytes()
    return DecodedImage(width, height, pixels, image_digest(width, height, pixels))


def _check_size(size: tuple[int, int], where: str, policy: MediaPolicy) -> None:
    width, height = size
    if width <= 0 or height <= 0:
        raise not_media(where, _WHAT, f"size {width}x{height}")
    if max(width, height) > policy.max_image_side:
        raise too_many_pixels(where, f"{width}x{height}: more than {policy.max_image_side} pixels a side")
    if width * height > policy.max_image_pixels:
        raise too_many_pixels(where, f"{width}x{height}: more than {policy.max_image_pixels} pixels")

"""Pictures decoded into RGB pixels: the formats taken, the ones refused, and the size checks made
before any pixel is decoded."""

from __future__ import annotations

import asyncio
import base64
import io
import struct
import zlib

import pytest
from PIL import Image

from lmiserve.errors import BadRequest
from lmiserve.media import DecodedImage, MediaError, MediaPolicy, MediaRef, decode_image, resolve_media
from tests.unit.media.conftest import encoded, picture

WHERE = "messages[0].content[1]"
POLICY = MediaPolicy()


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG with a real header (IHDR) and no pixel data at all."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    ("fmt", "options", "exact"),
    [
        ("PNG", {}, True),
        ("WEBP", {"lossless": True}, True),
        ("BMP", {}, True),
        ("JPEG", {"quality": 95}, False),
    ],
)
def test_each_format_decodes_to_its_size_in_rgb(fmt, options, exact):
    image = picture()
    data = encoded(image, fmt, **options)
    decoded = decode_image(data, WHERE, POLICY)
    assert (decoded.width, decoded.height) == (7, 5)
    assert len(decoded.pixels) == 7 * 5 * 3
    if exact:
        assert decoded.pixels == image.tobytes()
    else:  # lossy: what Pillow itself reads from the file
        assert decoded.pixels == Image.open(io.BytesIO(data)).convert("RGB").tobytes() != image.tobytes()
    assert decoded.to_pil().tobytes() == decoded.pixels


def test_a_gif_palette_and_a_transparent_png_come_out_as_transformers_makes_them():
    image = Image.new("P", (4, 3))
    image.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 255] + [0] * (256 * 3 - 9))
    image.putdata([0, 1, 2, 0] * 3)
    gif = decode_image(encoded(image, "GIF"), WHERE, POLICY)
    assert gif.pixels == image.convert("RGB").tobytes()
    rgba = Image.new("RGBA", (2, 2), (10, 20, 30, 0))  # fully transparent: the colour stays, no white
    assert decode_image(encoded(rgba, "PNG"), WHERE, POLICY).pixels == bytes([10, 20, 30] * 4)


def test_the_same_pixels_in_png_and_lossless_webp_have_one_digest_and_other_pixels_another():
    png = decode_image(encoded(picture(), "PNG"), WHERE, POLICY)
    webp = decode_image(encoded(picture(), "WEBP", lossless=True), WHERE, POLICY)
    assert png.digest == webp.digest and len(png.digest) == 64
    assert decode_image(encoded(picture(7, 6), "PNG"), WHERE, POLICY).digest != png.digest


def test_bytes_that_are_no_picture_are_a_400_naming_the_part():
    with pytest.raises(MediaError) as caught:
        decode_image(b"hello, not a picture", WHERE, POLICY)
    error = caught.value
    assert isinstance(error, BadRequest) and error.status == 400 and error.reason == "not_media"
    assert str(error) == (
        "messages[0].content[1]: not a JPEG, PNG, WEBP, GIF or BMP image (cannot identify image file)"
    )


def test_a_tiff_is_not_taken_and_a_truncated_png_is_not_an_image():
    with pytest.raises(MediaError, match=r"^inputs\[2\]: not a JPEG, PNG, WEBP, GIF or BMP image"):
        decode_image(encoded(picture(), "TIFF"), "inputs[2]", POLICY)
    png = encoded(picture(64, 64), "PNG")
    with pytest.raises(MediaError, match=r"^inputs\[0\]: not a JPEG, PNG, WEBP, GIF or BMP image \(.+\)"):
        decode_image(png[: len(png) // 2], "inputs[0]", POLICY)


def test_an_animated_gif_is_refused_and_a_one_frame_gif_is_not():
    frames = [Image.new("RGB", (4, 4), c) for c in ("red", "blue")]
    animated = encoded(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    with pytest.raises(MediaError, match=r"^m: not a still image \(animated GIF"):
        decode_image(animated, "m", POLICY)
    assert decode_image(encoded(frames[0], "GIF"), "m", POLICY).width == 4


def test_a_header_past_the_pixel_budget_is_refused_before_any_pixel_is_read():
    # 9000 x 9000 is 81 M pixels: past the 64 Mi budget; the file has no pixel data, so a decoder
    # that tried would fail as "truncated" rather than "too large"
    with pytest.raises(MediaError) as caught:
        decode_image(_png_header_only(9000, 9000), WHERE, POLICY)
    assert str(caught.value) == f"{WHERE}: image too large (9000x9000: more than 67108864 pixels)"
    assert caught.value.reason == "too_large"
    with pytest.raises(MediaError, match=r"image too large \(20000x10: more than 16384 pixels a side\)"):
        decode_image(_png_header_only(20000, 10), WHERE, POLICY)
    small = MediaPolicy(max_image_pixels=100)
    with pytest.raises(MediaError, match=r"image too large \(11x10: more than 100 pixels\)"):
        decode_image(encoded(picture(11, 10), "PNG"), WHERE, small)
    assert decode_image(encoded(picture(10, 10), "PNG"), WHERE, small).width == 10


def test_a_pillow_decompression_bomb_is_too_large_not_a_crash():
    with pytest.raises(MediaError, match=r"image too large"):
        decode_image(_png_header_only(60000, 60000), WHERE, MediaPolicy(max_image_pixels=10**10, max_image_side=10**6))


def test_exif_orientation_is_kept_as_stored_unless_asked_to_turn_the_picture():
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: turn 90 degrees clockwise to view
    jpeg = encoded(picture(8, 4), "JPEG", exif=exif.tobytes())
    stored = decode_image(jpeg, WHERE, POLICY)
    turned = decode_image(jpeg, WHERE, POLICY, exif_transpose=True)
    assert (stored.width, stored.height) == (8, 4)
    assert (turned.width, turned.height) == (4, 8)


def test_one_picture_by_data_url_bare_base64_and_http_has_one_digest(media_server):
    png = encoded(picture(), "PNG")
    text = base64.b64encode(png).decode()
    url = media_server.add("same.png", png)
    refs = [
        MediaRef("image", f"data:image/png;base64,{text}", "messages[0].content[0]"),
        MediaRef("image", text, "messages[0].content[1]"),
        MediaRef("image", url, "messages[0].content[2]"),
    ]
    policy = MediaPolicy(allowed_domains=("127.0.0.1",))
    images = asyncio.run(resolve_media(refs, policy))
    assert all(isinstance(i, DecodedImage) for i in images)
    assert len({i.digest for i in images}) == 1
    assert images[0].pixels == picture().tobytes()


def test_resolve_media_keeps_the_order_and_raises_the_failing_part():
    good = base64.b64encode(encoded(picture(3, 2), "PNG")).decode()
    other = base64.b64encode(encoded(picture(2, 3), "PNG")).decode()
    refs = [MediaRef("image", good, "a"), MediaRef("video", "/x.mp4", "v"), MediaRef("image", other, "b")]
    assert [(i.width, i.height) for i in asyncio.run(resolve_media(refs, POLICY))] == [(3, 2), (2, 3)]
    bad = [MediaRef("image", good, "a"), MediaRef("image", "data:image/png;base64,aGVsbG8=", "b")]
    with pytest.raises(MediaError, match=r"^b: not a JPEG"):
        asyncio.run(resolve_media(bad, POLICY))

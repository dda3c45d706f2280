"""What a source string is taken for, the limits on counts and sizes, and the policy read from
serving.properties options."""

from __future__ import annotations

import asyncio
import base64

import pytest

from lmiserve.media import MediaError, MediaPolicy, MediaRef, classify, load_bytes, resolve_media
from tests.unit.media.conftest import encoded, picture

JPEG = encoded(picture(16, 16), "JPEG")
JPEG_B64 = base64.b64encode(JPEG).decode()


def test_the_defaults_are_mindies_limits():
    policy = MediaPolicy()
    assert policy.max_image_bytes == 20 * 1024 * 1024
    assert policy.max_video_bytes == 512 * 1024 * 1024
    assert policy.max_audio_bytes == 20 * 1024 * 1024
    assert policy.max_parts == 20
    assert (policy.allowed_domains, policy.allowed_local_path) == (None, None)
    assert (policy.allow_redirects, policy.allow_private, policy.limit_per_prompt) == (False, False, {})


@pytest.mark.parametrize(
    ("source", "form"),
    [
        (f"data:image/jpeg;base64,{JPEG_B64}", "inline"),
        (JPEG_B64, "inline"),  # a JPEG's base64 starts with "/9j/"
        ("\n".join(JPEG_B64[i : i + 76] for i in range(0, len(JPEG_B64), 76)), "inline"),
        ("https://example.com/a.jpg", "url"),
        ("HTTP://example.com/a.jpg", "url"),
        ("/data/images/a.jpg", "path"),
        ("images/a.jpg", "path"),
        ("/data/imgs", "path"),
        ("file:///data/a.jpg", "path"),
    ],
)
def test_what_each_source_is_taken_for(source, form):
    assert JPEG_B64.startswith("/9j/")
    found = classify(source, "image", "p")
    assert found.form == form
    if form == "inline":
        assert found.data == JPEG


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("data:image/png,rawbytes", "p: data URL is not base64 (write data:<type>;base64,<data>)"),
        ("data:text/plain;base64,aGVsbG8=", "p: data URL type 'text/plain' is not image/*"),
        ("data:;base64,aGVsbG8=", "p: data URL type '(none)' is not image/*"),
        ("data:image/png;base64", "p: bad data URL (no comma before the data)"),
        ("s3://bucket/a.png", "p: URL not allowed: s3://bucket/a.png (scheme 's3': only http and https are fetched)"),
        ("A" * 5000 + "=", "p: not valid base64 (and too long to be a file path)"),
        ("  \n", "p: empty media source"),
    ],
)
def test_bad_sources_are_refused_by_their_text(source, message):
    with pytest.raises(MediaError) as caught:
        classify(source, "image", "p")
    assert str(caught.value) == message


def test_a_data_url_with_broken_base64_is_bad_encoding():
    with pytest.raises(MediaError, match=r"^p: data URL is not valid base64") as caught:
        classify("data:image/png;base64,abc*def", "image", "p")
    assert caught.value.reason == "bad_encoding"


def test_inline_data_past_the_limit_is_refused_before_and_after_decoding():
    policy = MediaPolicy(max_image_bytes=1000)
    for size in (1001, 100_000):
        text = base64.b64encode(b"\0" * size).decode()
        for source in (text, f"data:image/png;base64,{text}"):
            with pytest.raises(MediaError) as caught:
                asyncio.run(load_bytes(MediaRef("image", source, "inputs[0]"), policy))
            assert str(caught.value) == "inputs[0]: image larger than 1000 bytes"
    fits = base64.b64encode(b"\0" * 1000).decode()
    assert asyncio.run(load_bytes(MediaRef("image", fits, "inputs[0]"), policy)) == b"\0" * 1000


def test_more_than_twenty_parts_are_refused_before_anything_is_loaded():
    refs = [MediaRef("image", f"http://192.0.2.1/{i}.png", f"messages[0].content[{i}]") for i in range(21)]
    with pytest.raises(MediaError) as caught:
        asyncio.run(resolve_media(refs, MediaPolicy()))
    assert str(caught.value) == (
        "messages[0].content[20]: too many media parts (at most 20 images, videos and audio files)"
    )
    assert caught.value.reason == "too_many"
    mixed = refs[:10] + [MediaRef("video", "v.mp4", f"v{i}") for i in range(6)]
    mixed += [MediaRef("audio", "a.wav", f"a{i}") for i in range(5)]
    with pytest.raises(MediaError, match=r"^a4: too many media parts"):
        MediaPolicy().check_counts(mixed)
    MediaPolicy().check_counts(mixed[:20])


def test_limit_mm_per_prompt_bounds_each_kind_it_names():
    policy = MediaPolicy(limit_per_prompt={"image": 2, "audio": 0})
    images = [MediaRef("image", "x", f"i{i}") for i in range(3)]
    policy.check_counts(images[:2] + [MediaRef("video", "v", "v0")] * 5)
    with pytest.raises(MediaError) as caught:
        policy.check_counts(images)
    assert str(caught.value) == "i2: too many media parts (at most 2 images; option.limit_mm_per_prompt)"
    with pytest.raises(MediaError, match=r"^a: too many media parts \(at most 0 audio files"):
        policy.check_counts([MediaRef("audio", "x", "a")])


def test_from_options_reads_each_key():
    policy = MediaPolicy.from_options(
        {
            "allowed_media_domains": "Images.Example.com, *.cdn.example.com,127.0.0.1",
            "allowed_local_media_path": "/data/media/",
            "limit_mm_per_prompt": '{"image": 2, "video": {"count": 1, "num_frames": 32}}',
            "media_fetch_timeout": "2.5",
            "media_allow_redirects": "true",
            "media_allow_private_addresses": "False",
        }
    )
    assert policy.allowed_domains == ("images.example.com", ".cdn.example.com", "127.0.0.1")
    assert policy.allowed_local_path == "/data/media"
    assert policy.limit_per_prompt == {"image": 2, "video": 1}
    assert (policy.fetch_timeout_s, policy.allow_redirects, policy.allow_private) == (2.5, True, False)
    assert MediaPolicy.from_options({"allowed_media_domains": '["a.com", "[::1]"]'}).allowed_domains == ("a.com", "::1")
    assert MediaPolicy.from_options({}) == MediaPolicy()
    assert len({policy, MediaPolicy(), MediaPolicy()}) == 2  # hashable, so usable as a cache key


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"limit_mm_per_prompt": "{image: 2}"}, "limit_mm_per_prompt is not JSON"),
        ({"limit_mm_per_prompt": '{"image": -1}'}, "image must be a whole number >= 0, not -1"),
        ({"limit_mm_per_prompt": '{"image": 1.5}'}, "image must be a whole number >= 0, not 1.5"),
        ({"limit_mm_per_prompt": '{"image": true}'}, "image must be a whole number >= 0, not True"),
        ({"limit_mm_per_prompt": '{"images": 1}'}, "unknown kind 'images'"),
        ({"limit_mm_per_prompt": "[1]"}, "must be a JSON object"),
        ({"allowed_media_domains": "https://a.com"}, "'https://a.com' is not a host name"),
        ({"allowed_media_domains": "a.com:8080"}, "'a.com:8080' is not a host name"),
        ({"allowed_media_domains": '["a.com"'}, "allowed_media_domains is not a JSON list"),
        ({"allowed_media_domains": "[1, 2]"}, "must be a JSON list of host names"),
        ({"allowed_local_media_path": "media"}, "must be an absolute path"),
        ({"media_fetch_timeout": "0"}, "media_fetch_timeout must be a number of seconds > 0"),
        ({"media_fetch_timeout": "soon"}, "media_fetch_timeout must be a number of seconds > 0"),
        ({"media_allow_redirects": "maybe"}, "media_allow_redirects must be true or false"),
    ],
)
def test_from_options_refuses_bad_values(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        MediaPolicy.from_options(options)


def test_a_suffix_entry_matches_the_hosts_below_it_only():
    policy = MediaPolicy(allowed_domains=("*.example.com", "exact.org"))
    assert policy.host_allowed("a.example.com") and policy.host_allowed("b.a.EXAMPLE.com.")
    assert not policy.host_allowed("example.com") and not policy.host_allowed("badexample.com")
    assert policy.host_allowed("exact.org") and not policy.host_allowed("sub.exact.org")
    assert MediaPolicy().host_allowed("anything.com") is None


def test_a_media_ref_names_one_of_three_kinds():
    with pytest.raises(ValueError, match="image, video, audio"):
        MediaRef("picture", "x", "p")

"""A vision-language model served over every protocol that carries pictures: OpenAI chat
(``image_url`` as a data URL and as an http URL, with the openai client), MindIE's multimodal
``inputs`` (the document's own example with a local path, and a base64 jpg), TGI's markdown
images; the greedy text equals transformers' for the same picture, and bad pictures get a 400 in
the protocol's own shape that names the part, while other requests go on."""

from __future__ import annotations

import base64
import http.server
import io
import threading

import httpx
import pytest
from openai import BadRequestError, OpenAI

from tests.tiny_video import video_bytes
from tests.tiny_vision import build_llava, hf_llava_greedy, picture, png_bytes

from .engine_server import start

N = 8


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory):
    return build_llava(tmp_path_factory.mktemp("llava") / "model")


@pytest.fixture(scope="module")
def pictures_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("pictures")
    (root / "test.png").write_bytes(png_bytes(picture(1)))
    (root / "two.png").write_bytes(png_bytes(picture(2)))
    return root


@pytest.fixture(scope="module")
def picture_server(pictures_dir):
    """Pictures over HTTP on loopback (404 for anything else)."""

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(pictures_dir), **kwargs)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def server(llava_dir, pictures_dir, tmp_path_factory):
    extra = (
        f"option.allowed_local_media_path={pictures_dir}\noption.allowed_media_domains=127.0.0.1\n"
        'option.limit_mm_per_prompt={"image": 3}\n'
    )
    with start(tmp_path_factory.mktemp("vision-server") / "m", llava_dir, extra) as s:
        s.wait_ready()
        yield s


def _text(llava_dir, messages, pictures) -> tuple[str, int]:
    from transformers import AutoTokenizer

    ids, gen = hf_llava_greedy(llava_dir, messages, pictures, N)
    return AutoTokenizer.from_pretrained(llava_dir).decode(gen, skip_special_tokens=True), len(ids)


def _data_url(image, fmt="png") -> str:
    buf = io.BytesIO()
    image.save(buf, format=fmt.upper())
    return f"data:image/{fmt};base64," + base64.b64encode(buf.getvalue()).decode()


def _chat(url: str, text: str = "What is this?") -> list[dict]:
    return [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}
    ]


def _hf_chat(text: str = "What is this?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]


def test_openai_client_sends_a_data_url_and_a_loopback_url(server, llava_dir, picture_server):
    client = OpenAI(base_url=server.url + "/v1", api_key="none")
    expected, prompt_tokens = _text(llava_dir, _hf_chat(), [picture(1)])
    for url in (_data_url(picture(1)), picture_server + "/test.png"):
        r = client.chat.completions.create(model="tiny", messages=_chat(url), max_tokens=N, temperature=0)
        assert r.choices[0].message.content == expected
        assert r.usage.prompt_tokens == prompt_tokens  # the picture's tokens counted
    stream = client.chat.completions.create(
        model="tiny", messages=_chat(picture_server + "/two.png"), max_tokens=N, temperature=0, stream=True
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        == _text(llava_dir, _hf_chat(), [picture(2)])[0]
    )


def _generated(r: httpx.Response) -> str:
    body = r.json()
    return (body[0] if isinstance(body, list) else body)["generated_text"]


def test_mindie_document_example_with_a_local_path_and_a_base64_jpg(server, llava_dir, pictures_dir):
    from PIL import Image

    prompt = "My name is Olivier and I\n<image>"
    example = {
        "inputs": [
            {"type": "text", "text": "My name is Olivier and I"},
            {"type": "image_url", "image_url": str(pictures_dir / "test.png")},
        ],
        "parameters": {"max_new_tokens": N, "details": True},
    }
    r = httpx.post(server.url + "/", json=example, timeout=60)
    assert r.status_code == 200, r.text
    assert _generated(r) == _text(llava_dir, prompt, [picture(1)])[0]
    buf = io.BytesIO()
    picture(3).save(buf, format="JPEG")
    as_decoded = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    example["inputs"][1]["image_url"] = base64.b64encode(buf.getvalue()).decode()
    r = httpx.post(server.url + "/", json=example, timeout=60)
    assert r.status_code == 200, r.text
    assert _generated(r) == _text(llava_dir, prompt, [as_decoded])[0]


def test_tgi_markdown_image(server, llava_dir, picture_server):
    r = httpx.post(
        server.url + "/generate",
        json={"inputs": f"Look: ![]({picture_server}/test.png) now", "parameters": {"max_new_tokens": N}},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["generated_text"] == _text(llava_dir, "Look: <image> now", [picture(1)])[0]


def test_models_say_the_model_takes_images(server):
    info = httpx.get(server.url + "/models/tiny", timeout=10).json()
    model = info[0] if isinstance(info, list) else info
    assert model["inputs"] == {"modalities": ["text", "image"], "limit_mm_per_prompt": {"image": 3}}


BAD = [
    (
        lambda u: "data:image/png;base64," + base64.b64encode(b"not a picture").decode(),
        "not a JPEG, PNG, WEBP, GIF or BMP image",
    ),
    (lambda u: u + "/missing.png", "404"),
    (lambda u: "http://10.1.2.3/x.png", "allowed_media_domains"),
    (lambda u: "file:///etc/passwd", "local"),
]


@pytest.mark.parametrize("bad,why", BAD, ids=["not-an-image", "404", "domain", "local-path"])
def test_bad_pictures_get_a_400_naming_the_part(server, picture_server, bad, why):
    client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(BadRequestError) as err:
        client.chat.completions.create(model="tiny", messages=_chat(bad(picture_server)), max_tokens=2)
    assert err.value.status_code == 400
    message = err.value.body["message"] if "message" in err.value.body else str(err.value.body)
    assert "messages[0].content[0]" in message and why in message


def test_too_many_pictures_and_audio_are_refused_and_others_go_on(server, picture_server):
    url = picture_server + "/test.png"
    parts = [{"type": "image_url", "image_url": url}] * 4 + [{"type": "text", "text": "hi"}]
    r = httpx.post(server.url + "/", json={"inputs": parts}, timeout=60)
    # TGI's and MindIE's shape for a request they refuse: {"error", "error_type": "validation"}, 422
    assert r.status_code == 422 and r.json()["error"].startswith("inputs[3]: ") and "at most 3" in r.text, r.text
    parts = [{"type": "audio_url", "audio_url": url}, {"type": "text", "text": "hi"}]
    r = httpx.post(server.url + "/", json={"inputs": parts}, timeout=60)
    assert r.status_code == 422 and r.json()["error"].startswith(
        "inputs[0]: an audio part: no model served here takes audio"
    ), r.text
    video = "data:video/mp4;base64," + base64.b64encode(video_bytes()).decode()
    parts = [{"type": "video_url", "video_url": video}, {"type": "text", "text": "hi"}]
    r = httpx.post(server.url + "/", json={"inputs": parts}, timeout=60)
    assert r.status_code == 422 and r.json()["error"].startswith("inputs[0]: model tiny takes images, not video"), (
        r.text
    )
    r = httpx.post(server.url + "/generate", json={"inputs": "Hi", "parameters": {"max_new_tokens": 2}}, timeout=60)
    assert r.status_code == 200


def test_a_text_only_model_refuses_pictures_in_each_protocol(engine_server, picture_server):
    url = picture_server + "/test.png"
    r = httpx.post(engine_server.url + "/v1/chat/completions", json={"messages": _chat(url)}, timeout=60)
    assert r.status_code == 400 and "reads text only" in r.json()["error"]["message"], r.text
    r = httpx.post(
        engine_server.url + "/",
        json={"inputs": [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": url}]},
        timeout=60,
    )
    assert r.status_code == 422 and r.json() == {
        "error": "inputs[1]: model tiny reads text only; it cannot take images",
        "error_type": "validation",
    }
    # TGI: markdown is text to a model without vision
    r = httpx.post(
        engine_server.url + "/generate", json={"inputs": f"![]({url})", "parameters": {"max_new_tokens": 2}}, timeout=60
    )
    assert r.status_code == 200


def test_lmi_invocations_and_databricks_chat_take_the_openai_parts(server, llava_dir, picture_server):
    expected, _ = _text(llava_dir, _hf_chat(), [picture(2)])
    body = {"messages": _chat(picture_server + "/two.png"), "max_tokens": N, "temperature": 0}
    for path in ("/invocations", "/serving-endpoints/tiny/invocations", "/serving-endpoints/chat/completions"):
        r = httpx.post(server.url + path, json=body, timeout=60)
        assert r.status_code == 200, (path, r.text)
        assert r.json()["choices"][0]["message"]["content"] == expected, path


def test_qwen2_5_vl_through_openai_and_mindie(tmp_path_factory, picture_server):
    """Pictures and a video (an MP4 in a data URL) through the openai client and MindIE's inputs."""
    from transformers import AutoTokenizer

    from lmiserve.generation.vision_prompt import VisionPrompt
    from lmiserve.media import FrameSampling, MediaPolicy, decode_video
    from tests.tiny_video import hf_qwen_video_greedy, video_prompt
    from tests.tiny_vision import build_qwen_vl, hf_qwen_greedy, qwen_prompt

    qwen_dir = build_qwen_vl(tmp_path_factory.mktemp("qwen-vl") / "model")
    tok = AutoTokenizer.from_pretrained(qwen_dir)
    wide = picture(8, 230, 70)
    ids, pictures = qwen_prompt(qwen_dir, [wide, "What is this?"])
    expected = tok.decode(hf_qwen_greedy(qwen_dir, ids, pictures, N), skip_special_tokens=True)
    with start(tmp_path_factory.mktemp("qwen-server") / "m", qwen_dir) as s:
        s.wait_ready()
        client = OpenAI(base_url=s.url + "/v1", api_key="none")
        r = client.chat.completions.create(model="tiny", messages=_chat(_data_url(wide)), max_tokens=N, temperature=0)
        assert r.choices[0].message.content == expected
        assert r.usage.prompt_tokens == len(ids)
        # MindIE's inputs: no template; the picture's placeholder on its own line
        n = len(qwen_prompt(qwen_dir, [wide])[0]) - len(qwen_prompt(qwen_dir, [])[0]) - 2
        special = [tok.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")]
        raw = tok("Describe\n")["input_ids"] + [special[0]] + [special[1]] * n + [special[2]]
        parts = [{"type": "text", "text": "Describe"}, {"type": "image_url", "image_url": _data_url(wide, "png")}]
        r = httpx.post(s.url + "/", json={"inputs": parts, "parameters": {"max_new_tokens": N}}, timeout=60)
        assert r.status_code == 200, r.text
        assert _generated(r) == tok.decode(hf_qwen_greedy(qwen_dir, raw, [wide], N), skip_special_tokens=True)
        # a video: 12 frames at 4 a second, sampled at 2 a second (6 frames, 3 grid steps)
        mp4 = video_bytes(frames=12, fps=4, width=96, height=64)
        rules = VisionPrompt.of(qwen_dir)
        clip = decode_video(mp4, "v", MediaPolicy(), FrameSampling(), rules.frame_size)
        assert (clip.frames, clip.fps) == (6, 2.0)
        ids, media = video_prompt(qwen_dir, [clip, "What happens?"])
        expected = tok.decode(hf_qwen_video_greedy(qwen_dir, ids, media, N), skip_special_tokens=True)
        url = "data:video/mp4;base64," + base64.b64encode(mp4).decode()
        messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}}]}]
        messages[0]["content"].append({"type": "text", "text": "What happens?"})
        r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=N, temperature=0)
        assert r.choices[0].message.content == expected and r.usage.prompt_tokens == len(ids)
        parts = [{"type": "video_url", "video_url": url}, {"type": "text", "text": "What happens?"}]
        r = httpx.post(s.url + "/", json={"inputs": parts, "parameters": {"max_new_tokens": N}}, timeout=60)
        assert r.status_code == 200, r.text
        info = httpx.get(s.url + "/models/tiny", timeout=10).json()
        model = info[0] if isinstance(info, list) else info
        assert model["inputs"]["modalities"] == ["text", "image", "video"]


def test_gemma3_through_openai(tmp_path_factory):
    from transformers import AutoTokenizer

    from tests.tiny_gemma3_vision import build_gemma3, gemma3_prompt, hf_gemma3_greedy

    gemma_dir = build_gemma3(tmp_path_factory.mktemp("gemma3") / "model", seed=2)
    tok = AutoTokenizer.from_pretrained(gemma_dir)
    text = tok.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = gemma3_prompt(gemma_dir, text, 1)
    expected = tok.decode(hf_gemma3_greedy(gemma_dir, ids, [picture(1)], N), skip_special_tokens=True)
    with start(tmp_path_factory.mktemp("gemma-server") / "m", gemma_dir) as s:
        s.wait_ready()
        client = OpenAI(base_url=s.url + "/v1", api_key="none")
        r = client.chat.completions.create(
            model="tiny", messages=_chat(_data_url(picture(1)), "What is it?"), max_tokens=N, temperature=0
        )
        assert r.choices[0].message.content == expected
        assert r.usage.prompt_tokens == len(ids)


def test_mindie_example_with_a_url_on_loopback(server, llava_dir, picture_server):
    example = {
        "inputs": [
            {"type": "text", "text": "My name is Olivier and I"},
            {"type": "image_url", "image_url": picture_server + "/test.png"},
        ],
        "parameters": {"max_new_tokens": N},
    }
    r = httpx.post(server.url + "/", json=example, timeout=60)
    assert r.status_code == 200, r.text
    assert _generated(r) == _text(llava_dir, "My name is Olivier and I\n<image>", [picture(1)])[0]


@pytest.mark.parametrize("bad,why", BAD, ids=["not-an-image", "404", "domain", "local-path"])
def test_bad_pictures_in_mindie_and_tgi_get_their_422_naming_the_part(server, picture_server, bad, why):
    url = bad(picture_server)
    parts = [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": url}]
    r = httpx.post(server.url + "/", json={"inputs": parts, "parameters": {"max_new_tokens": 2}}, timeout=60)
    assert r.status_code == 422 and r.json()["error_type"] == "validation", r.text
    assert r.json()["error"].startswith("inputs[1]: ") and why in r.json()["error"], r.text
    if url.startswith(("http", "data:")):  # TGI's markdown takes URLs only
        body = {"inputs": f"Look ![]({url})", "parameters": {"max_new_tokens": 2}}
        r = httpx.post(server.url + "/generate", json=body, timeout=60)
        assert r.status_code == 422 and r.json()["error"].startswith("inputs (image 0): ") and why in r.text, r.text

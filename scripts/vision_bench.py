#!/usr/bin/env python3
"""What a picture costs on the engine, in-process on the CPU, for a small LLaVA-1.5 shape (a CLIP tower
at 336 px, 576 image tokens, a random Llama) or Qwen2.5-VL shape (a windowed tower, 256 tokens for the
picture), one 448x448 picture a request:

    python scripts/vision_bench.py [--family llava|qwen2.5-vl] [--shape proportional|tests] [--new-tokens 64]
                                   [--concurrency 8] [--runs 3] [--video-frames 8]

- TTFT of one picture request, against the tower alone plus a text prompt of the same length run
  alone (what the work costs without any overhead of carrying the picture through the engine);
- throughput of ``--concurrency`` picture requests (each its own picture) against the same load of
  text-only prompts of the same token count;
- one picture request on the engine against transformers' ``generate`` (batch 1, tokens/s);
- (Qwen2.5-VL) TTFT of one video request against its tower alone plus a text prompt as long.

Figures are medians over ``--runs``; the machine's class is printed with them."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from lmiserve.cpu_isa import cpu_model_name, isa_class  # noqa: E402
from lmiserve.rolling_batch.core.engine import Engine, EngineConfig  # noqa: E402
from lmiserve.wire import SamplingParams  # noqa: E402
from tests.tiny_vision import build_llava, build_qwen_vl, image_inputs, picture, qwen_prompt  # noqa: E402

SHAPES = {
    "tests": {},
    "proportional": {"text_hidden": 512, "text_layers": 12, "vision_hidden": 256, "vision_layers": 4},
}


def engine(model_dir: Path, concurrency: int, dtype: str) -> Engine:
    return Engine(
        EngineConfig(
            model_dir=model_dir, dtype=dtype, device="cpu", max_num_seqs=max(8, concurrency),
            max_num_batched_tokens=2048, max_model_len=2048, block_size=16, kv_cache_bytes=None,
            enable_prefix_caching=False,
        )
    )  # fmt: skip


def run(eng: Engine, requests: list[tuple[list[int], list]], new_tokens: int) -> tuple[float, float, int]:
    """(seconds to the first token of the first request, seconds in all, tokens generated)."""
    token_id = eng.spec.image_token_id
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    for i, (ids, pics) in enumerate(requests):
        eng.add_request(f"r{time.monotonic_ns()}-{i}", ids, params, images=image_inputs(ids, pics, token_id))
    first = None
    tokens = 0
    while eng.has_work():
        for d in eng.step():
            tokens += len(d.token_ids)
            if first is None and d.token_ids:
                first = time.perf_counter() - start
    return first or 0.0, time.perf_counter() - start, tokens


def reference_inputs(model_dir: Path, family: str) -> tuple[list[int], Callable[[Any], dict[str, Any]]]:
    """The prompt's ids (one 448x448 picture, then "Describe the picture."), and transformers'
    ``generate`` inputs for a picture."""
    if family == "llava":
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(model_dir)
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the picture."}]}]
        rendered = processor.apply_chat_template(messages, add_generation_prompt=True)

        def llava(pic: Any) -> dict[str, Any]:
            return dict(processor(images=[pic], text=rendered, return_tensors="pt"))

        return llava(picture(0, 448, 448))["input_ids"][0].tolist(), llava
    from transformers import AutoImageProcessor

    ids, _ = qwen_prompt(model_dir, [picture(0, 448, 448), "Describe the picture."])
    images = AutoImageProcessor.from_pretrained(model_dir)
    input_ids = torch.tensor([ids])
    pad = max(set(ids), key=ids.count)

    def qwen(pic: Any) -> dict[str, Any]:
        px = images(images=[pic], return_tensors="pt")
        return {"input_ids": input_ids, "mm_token_type_ids": (input_ids == pad).int(), **px}

    return ids, qwen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image-size", type=int, default=336)
    ap.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="proportional",
        help="tests: the tests' tiny model (a 3-layer tower heavier than its 2-layer, 64-wide language model); "
        "proportional: a 12-layer, 512-wide language model and a 4-layer, 256-wide tower, about LLaVA-1.5-7B's "
        "ratio of tower to language-model work",
    )
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument(
        "--dtype", default="bf16", help="the engine's (transformers runs the checkpoint's fp32, its CPU default)"
    )
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--family", choices=("llava", "qwen2.5-vl"), default="llava")
    ap.add_argument(
        "--video-frames", type=int, default=8, help="qwen2.5-vl: also a video of this many frames (0: none)"
    )
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp())
    if args.family == "llava":
        model_dir = build_llava(root / "llava", image_size=args.image_size, **SHAPES[args.shape])
    else:  # the processor's own default pixel bounds: a 448x448 picture is 16 x 16 tokens
        model_dir = build_qwen_vl(
            root / "qwen", max_pixels=28 * 28 * 16384, video_max_pixels=768 * 28 * 28, **SHAPES[args.shape]
        )
    ids, hf_inputs = reference_inputs(model_dir, args.family)
    token_id = ids[max(range(len(ids)), key=lambda i: ids.count(ids[i]))]  # the placeholder: the most frequent id
    text_ids = [t if t != token_id else 100 + (i % 200) for i, t in enumerate(ids)]  # as long, no picture
    eng = engine(model_dir, args.concurrency, args.dtype)
    vision = eng.runner.images.vision
    n = args.new_tokens
    run(eng, [(ids, [picture(99, 448, 448)])], 2)  # warm-up
    rows: dict[str, list[float]] = {
        k: [] for k in ("ttft", "tower", "text_ttft", "img_tps", "text_tps", "hf_tps", "one_tps")
    }
    for r in range(args.runs):
        pic = picture(1000 + r, 448, 448)
        t = time.perf_counter()
        vision.encode(image_inputs(ids, [pic], token_id))
        rows["tower"].append(time.perf_counter() - t)
        rows["text_ttft"].append(run(eng, [(text_ids, [])], 1)[0])
        ttft, total, tokens = run(eng, [(ids, [picture(2000 + r, 448, 448)])], n)
        rows["ttft"].append(ttft)
        rows["one_tps"].append(tokens / total)
        load = [(ids, [picture(3000 + 100 * r + i, 448, 448)]) for i in range(args.concurrency)]
        _, total, tokens = run(eng, load, n)
        rows["img_tps"].append(tokens / total)
        _, total, tokens = run(eng, [(text_ids, [])] * args.concurrency, n)
        rows["text_tps"].append(tokens / total)
    from transformers import AutoModelForImageTextToText

    hf = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    for r in range(args.runs):
        inputs = hf_inputs(picture(4000 + r, 448, 448))
        t = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        rows["hf_tps"].append((out.shape[1] - inputs["input_ids"].shape[1]) / (time.perf_counter() - t))
    if args.family == "qwen2.5-vl" and args.video_frames:
        video_rows(model_dir, eng, args, rows)
    m = {k: statistics.median(v) for k, v in rows.items()}
    print(f"{args.family}, shape {args.shape}: {cpu_model_name()}, class {isa_class()}, torch threads {torch.get_num_threads()}, {len(ids)}-token prompt "
          f"({len(ids) - ids.count(token_id)} text + {ids.count(token_id)} image), {n} new tokens, engine {args.dtype}, median of {args.runs}")  # fmt: skip
    print("| figure | value |\n|---|---|")
    print(f"| TTFT, one picture request | {m['ttft'] * 1e3:.1f} ms |")
    print(
        f"| tower alone + the same-length text prompt alone | {m['tower'] * 1e3:.1f} + {m['text_ttft'] * 1e3:.1f} ms |"
    )
    print(f"| TTFT / (tower + text) | {m['ttft'] / (m['tower'] + m['text_ttft']):.2f} |")
    print(
        f"| c={args.concurrency} tok/s, pictures / text-only | {m['img_tps']:.0f} / {m['text_tps']:.0f} = {m['img_tps'] / m['text_tps']:.2f} |"
    )
    print(
        f"| batch 1 tok/s, engine / transformers generate | {m['one_tps']:.0f} / {m['hf_tps']:.0f} = {m['one_tps'] / m['hf_tps']:.2f}x |"
    )
    if "video_ttft" in m:
        print(f"| TTFT, one video request ({args.video_frames} frames of 448x448, {m['video_tokens']:.0f} tokens) | {m['video_ttft'] * 1e3:.1f} ms |")  # fmt: skip
        print(f"| its tower alone + the same-length text prompt alone | {m['video_tower'] * 1e3:.1f} + {m['video_text'] * 1e3:.1f} ms |")  # fmt: skip
        print(f"| TTFT / (tower + text), video | {m['video_ttft'] / (m['video_tower'] + m['video_text']):.2f} |")


def video_rows(model_dir: Path, eng: Engine, args: argparse.Namespace, rows: dict[str, list[float]]) -> None:
    """A request with one video of ``--video-frames`` 448x448 frames (2 a second, as sampled)."""
    from tests.tiny_video import clip, media_inputs, video_prompt

    video_token = eng.runner.images.token_ids[1]
    for r in range(args.runs):
        c = clip(5000 + r, args.video_frames, 448, 448)
        ids, media = video_prompt(model_dir, [c, "Describe the video."])
        inputs = media_inputs(ids, media, eng.spec.image_token_id, video_token)
        text_ids = [t if t != video_token else 100 + (i % 200) for i, t in enumerate(ids)]
        t = time.perf_counter()
        eng.runner.images.vision.encode(inputs)
        rows.setdefault("video_tower", []).append(time.perf_counter() - t)
        rows.setdefault("video_text", []).append(run(eng, [(text_ids, [])], 1)[0])
        start = time.perf_counter()
        eng.add_request(f"v{r}", ids, SamplingParams(max_new_tokens=1), images=inputs)
        while eng.has_work():
            eng.step()
        rows.setdefault("video_ttft", []).append(time.perf_counter() - start)
        rows.setdefault("video_tokens", []).append(ids.count(video_token))


if __name__ == "__main__":
    main()

"""LLaVA on the engine: greedy tokens equal transformers' for the same pictures and text, alone
and in a running batch with text-only requests, with prefix-cache and encoder-cache hits."""

from __future__ import annotations

import pytest

from lmiserve.wire import SamplingParams
from tests.tiny_vision import build_llava, hf_llava_greedy, image_inputs, picture

from .engine_helpers import make_engine, run_pictures

pytestmark = pytest.mark.usefixtures("scheduling")

SYSTEM = "Paged attention stores the key value cache in fixed-size blocks. "


def _user(*parts) -> dict:
    return {"role": "user", "content": [{"type": "image"} if p is None else {"type": "text", "text": p} for p in parts]}


CASES = {
    "one image": ([_user(None, "What is this?")], [1]),
    "two images": ([_user("Compare", None, "with", None)], [2, 3]),
    "image in the second turn": (
        [
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
            _user(None, "And this?"),
        ],
        [4],
    ),
    "text first, then the image": ([_user(SYSTEM * 2, None, "Describe it.")], [5]),
}


@pytest.fixture(scope="module", params=["llava", "llava-next"])
def llava_dir(request, tmp_path_factory):
    return build_llava(tmp_path_factory.mktemp(request.param), next_=request.param == "llava-next")


@pytest.fixture(scope="module")
def references(llava_dir):
    out = {}
    for name, (messages, seeds) in CASES.items():
        pictures = [picture(s) for s in seeds]
        out[name] = (*hf_llava_greedy(llava_dir, messages, pictures, 12), pictures)
    return out


def _run(engine, requests):
    return run_pictures(engine, requests, 12)


def test_each_conversation_alone_equals_transformers(llava_dir, references):
    engine = make_engine(llava_dir, max_num_batched_tokens=24)  # prompts (and images) run in chunks
    for name, (ids, expected, pictures) in references.items():
        assert _run(engine, {name: (ids, pictures)})[name] == expected, name
    assert engine.blocks.num_used_blocks == 0


def test_mixed_batch_with_text_only_requests(llava_dir, references):
    engine = make_engine(llava_dir, max_num_batched_tokens=64)
    text = [_user("The quick brown fox jumps over the lazy dog.")]
    text_ids, text_expected = hf_llava_greedy(llava_dir, text, [], 12)
    requests = {name: (ids, pictures) for name, (ids, _, pictures) in references.items()}
    requests["text"] = (text_ids, [])
    tokens = _run(engine, requests)
    for name, (_, expected, _) in references.items():
        assert tokens[name] == expected, name
    assert tokens["text"] == text_expected


def test_prefix_cache_hits_the_text_before_the_image_and_never_another_image(llava_dir, references):
    engine = make_engine(llava_dir, max_num_batched_tokens=256)
    ids, expected, pictures = references["text first, then the image"]
    other = [picture(99)]
    messages = CASES["text first, then the image"][0]
    _, expected_other = hf_llava_greedy(llava_dir, messages, other, 12)
    assert _run(engine, {"a": (ids, pictures)})["a"] == expected
    hits = engine.blocks.prefix_hit_tokens
    assert _run(engine, {"b": (ids, other)})["b"] == expected_other
    shared = engine.blocks.prefix_hit_tokens - hits
    first_image = ids.index(engine.spec.image_token_id)
    assert 0 < shared <= first_image  # the text before the picture, not a block that holds it
    hits = engine.blocks.prefix_hit_tokens
    assert _run(engine, {"c": (ids, pictures)})["c"] == expected  # the same picture again
    assert engine.blocks.prefix_hit_tokens - hits > first_image  # blocks that hold the picture are shared
    assert engine.runner.images.encoded == 2


def test_encoder_cache_serves_a_repeated_picture_with_the_same_tokens(llava_dir, references):
    engine = make_engine(llava_dir, max_num_batched_tokens=256, enable_prefix_caching=False)
    ids, expected, pictures = references["one image"]
    assert _run(engine, {"a": (ids, pictures)})["a"] == expected
    assert _run(engine, {"b": (ids, pictures)})["b"] == expected
    assert engine.runner.images.encoded == 1 and engine.runner.images.hits >= 1


def test_a_request_whose_placeholders_do_not_fit_its_pictures_is_refused(llava_dir, references):
    from lmiserve.rolling_batch.core.admission import RequestRejected

    engine = make_engine(llava_dir)
    ids, _, pictures = references["one image"]
    with pytest.raises(RequestRejected, match="placeholder tokens that nothing fills"):
        engine.add_request("a", ids, SamplingParams(max_new_tokens=2))
    images = image_inputs(ids, pictures, engine.spec.image_token_id)
    short = [images[0].__class__(**{**{f: getattr(images[0], f) for f in images[0].__struct_fields__}, "length": 3})]
    given = ids.count(engine.spec.image_token_id)  # transformers' processor's count (16; LLaVA-NeXT: by size)
    with pytest.raises(
        RequestRejected, match=f"takes 3 placeholder tokens; this model gives {given} for a 100x80 picture"
    ):
        engine.add_request("b", ids, SamplingParams(max_new_tokens=2), images=short)


def test_preemption_and_replay_keep_the_tokens(llava_dir, references):
    engine = make_engine(llava_dir, max_model_len=256, max_num_batched_tokens=64)
    longest = max(len(ids) for ids, _, _ in references.values()) + 12
    engine.blocks.__init__(-(-longest // 16) + 2, 16)  # the longest fits, not all four: preemption and recompute
    engine.scheduler.blocks = engine.blocks
    requests = {name: (ids, pictures) for name, (ids, _, pictures) in references.items()}
    tokens = _run(engine, requests)
    assert engine.scheduler.num_preemptions > 0
    for name, (_, expected, _) in references.items():
        assert tokens[name] == expected, name
    # a replay after an engine died: the request brings the tokens it had, and goes on from there
    engine = make_engine(llava_dir)
    ids, expected, pictures = references["two images"]
    images = image_inputs(ids, pictures, engine.spec.image_token_id)
    engine.add_request("r", ids, SamplingParams(max_new_tokens=12), images=images, output_ids=expected[:5])
    rest: list[int] = []
    while engine.has_work():
        for d in engine.step():
            rest.extend(d.token_ids)
    assert expected[:5] + rest == expected


def test_deterministic_mode_gives_the_same_tokens_alone_and_batched(llava_dir, references):
    alone = {}
    for name, (ids, expected, pictures) in references.items():
        engine = make_engine(llava_dir, deterministic=True, max_num_batched_tokens=256)
        alone[name] = _run(engine, {name: (ids, pictures)})[name]
        assert alone[name] == expected, name
    engine = make_engine(llava_dir, deterministic=True, max_num_batched_tokens=256)
    batched = _run(engine, {name: (ids, pictures) for name, (ids, _, pictures) in references.items()})
    assert batched == alone


def test_a_lora_adapter_on_the_language_model_equals_peft(llava_dir, references, tmp_path):
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from lmiserve import wire
    from lmiserve.rolling_batch.lora.peft_weights import AdapterFormatError, read_adapter

    def adapter(out, targets):
        torch.manual_seed(3)
        base = AutoModelForImageTextToText.from_pretrained(llava_dir, dtype=torch.float32)
        model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False))
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_" in name:
                    param.mul_(3.0)
        model.save_pretrained(out)
        return out

    lm = adapter(tmp_path / "lm", r".*language_model.*\.(q_proj|v_proj|down_proj)")
    engine = make_engine(llava_dir, enable_lora=True, max_loras=1, max_lora_rank=8)
    result = engine.adapter_command(wire.AdapterCommand(op_id=0, action="register", name="lm", src=str(lm)))
    assert result.kind is None, result.error
    messages, _ = CASES["one image"]
    ids, _, pictures = references["one image"]
    processor = AutoProcessor.from_pretrained(llava_dir)
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(images=pictures, text=prompt, return_tensors="pt")
    reference = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(llava_dir), lm).eval()
    with torch.no_grad():
        want = reference.generate(**inputs, max_new_tokens=12, do_sample=False)[0, len(ids) :].tolist()
    images = image_inputs(ids, pictures, engine.spec.image_token_id)
    engine.add_request("a", ids, SamplingParams(max_new_tokens=12), "lm", images=images)
    tokens: list[int] = []
    while engine.has_work():
        for d in engine.step():
            tokens.extend(d.token_ids)
    eos = reference.generation_config.eos_token_id
    assert tokens == (want[: want.index(eos) + 1] if eos in want else want)
    assert tokens != references["one image"][1]  # the adapter changes the answer
    # a plain target list also wraps the tower's projections of the same name: refused, not misread
    both = adapter(tmp_path / "both", ["q_proj", "v_proj"])
    with pytest.raises(AdapterFormatError, match="adapts a vision tower"):
        read_adapter(both, engine.spec, 8, torch.float32)

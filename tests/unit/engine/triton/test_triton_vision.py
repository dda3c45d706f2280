"""LLaVA on the CUDA ops (Triton kernels, interpreted on the CPU where there is no GPU): the
tower's projections on the ops' linear kernel, the image steps eager, the decode steps replayed from
captured graphs; transformers' greedy tokens, token for token."""

from lmiserve.rolling_batch.runner import graphs
from tests.tiny_vision import build_llava, hf_llava_greedy, picture
from tests.unit.engine.engine_helpers import make_engine, run_pictures
from tests.unit.engine.recording_graphs import RecordingBackend


def test_llava_on_the_cuda_ops_with_decode_graphs(monkeypatch, tmp_path, kernel_device):
    recorder = RecordingBackend()
    monkeypatch.setattr(graphs, "backend_for", lambda device: recorder)
    model_dir = build_llava(tmp_path / "llava")
    pictures = [picture(1), picture(2)]
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}]}]
    ids, expected = hf_llava_greedy(model_dir, messages, pictures, 5)
    engine = make_engine(
        model_dir, ops="cuda", device=kernel_device, max_num_seqs=2, max_num_batched_tokens=32,
        max_decode_step_prefill_tokens=16,
    )  # fmt: skip
    assert engine.runner.ops.name == "cuda" and engine.runner.graphs is not None
    tokens = run_pictures(engine, {"a": (ids, pictures)}, 5)["a"]
    assert tokens == expected
    assert engine.runner.graphs.replays > 0  # the decodes
    assert engine.runner.images.encoded == 2


def test_qwen2_5_vl_on_the_cuda_ops(tmp_path, kernel_device):
    """A picture and a video (three frames: two grid steps, the last padded) in one prompt."""
    from tests.tiny_video import clip, hf_qwen_video_greedy, video_prompt
    from tests.tiny_vision import build_qwen_vl

    model_dir = build_qwen_vl(tmp_path / "qwen")
    ids, media = video_prompt(model_dir, ["What is this?", picture(1, 100, 80), "and", clip(2, 3, 56, 56)])
    expected = hf_qwen_video_greedy(model_dir, ids, media, 5)
    engine = make_engine(model_dir, ops="cuda", device=kernel_device, max_num_batched_tokens=16, enforce_eager=True)
    tokens = run_pictures(engine, {"a": (ids, media)}, 5)["a"]
    assert tokens == expected


def test_qwen2_5_vl_decodes_replay_graphs_at_shifted_positions(monkeypatch, tmp_path, kernel_device):
    from tests.tiny_vision import build_qwen_vl, hf_qwen_greedy, qwen_prompt

    recorder = RecordingBackend()
    monkeypatch.setattr(graphs, "backend_for", lambda device: recorder)
    model_dir = build_qwen_vl(tmp_path / "qwen")
    ids, pictures = qwen_prompt(model_dir, [picture(5, 180, 60), "Describe it."])
    engine = make_engine(model_dir, ops="cuda", device=kernel_device, max_num_seqs=2, max_num_batched_tokens=64)
    tokens = run_pictures(engine, {"a": (ids, pictures)}, 5)["a"]
    assert tokens == hf_qwen_greedy(model_dir, ids, pictures, 5)
    assert engine.runner.steps[("eager", "prompt", False)] >= 1  # the picture's prompt, eagerly
    assert engine.runner.graphs.replays >= 4  # its decodes, from the graphs


def test_gemma3_vision_on_the_cuda_ops(tmp_path, kernel_device):
    from tests.tiny_gemma3_vision import build_gemma3, gemma3_prompt, hf_gemma3_greedy

    model_dir = build_gemma3(tmp_path / "gemma3", seed=2)
    ids = gemma3_prompt(model_dir, "<s>user\nLook <start_of_image> what is it?</s>\n<s>assistant\n", 1)
    engine = make_engine(model_dir, ops="cuda", device=kernel_device, max_num_batched_tokens=7, enforce_eager=True)
    tokens = run_pictures(engine, {"a": (ids, [picture(1)])}, 6)["a"]
    assert tokens == hf_gemma3_greedy(model_dir, ids, [picture(1)], 6)


def test_qwen3_vl_on_the_cuda_ops(tmp_path, kernel_device):
    """DeepStack's additions and the interleaved rotary sections on the CUDA ops, chunked."""
    from tests.tiny_qwen3_vl import build_qwen3_vl
    from tests.tiny_vision import hf_qwen_greedy, qwen_prompt

    model_dir = build_qwen3_vl(tmp_path / "qwen3")
    ids, pictures = qwen_prompt(model_dir, ["What is this?", picture(1, 100, 80)])
    engine = make_engine(model_dir, ops="cuda", device=kernel_device, max_num_batched_tokens=16, enforce_eager=True)
    tokens = run_pictures(engine, {"a": (ids, pictures)}, 5)["a"]
    assert tokens == hf_qwen_greedy(model_dir, ids, pictures, 5)

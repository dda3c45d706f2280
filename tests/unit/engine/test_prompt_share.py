"""The prompt share of a decode step measured on the CPU: the share from the linear layers' times,
the measurement kept for the next start, and placement taking it where the setting is empty."""

from __future__ import annotations

import pytest
import torch

from lmiserve.rolling_batch.ops.cpu_dtype import Layer
from lmiserve.rolling_batch.runner import placement, prompt_share
from lmiserve.rolling_batch.runner.prompt_share import MAX_SHARE, measure_share, share_of
from tests.tiny_models import build_model


def test_the_share_makes_a_full_batchs_prompt_tokens_cost_twice_its_decodes() -> None:
    # 48 more rows cost 2 ms: a prompt row 1/24 ms; 16 decodes 2 ms; twice that is 96 prompt rows
    assert share_of(0.002, 0.004) == 6
    assert share_of(0.002, 0.050) == 1  # dear prompt tokens: at least one a sequence
    assert share_of(0.002, 0.0021) == MAX_SHARE  # nearly free ones: at most MAX_SHARE
    assert share_of(0.002, 0.0019) == MAX_SHARE  # a noisy measurement that found no cost


def test_a_real_measurement_runs_the_layers_as_the_engine_does() -> None:
    from lmiserve.rolling_batch.ops.cpu import CpuOps

    layers = [Layer("o_proj", 64, 128, "q4_1"), Layer("down_proj", 128, 64)]
    for dense_rows in (0, 4):
        share, decode_s, chunk_s = measure_share(layers, 3, torch.bfloat16, dense_rows, CpuOps())
        assert 1 <= share <= MAX_SHARE and decode_s > 0 and chunk_s > 0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("share") / "hf", arch="llama", seed=3)


def test_the_measurement_is_kept_for_the_next_start(model_dir, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("LMISERVE_CACHE", str(tmp_path))
    calls = []

    def fake(layers, count, dtype, dense_rows, ops):  # type: ignore[no-untyped-def]
        calls.append((dtype, dense_rows))
        return 8, 0.002, 0.003

    monkeypatch.setattr(prompt_share, "measure_share", fake)
    first, why = prompt_share.measured_share(model_dir, "bf16")
    second, again = prompt_share.measured_share(model_dir, "bf16")
    assert first == second == 8 and calls == [(torch.bfloat16, 0)]
    assert "prompt share 8" in why and "earlier start" not in why and "earlier start" in again
    prompt_share.measured_share(model_dir, "bf16", dense_rows=4)  # another question: measured anew
    prompt_share.measured_share(model_dir, "fp32")
    assert calls[1:] == [(torch.bfloat16, 4), (torch.float32, 0)]
    share, why = prompt_share.measured_share(tmp_path / "nothing", "bf16")
    assert share is None and "shapes were not read" in why


@pytest.mark.parametrize(
    "measured, text, device, want, kept",
    [
        (8, "", "cpu", 8, 0),  # cheap prompt tokens: the share is raised
        (2, "", "cpu", 4, 2),  # dear ones: the device default stays, the measurement is kept for its ramp
        (8, "option.decode_step_prefill_tokens_per_sequence=3\n", "cpu", 3, 0),  # the setting: not measured
        (8, "option.max_first_token_wait=2\n", "cpu", None, 0),  # prompts whole beside decodes
        (8, "", "cuda:0", None, 0),  # a GPU: no share, nothing measured
    ],
)
def test_placement_takes_the_measured_share_where_the_setting_is_empty(
    model_dir, monkeypatch, tmp_path, measured, text, device, want, kept
) -> None:
    from lmiserve.config.loader import load_settings
    from lmiserve.rolling_batch.engine_config import engine_options

    asked = []
    monkeypatch.setattr(
        prompt_share, "measured_share", lambda path, dtype, rows, quantize, int8: asked.append(path) or (measured, "m")
    )
    monkeypatch.setattr(placement, "resolve_device", lambda spec: device)
    monkeypatch.setattr(placement, "resolve_dtype", lambda spec, device: ("bf16", "native"))
    monkeypatch.setattr(placement, "cpu_has_native_bf16", lambda: True)
    (tmp_path / "serving.properties").write_text(text)
    s = load_settings(tmp_path, env={})
    config, why = placement.placed_config(str(model_dir), engine_options(s.model, s.engine))
    assert config.decode_step_prefill_tokens_per_sequence == want
    assert config.measured_prompt_share == kept
    assert asked == ([model_dir] if not text and device == "cpu" else [])
    assert ("never below the device default" in why) == bool(asked)

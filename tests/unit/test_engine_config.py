"""EngineConfig: each field names its setting, and the device defaults fill in the settings left empty."""

from dataclasses import fields

import pytest

from lmiserve.config import load_settings
from lmiserve.config.device_defaults import DEVICE_DEFAULTS, DeviceDefaults
from lmiserve.config.loader import SPECS_BY_FIELD, SPECS_BY_KEY
from lmiserve.rolling_batch.engine_config import EngineConfig, engine_options
from lmiserve.rolling_batch.runner import placement
from lmiserve.rolling_batch.runner.placement import engine_config

NOT_SETTINGS = {"ops", "gguf_dense_rows", "measured_prompt_share"}
"""Fields no setting sets (the ops implementation follows the device, tests name one; the rows from
which GGUF layers run dense and the prompt share below the default are measured)."""


def test_every_field_names_a_declared_setting():
    for f in fields(EngineConfig):
        key = f.metadata.get("setting")
        if f.name in NOT_SETTINGS:
            assert key is None, f.name
        else:
            assert key in SPECS_BY_KEY, f"EngineConfig.{f.name} names {key!r}, which is not a declared setting"


def _config(tmp_path, text, monkeypatch, device="cpu"):
    monkeypatch.setattr(placement, "resolve_device", lambda spec: device)
    monkeypatch.setattr(placement, "resolve_dtype", lambda spec, device: ("fp32", "test"))
    monkeypatch.setattr(placement, "cpu_has_native_bf16", lambda: True)
    (tmp_path / "serving.properties").write_text(text)
    s = load_settings(tmp_path, env={})
    return s, engine_config(str(tmp_path), engine_options(s.model, s.engine))


@pytest.mark.parametrize(
    "native, text, dtype", [(False, "", "bf16"), (True, "", "fp32"), (False, "option.dtype=fp32\n", "fp32")]
)
def test_auto_dtype_is_measured_on_a_cpu_without_bf16_arithmetic(tmp_path, monkeypatch, native, text, dtype):
    from lmiserve.rolling_batch.ops import cpu_dtype

    asked = []
    choice = cpu_dtype.Choice("bf16", {}, dense=True)
    monkeypatch.setattr(cpu_dtype, "measured_format", lambda path, quantize: asked.append(path) or (choice, "measured"))
    monkeypatch.setattr(placement, "resolve_device", lambda spec: "cpu")
    monkeypatch.setattr(placement, "cpu_has_native_bf16", lambda: native)
    monkeypatch.setattr(placement, "resolve_dtype", lambda spec, device: ("fp32", "by the ISA or the setting"))
    (tmp_path / "serving.properties").write_text(text)
    s = load_settings(tmp_path, env={})
    config = engine_config(str(tmp_path), engine_options(s.model, s.engine))
    assert config.dtype == dtype
    measured = not native and not text
    assert asked == ([tmp_path] if measured else [])
    assert config.quantize == ("none" if measured else None)  # the measurement chose dense weights


def test_each_field_holds_the_value_of_the_setting_it_names(tmp_path, monkeypatch):
    text = "".join(
        f"option.{k}={v}\n"
        for k, v in {
            "max_rolling_batch_size": 7,
            "max_rolling_batch_prefill_tokens": 99,
            "max_model_len": 77,
            "block_size": 32,
            "kv_cache_memory": 12345,
            "enable_prefix_caching": "false",
            "gpu_memory_utilization": 0.5,
            "max_prefill_batch_size": 3,
            "max_decode_step_prefill_tokens": 50,
            "decode_step_prefill_tokens_per_sequence": 6,
            "enforce_eager": "true",
            "deterministic": "true",
            "async_scheduling": "true",
            "enable_lora": "true",
            "max_loras": 5,
            "max_lora_rank": 8,
            "max_cpu_loras": 9,
        }.items()
    )
    settings, cfg = _config(tmp_path, text, monkeypatch)
    resolved = {"model_dir", "dtype", "device", "tensor_parallel_degree"}
    for f in fields(EngineConfig):
        if f.name not in NOT_SETTINGS | resolved:
            assert getattr(cfg, f.name) == settings.value(f.metadata["setting"]), f.name


def test_device_defaults_name_engine_settings_and_config_fields():
    config_settings = {f.metadata["setting"] for f in fields(EngineConfig)}
    for f in fields(DeviceDefaults):
        assert SPECS_BY_FIELD["engine", f.name].key in config_settings, f.name


@pytest.mark.parametrize("device,kind", [("cpu", "cpu"), ("cuda:0", "cuda"), ("npu:1", "npu")])
def test_empty_settings_take_the_device_defaults(tmp_path, monkeypatch, device, kind):
    _, cfg = _config(tmp_path, "", monkeypatch, device)
    defaults = DEVICE_DEFAULTS[kind]
    assert cfg.max_num_batched_tokens == defaults.max_rolling_batch_prefill_tokens
    for f in fields(DeviceDefaults):
        if f.name != "max_rolling_batch_prefill_tokens":
            assert getattr(cfg, f.name) == getattr(defaults, f.name), f.name


def test_device_defaults():
    """The table's values (CPUs: vLLM's CPU server's block of 128 tokens)."""
    assert DEVICE_DEFAULTS["cpu"] == DeviceDefaults(2048, 512, 4, 128)
    assert DEVICE_DEFAULTS["cuda"] == DeviceDefaults(4096, None, None, 16)
    assert DEVICE_DEFAULTS["npu"] == DeviceDefaults(4096, None, None, 128)


@pytest.mark.parametrize(
    "text, share",
    [
        ("", 4),
        ("option.max_first_token_wait=0.2\n", None),  # prompts whole beside decodes
        ("option.max_first_token_wait=0.2\noption.predictive_admission=false\n", 4),  # no bound in force
        ("option.max_first_token_wait=0.2\noption.decode_step_prefill_tokens_per_sequence=6\n", 6),  # set: kept
    ],
)
def test_a_first_token_bound_takes_prompts_whole_beside_decodes_unless_the_share_is_set(
    tmp_path, monkeypatch, text, share
):
    _, cfg = _config(tmp_path, text, monkeypatch, "cpu")
    assert cfg.decode_step_prefill_tokens_per_sequence == share
    assert cfg.max_decode_step_prefill_tokens == 512

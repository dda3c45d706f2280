"""MindIE-style limits and NPU device settings: keys, their mapping onto the engine, and the errors."""

import pytest

from lmiserve.config import load_settings
from lmiserve.errors import ValidationFailed
from lmiserve.generation.request import GenerationRequest
from lmiserve.rolling_batch.engine_config import engine_options
from lmiserve.rolling_batch.runner import placement
from lmiserve.rolling_batch.runner.placement import engine_config
from lmiserve.serving import model_factory
from lmiserve.serving.engine_launch import engine_env
from lmiserve.serving.engine_model import EngineModel
from lmiserve.serving.handler_model import ModelLoadError
from lmiserve.wire import SamplingParams


def write(tmp_path, text):
    (tmp_path / "serving.properties").write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    "line,key,expected",
    [
        ("option.max_seq_len=4096", "option.max_model_len", 4096),
        ("option.max_prefill_tokens=8192", "option.max_rolling_batch_prefill_tokens", 8192),
        ("option.cache_block_size=128", "option.block_size", 128),
        ("option.max_input_token_len=2048", "option.max_input_token_len", 2048),
        ("option.max_iter_times=512", "option.max_iter_times", 512),
        ("option.max_prefill_batch_size=8", "option.max_prefill_batch_size", 8),
        ("option.npu_device_ids=0, 1,2", "option.npu_device_ids", "0, 1,2"),
    ],
)
def test_mindie_keys_are_accepted_and_mapped(tmp_path, line, key, expected):
    s = load_settings(write(tmp_path, line + "\n"), env={})
    assert s.value(key) == expected
    assert str(s.sources[key]).startswith("file ")


def test_mindie_aliases_from_the_environment(tmp_path):
    s = load_settings(tmp_path, env={"OPTION_MAX_SEQ_LEN": "1024", "OPTION_CACHE_BLOCK_SIZE": "64"})
    assert (s.model.max_model_len, s.engine.block_size) == (1024, 64)


def test_bad_npu_device_ids_name_the_key(tmp_path):
    with pytest.raises(Exception) as err:
        load_settings(write(tmp_path, "option.npu_device_ids=0;1\n"), env={})
    assert "option.npu_device_ids" in str(err.value) and "comma-separated device ids" in str(err.value)


def _config(tmp_path, text, monkeypatch, device="cpu"):
    real = placement.resolve_device
    monkeypatch.setattr(placement, "resolve_device", lambda spec: device if spec == "auto" else real(spec))
    s = load_settings(write(tmp_path, text), env={})
    return engine_config(str(tmp_path), engine_options(s.model, s.engine))


def test_block_size_defaults_to_128_on_an_npu_and_a_cpu(tmp_path, monkeypatch):
    assert _config(tmp_path, "option.dtype=fp32\n", monkeypatch).block_size == 128
    assert _config(tmp_path, "option.dtype=fp32\noption.block_size=16\n", monkeypatch).block_size == 16
    assert _config(tmp_path, "option.dtype=fp32\n", monkeypatch, device="npu:0").block_size == 128
    assert _config(tmp_path, "option.dtype=fp32\noption.cache_block_size=256\n", monkeypatch, "npu:0").block_size == 256


def test_npu_backend_runs_on_an_npu(tmp_path, monkeypatch):
    cfg = _config(tmp_path, "option.rolling_batch=npu\noption.dtype=fp16\n", monkeypatch)
    assert (cfg.device, cfg.block_size) == ("npu:0", 128)
    cfg = _config(tmp_path, "option.rolling_batch=npu\noption.device=npu:3\noption.dtype=fp16\n", monkeypatch)
    assert cfg.device == "npu:3"
    with pytest.raises(ValueError, match="option.rolling_batch=npu runs on an NPU, but option.device is cpu"):
        _config(tmp_path, "option.rolling_batch=npu\noption.device=cpu\noption.dtype=fp16\n", monkeypatch)


def test_max_prefill_batch_size_reaches_the_engine(tmp_path, monkeypatch):
    assert _config(tmp_path, "option.dtype=fp32\noption.max_prefill_batch_size=4\n", monkeypatch).max_prefill_seqs == 4


def test_engine_environment_for_npus(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTORCH_NPU_ALLOC_CONF", raising=False)
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    env = engine_env(load_settings(tmp_path, env={}))
    assert env["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
    assert "ASCEND_RT_VISIBLE_DEVICES" not in env
    env = engine_env(load_settings(write(tmp_path, "option.npu_device_ids=4, 5\n"), env={}))
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "4,5"
    monkeypatch.setenv("PYTORCH_NPU_ALLOC_CONF", "max_split_size_mb:64")
    assert engine_env(load_settings(tmp_path, env={}))["PYTORCH_NPU_ALLOC_CONF"] == "max_split_size_mb:64"


class _Tokenizer:
    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}


def _model(tmp_path, text):
    model = EngineModel(load_settings(write(tmp_path, text), env={}))
    model.tokenizer, model.max_model_len = _Tokenizer(), 100
    return model


def test_max_input_token_len_refuses_longer_prompts(tmp_path):
    model = _model(tmp_path, "option.max_input_token_len=5\n")
    admitted = model.admit(GenerationRequest("hello", SamplingParams(max_new_tokens=3)))
    assert admitted.prompt_ids == (104, 101, 108, 108, 111)
    with pytest.raises(ValidationFailed, match=r"the prompt has 6 tokens, more than max_input_token_len \(5\)"):
        model.admit(GenerationRequest("hello!", SamplingParams(max_new_tokens=3)))


def test_max_iter_times_caps_max_new_tokens(tmp_path):
    model = _model(tmp_path, "option.max_iter_times=8\n")
    request = GenerationRequest("hi", SamplingParams(max_new_tokens=50, temperature=0.5))
    assert model.admit(request).params == SamplingParams(max_new_tokens=8, temperature=0.5)
    assert request.params.max_new_tokens == 50  # the parsed request is left as it was
    small = GenerationRequest("hi", SamplingParams(max_new_tokens=4))
    assert model.admit(small).params.max_new_tokens == 4


def test_npu_backend_without_torch_npu_is_refused_in_one_line(tmp_path, monkeypatch):
    s = load_settings(write(tmp_path, "option.rolling_batch=npu\n"), env={})
    with pytest.raises(ModelLoadError, match="needs torch_npu .*not installed") as err:
        model_factory.build_model(s)
    assert "\n" not in str(err.value)
    real_find_spec = model_factory.importlib.util.find_spec
    monkeypatch.setattr(
        model_factory.importlib.util, "find_spec", lambda n: object() if n == "torch_npu" else real_find_spec(n)
    )
    monkeypatch.setattr(model_factory, "npu_available", lambda: False)
    with pytest.raises(ModelLoadError, match="found no usable Ascend NPU"):
        model_factory.build_model(s)
    s = load_settings(write(tmp_path, "option.rolling_batch=npu\noption.device=cuda\n"), env={})
    with pytest.raises(ModelLoadError, match="option.device is cuda"):
        model_factory.build_model(s)

"""Speculative decoding's settings: option.speculative_config (vLLM's JSON), LMI's
option.speculative_draft_model and option.speculative_length, read into EngineConfig.speculative;
a bad value stops start-up naming the setting."""

import dataclasses
import json

import pytest

from lmiserve.config import load_settings
from lmiserve.config.loader import ConfigError
from lmiserve.config.speculative import SpeculativeConfig
from lmiserve.rolling_batch.engine_config import EngineConfig, engine_options, settings_of


def _settings(tmp_path, text="", env=None):
    (tmp_path / "serving.properties").write_text(text)
    return load_settings(tmp_path, env=env or {})


def _config(settings) -> EngineConfig:
    model, engine = settings_of(engine_options(settings.model, settings.engine))  # as the engine process reads them
    return EngineConfig.from_settings("/m", model, engine, device="cpu", dtype="fp32", tensor_parallel_degree=1)


def test_no_speculative_settings_leave_it_off(tmp_path):
    settings = _settings(tmp_path)
    assert settings.engine.speculative is None and settings.engine.speculative_length == 5
    assert _config(settings).speculative is None


def test_vllms_json_from_the_properties_file(tmp_path):
    settings = _settings(tmp_path, 'option.speculative_config={"method": "ngram", "num_speculative_tokens": 3}\n')
    spec = _config(settings).speculative
    assert isinstance(spec, SpeculativeConfig)
    assert (spec.method, spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max) == (
        "ngram",
        3,
        5,
        5,
    )
    assert spec.for_vllm() == {"method": "ngram", "num_speculative_tokens": 3}


def test_option_environment_variables_set_them_as_any_other(tmp_path):
    env = {
        "OPTION_SPECULATIVE_CONFIG": '{"method": "ngram", "prompt_lookup_max": 4}',
        "OPTION_SPECULATIVE_LENGTH": "2",
    }
    spec = _settings(tmp_path, env=env).engine.speculative
    assert (spec.method, spec.num_speculative_tokens, spec.prompt_lookup_max) == ("ngram", 2, 4)
    spec = _settings(tmp_path, env={"OPTION_SPECULATIVE_DRAFT_MODEL": "/drafts/small"}).engine.speculative
    assert (spec.method, spec.model, spec.num_speculative_tokens) == ("draft_model", "/drafts/small", 5)


def test_speculative_length_fills_in_only_what_the_json_leaves_out(tmp_path):
    # LMI's default, 5, where neither says
    assert _settings(tmp_path, 'option.speculative_config={"method": "ngram"}\n').engine.speculative.raw == {
        "method": "ngram",
        "num_speculative_tokens": 5,
    }
    text = 'option.speculative_config={"method": "ngram", "num_speculative_tokens": 3}\noption.speculative_length=8\n'
    assert _settings(tmp_path, text).engine.speculative.num_speculative_tokens == 3
    text = "option.speculative_draft_model=org/draft\noption.speculative_length=8\n"
    spec = _settings(tmp_path, text).engine.speculative
    assert spec.for_vllm() == {"model": "org/draft", "num_speculative_tokens": 8}


@pytest.mark.parametrize(
    "text, says",
    [
        ("option.speculative_config={not json\n", "speculative_config is not JSON"),
        ('option.speculative_config=["ngram"]\n', "must be a JSON object"),
        ('option.speculative_config={"method": "medusa", "num_speculative_tokens": 2}\n', "method must be one of"),
        ('option.speculative_config={"method": "eagle", "num_speculative_tokens": 2}\n', "needs a model"),
        ('option.speculative_config={"method": "ngram", "num_speculative_tokens": 0}\n', "at least 1"),
        (
            'option.speculative_config={"model": "org/a", "num_speculative_tokens": 2}\n'
            "option.speculative_draft_model=org/b\n",
            "name different models",
        ),
    ],
)
def test_a_bad_value_stops_start_up_naming_the_setting(tmp_path, text, says):
    with pytest.raises(ConfigError, match="option.speculative_config") as err:
        _settings(tmp_path, text)
    assert says in str(err.value)


def test_a_bad_speculative_length_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="invalid value for option.speculative_length"):
        _settings(tmp_path, "option.speculative_draft_model=org/draft\noption.speculative_length=0\n")


def test_a_fetched_draft_is_named_by_its_local_directory(tmp_path):
    engine = _settings(tmp_path, "option.speculative_draft_model=s3://bucket/draft/\noption.speculative_length=3\n")
    engine = engine.engine.with_draft("/cache/draft")
    assert engine.speculative_draft_model is None
    assert json.loads(engine.speculative_config) == {"model": "/cache/draft", "num_speculative_tokens": 3}
    assert engine.speculative.model == "/cache/draft"


def test_the_tensor_parallel_ranks_read_it_back_from_their_copy(tmp_path):
    settings = _settings(tmp_path, 'option.speculative_config={"model": "/d", "num_speculative_tokens": 2}\n')
    config = _config(settings)
    copy = json.loads(json.dumps(dataclasses.asdict(config), default=str))
    again = EngineConfig(**{**copy, "model_dir": config.model_dir})
    assert again.speculative == config.speculative and again.speculative.raw == config.speculative.raw

"""Speculative decoding's counts out of the engine: ``/metrics`` (counters and the mean accepted
length, per model) and the ``speculative`` object of ``GET /models/{name}``, from given engine stats."""

from types import SimpleNamespace

import pytest

from lmiserve.config import load_settings
from lmiserve.server.metrics import ServerMetrics
from lmiserve.serving.engine_model import EngineModel
from lmiserve.serving.speculative_stats import acceptance_rate, describe_speculative, mean_accepted_length
from tests.unit.engine_stats import stats

SPEC = 'option.speculative_config={"method": "ngram", "num_speculative_tokens": 4}\n'


def _model(tmp_path, text: str, **counts: int) -> EngineModel:
    (tmp_path / "serving.properties").write_text("model_name=m\noption.rolling_batch=lmi\n" + text)
    model = EngineModel(load_settings(tmp_path, env={}))
    model.client = SimpleNamespace(
        stats=stats(**counts), info={"max_model_len": 64, "spec_cost_ratio": 0.0}, alive=True, pid=1
    )
    return model


def _exposition(model: EngineModel) -> str:
    return ServerMetrics(SimpleNamespace(models={"m": model})).expose().decode()


def test_the_counters_and_the_mean_accepted_length_are_exported_per_model(tmp_path):
    model = _model(tmp_path, SPEC, spec_proposed_tokens=40, spec_accepted_tokens=25, spec_drafts=10)
    text = _exposition(model)
    for line in (
        "# TYPE lmiserve_spec_proposed_tokens_total counter",
        'lmiserve_spec_proposed_tokens_total{model="m"} 40.0',
        'lmiserve_spec_accepted_tokens_total{model="m"} 25.0',
        'lmiserve_spec_drafts_total{model="m"} 10.0',
        "# TYPE lmiserve_spec_mean_accepted_length gauge",
        'lmiserve_spec_mean_accepted_length{model="m"} 3.5',
    ):
        assert line in text.splitlines(), line


def test_the_counts_survive_an_engine_restart(tmp_path):
    model = _model(tmp_path, SPEC, spec_proposed_tokens=40, spec_accepted_tokens=25, spec_drafts=10)
    model._closing = True  # no restart task here: the test plays the new engine itself
    model._on_exit(model.client, "killed")
    model.client = SimpleNamespace(
        stats=stats(spec_proposed_tokens=4, spec_accepted_tokens=1, spec_drafts=2), info={}, alive=True, pid=2
    )
    assert 'lmiserve_spec_proposed_tokens_total{model="m"} 44.0' in _exposition(model)
    assert model.describe()["speculative"]["drafts"] == 12


def test_a_model_without_speculative_decoding_has_no_such_series(tmp_path):
    model = _model(tmp_path, "", spec_proposed_tokens=0)
    samples = [line for line in _exposition(model).splitlines() if not line.startswith("#")]
    assert not [line for line in samples if line.startswith("lmiserve_spec_")]
    assert "speculative" not in model.describe()


def test_the_description_of_a_model(tmp_path):
    model = _model(tmp_path, SPEC, spec_proposed_tokens=40, spec_accepted_tokens=25, spec_drafts=10)
    assert model.describe()["speculative"] == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "proposed_tokens": 40,
        "accepted_tokens": 25,
        "drafts": 10,
        "mean_accepted_length": 3.5,
        "acceptance_rate": 0.625,
        "draft_cost_ratio": 0.0,
    }


def test_before_any_proposal_the_ratios_are_zero_and_the_cost_ratio_only_when_reported(tmp_path):
    spec = _model(tmp_path, "option.speculative_draft_model=/drafts/small\n").settings.engine.speculative
    described = describe_speculative(spec, None, {})
    assert described == {
        "method": "draft_model",
        "num_speculative_tokens": 5,
        "proposed_tokens": 0,
        "accepted_tokens": 0,
        "drafts": 0,
        "mean_accepted_length": 0.0,
        "acceptance_rate": 0.0,
    }
    assert describe_speculative(spec, {}, {"spec_cost_ratio": 0.25})["draft_cost_ratio"] == 0.25
    assert describe_speculative(None, {"spec_drafts": 3}, {}) is None


@pytest.mark.parametrize(
    "counts, length, rate",
    [
        ({}, 0.0, 0.0),
        ({"spec_proposed_tokens": 8, "spec_accepted_tokens": 0, "spec_drafts": 2}, 1.0, 0.0),
        ({"spec_proposed_tokens": 8, "spec_accepted_tokens": 8, "spec_drafts": 2}, 5.0, 1.0),
    ],
)
def test_mean_accepted_length_and_acceptance_rate(counts, length, rate):
    assert (mean_accepted_length(counts), acceptance_rate(counts)) == (length, rate)

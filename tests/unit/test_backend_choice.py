"""option.rolling_batch=auto: our engine for its architectures, an installed vLLM for the others,
else transformers generate with a warning that names its cost; the log says which and why."""

from __future__ import annotations

import json
import logging

import pytest

from lmiserve.config import load_settings
from lmiserve.serving import model_factory
from lmiserve.serving.engine_model import EngineModel
from lmiserve.serving.handler_model import HandlerModel


def _settings(tmp_path, architecture: str):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [architecture], "model_type": "x"}))
    (tmp_path / "serving.properties").write_text("option.rolling_batch=auto\n")
    return load_settings(tmp_path, env={})


def test_our_architectures_run_on_our_engine(tmp_path, caplog):
    caplog.set_level(logging.INFO, "lmiserve.serving")
    model = model_factory.build_model(_settings(tmp_path, "LlamaForCausalLM"))
    assert isinstance(model, EngineModel) and model.backend == "lmi"
    assert "LlamaForCausalLM runs on lmiserve's engine" in caplog.text


@pytest.mark.parametrize("installed", [True, False])
def test_other_architectures_go_to_vllm_where_it_is_installed(tmp_path, caplog, monkeypatch, installed):
    caplog.set_level(logging.INFO, "lmiserve.serving")
    monkeypatch.setattr(model_factory, "_vllm_installed", lambda: installed)
    model = model_factory.build_model(_settings(tmp_path, "GPTNeoXForCausalLM"))
    if installed:
        assert isinstance(model, EngineModel) and model.backend == "vllm"
        assert (
            "GPTNeoXForCausalLM is not an architecture of lmiserve's engine; the installed vLLM serves it"
            in caplog.text
        )
    else:
        assert isinstance(model, HandlerModel)
        warning = next(r for r in caplog.records if r.levelno == logging.WARNING)
        assert "without continuous batching" in warning.getMessage() and "10-20x slower" in warning.getMessage()

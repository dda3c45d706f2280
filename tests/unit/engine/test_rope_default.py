"""Unscaled RoPE tables computed from config.json alone equal, bit for bit, those of each family's
own rotary class in transformers; configs that leave something to the family's config class
(a scaling, a default head_dim, no rope_theta) are left to that class."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig

from lmiserve.rolling_batch.models.rope import (
    HEAD_DIM_DEFAULTS,
    PLAIN_DEFAULT,
    plain_default_tables,
    rope_tables,
    transformers_tables,
)

SMALL = dict(hidden_size=96, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
MAX_LEN = 777


def _write(path, config: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))


def _saved(tmp_path, family: str, **extra) -> dict:
    AutoConfig.for_model(family, **SMALL, **extra).save_pretrained(tmp_path / "saved")
    return json.loads((tmp_path / "saved" / "config.json").read_text())


def _legacy(config: dict, theta) -> dict:
    """The older layout many checkpoints still carry: ``rope_theta`` at the top, no ``rope_parameters``."""
    config = {k: v for k, v in config.items() if k not in ("rope_parameters", "rope_scaling")}
    return {**config, "rope_theta": theta}


@pytest.mark.parametrize("family", sorted(PLAIN_DEFAULT))
@pytest.mark.parametrize("theta", [10000, 1000000.0, 12345.678])
@pytest.mark.parametrize("layout", ["saved", "legacy", "legacy-head-dim"])
def test_plain_tables_are_the_rotary_class_bits(tmp_path, family, theta, layout):
    config = _saved(tmp_path, family, rope_theta=theta)
    if layout != "saved":
        config = _legacy(config, theta)
        config.pop("head_dim", None)
        if layout == "legacy-head-dim":
            config["head_dim"] = 32  # not hidden_size / heads (24)
    model_dir = tmp_path / "model"
    _write(model_dir, config)
    plain = plain_default_tables(model_dir, family, MAX_LEN)
    if family in HEAD_DIM_DEFAULTS and "head_dim" not in config:
        assert plain is None  # the config class's own head_dim default decides
        return
    assert plain is not None
    want = transformers_tables(model_dir, family, MAX_LEN)
    for ours, theirs in zip(plain, want):
        assert ours.dtype == theirs.dtype == torch.float32 and ours.shape == theirs.shape
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize(
    "change",
    [
        {"rope_scaling": {"type": "linear", "factor": 4.0}},
        {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
        {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000, "factor": 2.0}},
        {"partial_rotary_factor": 0.5},
        {"rope_theta": None},
    ],
)
def test_what_the_config_class_decides_is_left_to_it(tmp_path, change):
    config = {**_legacy(_saved(tmp_path, "llama"), 10000), **change}
    _write(tmp_path / "model", config)
    assert plain_default_tables(tmp_path / "model", "llama", 64) is None


def test_families_outside_the_plain_set_take_the_rotary_class(tmp_path):
    config = _legacy(_saved(tmp_path, "phi3"), 10000)
    _write(tmp_path / "model", config)
    assert plain_default_tables(tmp_path / "model", "phi3", 64) is None
    cos, sin = rope_tables(tmp_path / "model", "phi3", 64)
    want_cos, want_sin = transformers_tables(tmp_path / "model", "phi3", 64)
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)

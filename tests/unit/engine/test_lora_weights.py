"""Reading PEFT adapter directories: what the engine can apply, and the reasons it refuses the rest."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from lmiserve.rolling_batch.lora.peft_weights import AdapterFormatError, read_adapter
from lmiserve.rolling_batch.models.architectures import spec_from_config
from lmiserve.rolling_batch.models.spec import read_config
from tests.lora_adapters import build_adapter


@pytest.fixture(scope="module")
def spec(tiny_llama_dir):
    return spec_from_config(read_config(tiny_llama_dir))


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, tiny_llama_dir):
    return build_adapter(tiny_llama_dir, tmp_path_factory.mktemp("w") / "a", seed=5, rank=8, lora_alpha=12)


def _copy(src, dst, config=None, tensors=None):
    dst.mkdir(parents=True)
    cfg = json.loads((src / "adapter_config.json").read_text())
    cfg.update(config or {})
    (dst / "adapter_config.json").write_text(json.dumps(cfg))
    weights = load_file(str(src / "adapter_model.safetensors"))
    if tensors is not None:
        weights = tensors(weights)
    save_file(weights, str(dst / "adapter_model.safetensors"))
    return dst


def test_factors_are_read_with_the_scaling_folded_into_b(adapter, spec):
    weights = read_adapter(adapter, spec, 16, torch.float32)
    raw = load_file(str(adapter / "adapter_model.safetensors"))
    a_key = next(k for k in raw if k.endswith("layers.1.mlp.down_proj.lora_A.weight"))
    a, b = weights.layers[1]["down_proj"]
    assert torch.equal(a, raw[a_key])
    assert torch.allclose(b, raw[a_key.replace("lora_A", "lora_B")] * (12 / 8))
    assert weights.rank == 8 and len(weights.modules) == 7 and set(weights.layers) == {0, 1}


def test_rslora_scales_by_the_square_root_of_the_rank(adapter, spec, tmp_path):
    path = _copy(adapter, tmp_path / "rs", {"use_rslora": True})
    raw = load_file(str(adapter / "adapter_model.safetensors"))
    key = next(k for k in raw if k.endswith("layers.0.self_attn.q_proj.lora_B.weight"))
    assert torch.allclose(
        read_adapter(path, spec, 16, torch.float32).layers[0]["q_proj"][1], raw[key] * 12 / math.sqrt(8)
    )


@pytest.mark.parametrize(
    "config,fragment",
    [
        ({"use_dora": True}, "DoRA"),
        ({"bias": "all"}, "trained biases"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"peft_type": "IA3"}, "peft_type"),
    ],
)
def test_what_the_engine_cannot_apply_is_refused(adapter, spec, tmp_path, config, fragment):
    with pytest.raises(AdapterFormatError, match=fragment):
        read_adapter(_copy(adapter, tmp_path / "x", config), spec, 16, torch.float32)


def test_a_rank_above_the_limit_is_refused_with_both_numbers(adapter, spec):
    with pytest.raises(AdapterFormatError, match=r"rank 8 .*above option.max_lora_rank \(4\)"):
        read_adapter(adapter, spec, 4, torch.float32)


def test_an_adapter_of_another_model_is_refused(adapter, spec, tmp_path):
    def widen(w):
        return {k: torch.cat([v, v], dim=-1) if "lora_A" in k else v for k, v in w.items()}

    with pytest.raises(AdapterFormatError, match="another base model"):
        read_adapter(_copy(adapter, tmp_path / "wide", tensors=widen), spec, 16, torch.float32)

    def extra(w):
        return {**w, "base_model.model.lm_head.lora_A.weight": torch.zeros(8, 64)}

    with pytest.raises(AdapterFormatError, match="does not adapt"):
        read_adapter(_copy(adapter, tmp_path / "head", tensors=extra), spec, 16, torch.float32)

    def half(w):
        return {k: v for k, v in w.items() if "layers.0.self_attn.q_proj.lora_B" not in k}

    with pytest.raises(AdapterFormatError, match="without its other half"):
        read_adapter(_copy(adapter, tmp_path / "half", tensors=half), spec, 16, torch.float32)


def test_a_directory_that_is_not_an_adapter(spec, tmp_path):
    with pytest.raises(AdapterFormatError, match="adapter_config.json"):
        read_adapter(tmp_path, spec, 16, torch.float32)
    (tmp_path / "adapter_config.json").write_text('{"r": 4}')
    with pytest.raises(AdapterFormatError, match="adapter_model.safetensors"):
        read_adapter(tmp_path, spec, 16, torch.float32)

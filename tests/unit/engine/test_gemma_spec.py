"""What the engine reads from Gemma 2 / Gemma 3 configs, and the configs it refuses."""

import pytest

from lmiserve.rolling_batch.models.architectures import spec_from_config
from lmiserve.rolling_batch.models.spec import UnsupportedModel

BASE = dict(
    vocab_size=100,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    hidden_activation="gelu_pytorch_tanh",
    sliding_window=512,
)


def test_gemma3_layers_from_the_pattern_and_no_score_cap():
    """Without ``layer_types``: every sixth layer global; transformers' Gemma 3 attention never
    applies ``attn_logit_softcapping``, so neither does the engine; the logit cap is read."""
    config = dict(BASE, architectures=["Gemma3ForCausalLM"], attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
    spec = spec_from_config(config)
    assert spec.architecture == "gemma3" and spec.qk_norm
    assert spec.layer_windows == (512, 512, 512, 512, 512, 0)
    assert spec.attention_scale == 256**-0.5 and spec.attn_softcap == 0.0 and spec.final_softcap == 30.0


def test_gemma2_alternates_and_caps():
    config = dict(BASE, architectures=["Gemma2ForCausalLM"], query_pre_attn_scalar=144)
    config.update(attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
    spec = spec_from_config(config)
    assert spec.architecture == "gemma2" and not spec.qk_norm
    assert spec.layer_windows == (512, 0, 512, 0, 512, 0)
    assert (spec.attn_softcap, spec.final_softcap, spec.attention_scale) == (50.0, 30.0, 144**-0.5)


@pytest.mark.parametrize(
    "change",
    [
        dict(use_bidirectional_attention=True),
        dict(attention_bias=True),
        dict(hidden_activation="gelu"),
        dict(layer_types=["sliding_attention"] * 5 + ["chunked_attention"]),
    ],
)
def test_refused(change):
    with pytest.raises(UnsupportedModel):
        spec_from_config({**BASE, "architectures": ["Gemma3ForCausalLM"], **change})


def test_gemma3_with_vision_reads_its_language_model():
    config = dict(BASE, architectures=["Gemma3ForConditionalGeneration"], image_token_index=7)
    spec = spec_from_config(config)
    assert (spec.architecture, spec.vision, spec.image_token_id) == ("gemma3", "gemma3", 7)

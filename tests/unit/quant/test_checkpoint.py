"""A tiny random Llama written in each format, read back with load_quantized_checkpoint, and
run through the decoder with the reference ops against the same model holding the
dequantized weights as plain tensors."""

import json

import pytest
import torch
import torch.nn.functional as F

from lmiserve.rolling_batch.models.architectures import spec_from_config
from lmiserve.rolling_batch.models.decoder import DecoderModel
from lmiserve.rolling_batch.models.rope import rope_tables
from lmiserve.rolling_batch.models.spec import read_config
from lmiserve.rolling_batch.ops.metadata import AttentionMetadata, PagedAttentionInputs
from lmiserve.rolling_batch.ops.reference import ReferenceOps
from lmiserve.rolling_batch.quant.blocks import quantize_q8_0
from lmiserve.rolling_batch.quant.checkpoint import load_quantized_checkpoint, read_safetensors
from lmiserve.rolling_batch.quant.fp8_activations import w8a8_reference
from lmiserve.rolling_batch.quant.onthefly import PROJECTION, to_fp8
from lmiserve.rolling_batch.quant.schemes import checkpoint_scheme, resolve_scheme
from lmiserve.rolling_batch.quant.weights import BlockWeight, Fp8Weight, Int4Weight, is_quantized
from lmiserve.rolling_batch.quant.writers import write_quantized
from tests.tiny_models import build_model

LAYOUT = {"awq": Int4Weight, "gptq": Int4Weight, "gptq-act": Int4Weight, "int4": Int4Weight}
LAYOUT.update({"fp8": Fp8Weight, "fp8-tensor": Fp8Weight})
BLOCK, NUM_BLOCKS = 16, 4


@pytest.fixture(scope="module")
def dense_model(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("dense") / "llama")


@pytest.fixture(scope="module")
def written(dense_model, tmp_path_factory):
    """Per format: the checkpoint directory and the weights it stands for."""
    out = {}
    for name in LAYOUT:
        fmt, act_order = ("gptq", True) if name == "gptq-act" else (name, False)
        path = tmp_path_factory.mktemp(name) / "model"
        out[name] = (path, write_quantized(dense_model, path, fmt, group_size=32, act_order=act_order))
    return out


def load(path, quantize=None):
    scheme = resolve_scheme(json.loads((path / "config.json").read_text()), quantize)
    return load_quantized_checkpoint(path, scheme, torch.float32, "cpu")


@pytest.mark.parametrize("name", list(LAYOUT))
def test_every_projection_read_back_exactly(written, name):
    path, represented = written[name]
    loaded = load(path)
    projections = [n for n in represented if PROJECTION.search(n)]
    assert len(projections) == 2 * 7
    assert set(loaded) >= set(represented)
    for n, expected in represented.items():
        got = loaded[n]
        if n in projections:
            assert isinstance(got, LAYOUT[name]), n
            assert torch.equal(got.dequantize(torch.float32), expected), n
        else:
            assert isinstance(got, torch.Tensor) and torch.equal(got, expected), n
    if name == "gptq-act":
        assert loaded["model.layers.0.self_attn.q_proj.weight"].g_idx is not None
    assert not any(k.endswith(("qweight", "qzeros", "weight_packed", "weight_scale")) for k in loaded)


def test_option_none_dequantizes(written):
    path, represented = written["awq"]
    loaded = load(path, "none")
    assert not any(is_quantized(w) for w in loaded.values())
    assert all(torch.equal(loaded[n], w) for n, w in represented.items())


@pytest.mark.parametrize("quantize, layout, fn", [("fp8", Fp8Weight, to_fp8), ("int8", BlockWeight, quantize_q8_0)])
def test_plain_checkpoint_quantized_at_load(dense_model, quantize, layout, fn):
    plain = read_safetensors(dense_model)
    loaded = load(dense_model, quantize)
    for n, w in plain.items():
        if PROJECTION.search(n):
            assert isinstance(loaded[n], layout)
            assert torch.equal(loaded[n].dequantize(), fn(w).dequantize())
            assert (loaded[n].dequantize() - w).abs().max() <= w.abs().max() / 16
        else:
            assert torch.equal(loaded[n], w)


def test_to_fp8_scales_each_channel_to_448():
    w = torch.tensor([[3.0, -448.0 * 3], [0.0, 0.0], [1.0, 0.25]])
    q = to_fp8(w)
    assert torch.equal(q.scale, torch.tensor([3.0, 1.0, 1 / 448]))  # an all-zero row keeps scale 1
    assert torch.equal(q.weight.float()[:, 0], torch.tensor([1.0, 0.0, 448.0]))
    assert torch.equal(q.dequantize()[:2], w[:2])


class _WeightsOnly(ReferenceOps):
    """The reference ops with FP8 weights dequantized and the activations left as they are."""

    def linear(self, x, w):
        if isinstance(w.quant, Fp8Weight):
            return F.linear(x, w.quant.dequantize(x.dtype), w.bias)
        return super().linear(x, w)


def test_the_reference_fp8_product_is_w8a8():
    w = to_fp8(torch.randn(24, 64))
    x = torch.randn(3, 64).bfloat16()
    got = ReferenceOps().linear(x, ReferenceOps().prepare_linear(w))
    assert torch.equal(got, w8a8_reference(x, w.weight, w.scale))


def greedy(model, spec, prompt, new_tokens):
    """Greedy tokens after ``prompt`` and the logits of each step, one sequence in a paged cache."""
    shape = (NUM_BLOCKS, BLOCK, spec.num_kv_heads, spec.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(spec.num_layers)]
    table = torch.arange(NUM_BLOCKS, dtype=torch.int32).view(1, -1)
    ids, start, tokens, logits = list(prompt), 0, [], []
    with torch.inference_mode():
        for _ in range(new_tokens):
            positions = torch.arange(start, len(ids))
            paged = PagedAttentionInputs.of(
                table,
                torch.tensor([0, len(ids) - start], dtype=torch.int32),
                torch.tensor([len(ids)], dtype=torch.int32),
            )
            hidden = model.forward(torch.tensor(ids[start:]), positions, AttentionMetadata(positions, paged), caches)
            step = model.logits(hidden[-1:])
            logits.append(step)
            start = len(ids)
            ids.append(int(step.argmax()))
            tokens.append(ids[-1])
    return tokens, torch.cat(logits)


@pytest.mark.parametrize("name", list(LAYOUT))
def test_decoder_on_quantized_weights_matches_their_dequantized_values(written, dense_model, name):
    """FP8's product quantizes the activations too (W8A8): its weights alone are compared here."""
    path, represented = written[name]
    spec = spec_from_config(read_config(path))
    cos, sin = rope_tables(path, spec.architecture, 64)
    ops = _WeightsOnly() if LAYOUT[name] is Fp8Weight else ReferenceOps()
    quantized = DecoderModel(spec, load(path), ops, cos, sin)
    assert quantized.layers[0].qkv.quant is not None and quantized.layers[1].gate_up.quant is not None
    dense = DecoderModel(spec, represented, ops, cos, sin)
    prompt = [5, 17, 42, 7, 99, 3]
    q_tokens, q_logits = greedy(quantized, spec, prompt, 8)
    d_tokens, d_logits = greedy(dense, spec, prompt, 8)
    assert q_tokens == d_tokens
    torch.testing.assert_close(q_logits, d_logits, rtol=1e-5, atol=1e-5)
    assert checkpoint_scheme(read_config(path)) is not None

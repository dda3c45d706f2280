"""The decoder keeps the residual streams entering the layers ``model.aux_layers`` names (EAGLE-3
reads them) in ``model.aux_hidden``, and its output does not change by a bit for it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmiserve.rolling_batch.models.architectures import spec_from_config
from lmiserve.rolling_batch.models.decoder import DecoderModel
from lmiserve.rolling_batch.models.rope import rope_tables
from lmiserve.rolling_batch.models.spec import read_config
from lmiserve.rolling_batch.ops.cpu import CpuOps
from lmiserve.rolling_batch.ops.reference import ReferenceOps
from lmiserve.rolling_batch.quant.checkpoint import read_safetensors
from tests.tiny_models import reference_model
from tests.unit.engine.eagle_helpers import target_states

TOKENS = [5, 17, 42, 7, 99, 3, 64, 12, 8]


def model(model_dir, ops, dtype):
    spec = spec_from_config(read_config(model_dir))
    cos, sin = rope_tables(model_dir, spec.architecture, 64)
    tensors = {name: t.to(dtype) for name, t in read_safetensors(model_dir).items()}
    return DecoderModel(spec, tensors, ops, cos, sin)


def test_streams_are_transformers_hidden_states(tiny_llama_dir):
    target = model(tiny_llama_dir, ReferenceOps(), torch.float32)
    target.aux_layers = (2, 0, 1)
    final, aux = target_states(target, TOKENS)
    with torch.no_grad():
        hf = reference_model(tiny_llama_dir)(torch.tensor([TOKENS]), output_hidden_states=True).hidden_states
    width = target.spec.hidden_size
    assert aux.shape == (len(TOKENS), 3 * width)
    last, first, between = aux.split(width, dim=-1)  # in the order listed
    torch.testing.assert_close(first, hf[0][0], rtol=0, atol=0)  # the embeddings
    torch.testing.assert_close(between, hf[1][0], rtol=1e-5, atol=1e-5)
    # transformers' last hidden state is after the final norm: the stream before it, normed
    torch.testing.assert_close(target.ops.rms_norm(last, target.norm, target.spec.rms_norm_eps)[0], final)
    torch.testing.assert_close(final, hf[2][0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ops, dtype", [(ReferenceOps, torch.float32), (CpuOps, torch.bfloat16)])
def test_output_bit_identical_with_the_streams_kept(tiny_llama_dir, ops, dtype):
    """bf16 on the CPU kernels: their fused add + norm adds to the residual in place, so the kept
    streams must be copies (the embeddings stay the embeddings)."""
    target = model(tiny_llama_dir, ops(), dtype)
    plain, none = target_states(target, TOKENS)
    assert none is None
    target.aux_layers = (0, 1, 2)
    kept, aux = target_states(target, TOKENS)
    assert torch.equal(plain, kept)
    assert torch.equal(aux[:, : target.spec.hidden_size], F.embedding(torch.tensor(TOKENS), target.embed))
    target.aux_layers = ()
    again, none = target_states(target, TOKENS)
    assert torch.equal(plain, again) and none is None

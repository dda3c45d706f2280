"""The ops contract refuses each input the NPU kernels cannot take, for every backend."""

import pytest
import torch

from lmiserve.rolling_batch.ops import CheckedOps, ContractError, ReferenceOps, select_ops
from lmiserve.rolling_batch.ops.contract import DEFAULT_LIMITS, NPU_LIMITS, check_model

from .attention_calls import decode, prefill
from .test_ops import dense_attention, paged


def checked(limits=DEFAULT_LIMITS):
    return CheckedOps(ReferenceOps(), limits)


def decode_inputs(lengths=(5, 20), heads=4, kv_heads=2, dim=16):
    k_cache, v_cache, tables, dense = paged(list(lengths), kv_heads, dim)
    q = torch.randn(len(lengths), heads, dim)
    return q, k_cache, v_cache, tables, torch.tensor(lengths, dtype=torch.int32), dense


def test_valid_inputs_pass_and_give_the_inner_result():
    q, kc, vc, tables, lens, dense = decode_inputs()
    out = decode(checked(), q, kc, vc, tables, lens, 0.25)
    expected = dense_attention(q[1:2], *dense[1], causal_offset=19)
    assert torch.allclose(out[1:2].double(), expected, atol=1e-5)


def test_select_ops_puts_every_backend_behind_the_contract():
    ops = select_ops("cpu", "reference")
    assert isinstance(ops, CheckedOps) and ops.name == "reference"


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "block", "limits", "fragment"),
    [
        (8, 2, 64, 24, DEFAULT_LIMITS, "multiple of 16"),
        (8, 2, 64, 16, NPU_LIMITS, "multiple of 128"),
        (8, 2, 320, 16, DEFAULT_LIMITS, "head_dim 320"),
        (9, 2, 64, 16, DEFAULT_LIMITS, "not a whole multiple"),
        (130, 2, 64, 16, DEFAULT_LIMITS, "65 query heads per KV head"),
    ],
)
def test_model_limits(heads, kv_heads, dim, block, limits, fragment):
    with pytest.raises(ContractError, match=fragment):
        check_model(heads, kv_heads, dim, block, limits)


def test_model_limits_accept_npu_shapes():
    check_model(32, 8, 128, 128, NPU_LIMITS)
    check_model(64, 1, 256, 256, NPU_LIMITS)


def test_block_table_must_be_int32_with_enough_rows_and_columns():
    q, kc, vc, tables, lens, _ = decode_inputs()
    with pytest.raises(ContractError, match="int32"):
        decode(checked(), q, kc, vc, tables.long(), lens, 0.25)
    with pytest.raises(ContractError, match="one row per sequence"):
        decode(checked(), q, kc, vc, tables[:1], lens, 0.25)
    with pytest.raises(ContractError, match="longest sequence needs 2 blocks"):
        decode(checked(), q, kc, vc, tables[:, :1].contiguous(), lens, 0.25)


def test_inputs_must_be_contiguous():
    q, kc, vc, tables, lens, _ = decode_inputs()
    strided = torch.randn(2, 16, 4).transpose(1, 2)  # (2, 4, 16), not contiguous
    with pytest.raises(ContractError, match="query must be contiguous"):
        decode(checked(), strided, kc, vc, tables, lens, 0.25)
    k = torch.randn(3, 16, 2).transpose(1, 2)
    with pytest.raises(ContractError, match="key must be contiguous"):
        checked().write_kv(k, torch.randn(3, 2, 16), kc, vc, torch.tensor([0, 1, 2]))


def test_cache_block_size_is_checked_per_device():
    q, kc, vc, tables, lens, _ = decode_inputs()
    with pytest.raises(ContractError, match="multiple of 128"):
        decode(checked(NPU_LIMITS), q, kc, vc, tables, lens, 0.25)


@pytest.mark.parametrize(
    ("cu", "fragment"),
    [
        ([0, 10, 5], "must not decrease"),
        ([1, 5, 12], "start at 0"),
        ([0, 5, 11], "end at 11"),
        ([0, 8, 12], "8 query tokens but only 6"),
    ],
)
def test_cumulative_lengths(cu, fragment):
    k_cache, v_cache, tables, _ = paged([6, 30], 2, 16)
    q = torch.randn(12, 4, 16)
    seq_lens = torch.tensor([6, 30], dtype=torch.int32)
    with pytest.raises(ContractError, match=fragment):
        prefill(checked(), q, k_cache, v_cache, tables, torch.tensor(cu, dtype=torch.int32), seq_lens, 0.25)


def test_a_step_is_checked_once_and_a_new_step_again():
    q, kc, vc, tables, lens, _ = decode_inputs()
    ops = checked()
    decode(ops, q, kc, vc, tables, lens, 0.25)
    decode(ops, q, kc, vc, tables, lens, 0.25)  # same step tensors: passed before
    with pytest.raises(ContractError):
        decode(ops, q, kc, vc, tables.long(), lens, 0.25)  # a new step's table is checked

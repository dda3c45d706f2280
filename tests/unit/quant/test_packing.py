"""Hand-built tensors of each format, their packed words written out by hand, read and
dequantized to known values."""

import torch

from lmiserve.rolling_batch.quant import awq, compressed_tensors, fp8_checkpoint, gptq
from lmiserve.rolling_batch.quant.writers import AWQ_ORDER, pack_words


def i32(word: int) -> int:
    return word - 2**32 if word >= 2**31 else word


def test_awq_interleaves_output_columns():
    # quants of input row 0, columns 0..7: 1..8; AWQ puts columns 0,2,4,6,1,3,5,7 in nibbles 0..7
    q_row0 = i32(0x86427531)
    z_word = i32(0x75316420)  # zero points 0..7 for columns 0..7, interleaved the same way
    assert pack_words(torch.arange(1, 9).view(1, 8), dim=1, order=AWQ_ORDER).item() == q_row0
    assert pack_words(torch.arange(8).view(1, 8), dim=1, order=AWQ_ORDER).item() == z_word
    qweight = torch.zeros(8, 1, dtype=torch.int32)  # (in, out / 8)
    qweight[0, 0] = q_row0
    parts = {
        "qweight": qweight,
        "qzeros": torch.tensor([[z_word]], dtype=torch.int32),
        "scales": torch.arange(1, 9, dtype=torch.float16).view(1, 8),
    }
    w = awq.read(parts, torch.float32, group_size=8).dequantize()
    n = torch.arange(8.0)
    assert torch.equal(w[:, 0], torch.ones(8) * (n + 1))  # (n + 1 - n) * (n + 1)
    assert torch.equal(w[:, 1:], (-n * (n + 1)).unsqueeze(1).expand(8, 7))  # (0 - n) * (n + 1)


def test_awq_groups():
    qweight = torch.full((16, 1), i32(0x11111111), dtype=torch.int32)  # every quant 1
    qzeros = torch.tensor([[0], [i32(0x22222222)]], dtype=torch.int32)  # group 0 zero 0, group 1 zero 2
    scales = torch.tensor([[2.0] * 8, [3.0] * 8], dtype=torch.float16)
    w = awq.read({"qweight": qweight, "qzeros": qzeros, "scales": scales}, torch.float32).dequantize()
    assert torch.equal(w, torch.cat([torch.full((8, 8), 2.0), torch.full((8, 8), -3.0)], dim=1))


def test_gptq_packs_input_rows_in_order_and_zeros_minus_one():
    qweight = torch.zeros(1, 8, dtype=torch.int32)  # (in / 8, out)
    qweight[0, 0] = i32(0x87654321)  # column 0: input rows 0..7 hold 1..8
    qweight[0, 1] = 0xF  # column 1: row 0 holds 15
    assert pack_words(torch.arange(1, 9).view(1, 8), dim=1).item() == qweight[0, 0]
    parts = {
        "qweight": qweight,
        "qzeros": torch.tensor([[0x77777777]], dtype=torch.int32),  # v1: 8 stored as 7
        "scales": torch.ones(1, 8, dtype=torch.float16),
        "g_idx": torch.zeros(8, dtype=torch.int32),
    }
    gw = gptq.read(parts, torch.float32, group_size=8)
    assert gw.g_idx is None  # contiguous groups
    w = gw.dequantize()
    assert torch.equal(w[0], torch.arange(1, 9.0) - 8)
    assert torch.equal(w[1], torch.tensor([7.0] + [-8.0] * 7))
    assert torch.equal(w[2:], torch.full((6, 8), -8.0))


def test_gptq_zero_stored_as_fifteen_is_sixteen():
    parts = {
        "qweight": torch.zeros(1, 8, dtype=torch.int32),
        "qzeros": torch.tensor([[0xF]], dtype=torch.int32),  # column 0: stored 15
        "scales": torch.ones(1, 8, dtype=torch.float16),
    }
    w = gptq.read(parts, torch.float32).dequantize()
    assert torch.equal(w[0], torch.full((8,), -16.0)) and torch.equal(w[1], torch.full((8,), -1.0))


def test_gptq_act_order_groups_follow_g_idx():
    qweight = torch.full((2, 8), 0x99999999 - 2**32, dtype=torch.int32)  # 16 input rows, every quant 9
    g_idx = torch.tensor([1, 0] * 8, dtype=torch.int32)
    scales = torch.tensor([[1.0] * 8, [2.0] * 8], dtype=torch.float16)
    parts = {
        "qweight": qweight,
        "qzeros": torch.full((2, 1), 0x77777777, dtype=torch.int32),
        "scales": scales,
        "g_idx": g_idx,
    }
    gw = gptq.read(parts, torch.float32, group_size=8)
    assert torch.equal(gw.g_idx, g_idx)
    w = gw.dequantize()  # (9 - 8) * scale of the row's group
    assert torch.equal(w, torch.tensor([2.0, 1.0] * 8).expand(8, 16))


def test_compressed_tensors_int4_symmetric_offset_eight():
    packed = torch.zeros(2, 1, dtype=torch.int32)  # (out, in / 8)
    packed[0, 0] = i32(0x87654321)  # row 0, columns 0..7: stored 1..8, i.e. quants -7..0
    packed[1, 0] = i32(0xF0000000)  # row 1: column 7 stored 15 (quant 7), the rest 0 (quant -8)
    parts = {
        "weight_packed": packed,
        "weight_shape": torch.tensor([2, 8]),
        "weight_scale": torch.tensor([[0.5], [2.0]]),
    }
    w = compressed_tensors.read(parts, torch.float32).dequantize()
    assert torch.equal(w[0], (torch.arange(1, 9.0) - 8) * 0.5)
    assert torch.equal(w[1], torch.tensor([-16.0] * 7 + [14.0]))


def test_compressed_tensors_int4_zero_points_packed_along_output():
    packed = torch.full((8, 1), i32(0x88888888), dtype=torch.int32)  # every quant 0 (stored 8)
    zp_word = i32(0xFEDCBA98)  # row n: zero point n, stored n + 8
    parts = {
        "weight_packed": packed,
        "weight_shape": torch.tensor([8, 8]),
        "weight_scale": torch.ones(8, 1),
        "weight_zero_point": torch.tensor([[zp_word]], dtype=torch.int32),  # (out / 8, groups)
    }
    w = compressed_tensors.read(parts, torch.float32).dequantize()
    n = torch.arange(8.0).unsqueeze(1)
    assert torch.equal(w, (-n).expand(8, 8))  # (stored 8 - stored n + 8) * 1


def test_fp8_per_tensor_and_per_channel_scales():
    weight = torch.tensor([[1.5, -2.0], [0.5, 448.0]]).to(torch.float8_e4m3fn)
    per_tensor = fp8_checkpoint.read({"weight": weight, "weight_scale": torch.tensor(2.0)})
    assert torch.equal(per_tensor.scale, torch.tensor([2.0, 2.0]))
    assert torch.equal(per_tensor.dequantize(), torch.tensor([[3.0, -4.0], [1.0, 896.0]]))
    per_channel = fp8_checkpoint.read({"weight": weight, "weight_scale": torch.tensor([[1.0], [0.25]])})
    assert torch.equal(per_channel.dequantize(), torch.tensor([[1.5, -2.0], [0.125, 112.0]]))

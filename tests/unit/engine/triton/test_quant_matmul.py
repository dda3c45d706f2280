"""The quantized linear kernels against their definitions: 4-bit groups (with and without
act-order ``g_idx``, split and whole inner dimension), FP8 W8A8 against the per-token reference
quantization and W8A16 against the dequantized weights; the CUDA ops on quantized weights
against the reference ops, and deterministic mode's row bits independent of the other rows.
Shapes are small and no multiples of the tiles where they may not be."""

import pytest
import torch
import torch.nn.functional as F

from lmiserve.rolling_batch.ops import create_ops
from lmiserve.rolling_batch.ops.batch_invariant import BatchInvariantOps
from lmiserve.rolling_batch.ops.reference import ReferenceOps
from lmiserve.rolling_batch.ops.triton_kernels import fp8_matmul, int4_matmul
from lmiserve.rolling_batch.ops.triton_kernels.fp8_matmul import (
    fp8_linear,
    quantize_per_token,
    quantize_per_token_reference,
    w8a8_reference,
)
from lmiserve.rolling_batch.ops.triton_kernels.int4_matmul import Int4Config, int4_config, int4_linear
from lmiserve.rolling_batch.quant.weights import BLOCK, BlockWeight, Fp8Weight, Int4Weight

N = 96  # a whole and a partial column tile


def int4_weight(n, k, group_size, act_order=False, dtype=torch.bfloat16, seed=0):
    """Random quants packed into :class:`Int4Weight`'s layout (nibble ``k % 8`` of word ``k // 8``)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (k, n), generator=g, dtype=torch.int32)
    packed = torch.zeros(k // 8, n, dtype=torch.int32)
    for j in range(8):
        packed |= q[j::8] << (4 * j)
    groups = k // group_size
    scales = (torch.rand(groups, n, generator=g) * 0.02 + 0.005).to(dtype)
    zeros = torch.randint(0, 16, (groups, n), generator=g).to(torch.uint8)
    g_idx = None
    if act_order:
        g_idx = (torch.arange(k) // group_size)[torch.randperm(k, generator=g)].to(torch.int32)
    weight = Int4Weight(packed, scales, zeros, group_size, g_idx)
    assert torch.equal(weight.unpacked(), q)
    return weight


def fp8_weight(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 60).clamp(-448, 448).to(torch.float8_e4m3fn)
    return Fp8Weight(w, torch.rand(n, generator=g) * 0.01 + 1e-3)


def q8_0_weight(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // BLOCK, 1, generator=g) * 0.01).half().view(torch.uint8)
    q = torch.randint(-127, 128, (n, k // BLOCK, BLOCK), generator=g, dtype=torch.int8).view(torch.uint8)
    return BlockWeight("q8_0", torch.cat([d, q], dim=-1).reshape(n, -1), k)


def activations(m, k, dtype=torch.bfloat16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).to(dtype), torch.randn(N, generator=g).to(dtype)


def close(got, want, tol=1e-2):
    """Within one or two roundings of the output dtype (the sums' order differs)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    got, want = got.float().cpu(), want.float().cpu()
    scale = want.abs().max().clamp(min=1.0)
    assert (got - want).abs().max() <= tol * scale, (got - want).abs().max()


@pytest.mark.parametrize("m", [1, 5, 33])
@pytest.mark.parametrize(
    ("k", "group_size", "act_order"),
    [(256, 32, False), (256, 128, True), (128, 128, False), (256, 256, False), (128, 32, True)],
)
def test_int4_is_the_dequantized_product(m, k, group_size, act_order, kernel_device):
    w = int4_weight(N, k, group_size, act_order).to(kernel_device)
    x, b = (t.to(kernel_device) for t in activations(m, k))
    for bias in (b, None):
        got = int4_linear(x, w.qweight, w.scales, w.zeros, w.group_size, w.g_idx, bias)
        close(got, F.linear(x, w.dequantize(x.dtype), bias))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_int4_other_activation_dtypes(dtype, kernel_device):
    w = int4_weight(N, 128, 64, dtype=dtype).to(kernel_device)
    x, b = (t.to(kernel_device) for t in activations(3, 128, dtype))
    got = int4_linear(x.view(1, 3, 128), w.qweight, w.scales, w.zeros, w.group_size, None, b)
    assert got.shape == (1, 3, N)
    close(got.view(3, N), F.linear(x, w.dequantize(dtype), b), 1e-5 if dtype == torch.float32 else 2e-3)


def test_int4_split_equals_whole_inner_dimension(kernel_device):
    """The decode configuration splits K; the same product in one part agrees to fp32 rounding."""
    w = int4_weight(N, 256, 32).to(kernel_device)
    x, b = (t.to(kernel_device) for t in activations(4, 256, torch.float32))
    split = int4_config(4, N, 256, 32)
    assert split.split_k > 1 and split.k_per_split * split.split_k >= 256
    whole = Int4Config(split.block_m, split.block_n, split.block_k, 1, 256)
    args = (x, w.qweight, w.scales, w.zeros, 32, None, b)
    assert torch.allclose(int4_linear(*args, config=split), int4_linear(*args, config=whole), atol=1e-5, rtol=1e-5)


def test_int4_configurations_depend_on_shapes_only():
    assert int4_config(1, 4096, 4096, 128) == int4_config(16, 4096, 4096, 128)
    assert int4_config(17, 4096, 4096, 128).split_k == 1
    assert {c for _, c in int4_matmul.int4_variants(4096, 4096, 128)} == {
        int4_config(m, 4096, 4096, 128) for m in (1, 7, 16, 17, 64, 500)
    }
    ((rows, fixed),) = int4_matmul.int4_variants(4096, 4096, 128, invariant=True)
    assert fixed.split_k == 1 and all(int4_config(m, 4096, 4096, 128, True) == fixed for m in (1, 16, 300))
    kernel = int4_matmul._int4_matmul_kernel
    names = getattr(kernel, "do_not_specialize", None) or kernel.kwargs.get("do_not_specialize", ())
    assert "M" in set(names) and not hasattr(kernel, "configs")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_per_token_quantization_is_the_reference_bits(dtype, kernel_device):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 200, generator=g) * torch.tensor([1.0, 3.0, 1e-3, 0.0, 100.0, 1e-6])[:, None]
    x[1, 7] = 125.0  # rounds across a power of two once scaled
    x = x.to(dtype).to(kernel_device)
    q, scale = quantize_per_token(x)
    q_ref, scale_ref = quantize_per_token_reference(x)
    assert torch.equal(scale.cpu(), scale_ref.cpu())
    assert torch.equal(q.view(torch.uint8).cpu(), q_ref.view(torch.uint8).cpu())
    assert torch.all(q[3].float() == 0)


@pytest.mark.parametrize("m", [1, 5, 33])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp8_w8a8_is_the_per_token_reference(m, dtype, kernel_device):
    w = fp8_weight(N, 160).to(kernel_device)
    x, b = (t.to(kernel_device) for t in activations(m, 160, dtype))
    for bias in (b, None):
        got = fp8_linear(x, w.weight, w.scale, bias)
        close(got, w8a8_reference(x, w.weight, w.scale, bias), 1e-5 if dtype == torch.float16 else 4e-3)


@pytest.mark.parametrize("m", [1, 33])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp8_w8a16_is_the_dequantized_product(m, dtype, kernel_device):
    w = fp8_weight(N, 160).to(kernel_device)
    x, b = (t.to(kernel_device) for t in activations(m, 160, dtype))
    got = fp8_linear(x, w.weight, w.scale, b, activations=False)
    close(got, F.linear(x, w.dequantize(dtype), b), 1e-5 if dtype == torch.float32 else 4e-3)


def _weights():
    return {
        "int4": int4_weight(N, 128, 32, act_order=True),
        "fp8": fp8_weight(N, 128),
        "q8_0": q8_0_weight(N, 128),
    }


@pytest.mark.parametrize("scheme", ["int4", "fp8", "q8_0"])
def test_cuda_ops_on_quantized_weights_are_the_reference_ops(scheme, kernel_device):
    """FP8 takes W8A8 here (as on GPUs of capability 8.9 and up), so it is off the reference
    (dequantized weights, activations as they are) by the activations' quantization."""
    weight = _weights()[scheme].to(kernel_device)
    x, b = (t.to(kernel_device) for t in activations(5, 128))
    cuda, ref = create_ops("cpu", "cuda"), ReferenceOps()
    w, w_ref = cuda.prepare_linear(weight, b), ref.prepare_linear(weight, b)
    close(cuda.linear(x, w), ref.linear(x, w_ref), 0.05 if scheme == "fp8" else 1e-2)
    gate_up = cuda.prepare_gate_up(weight)
    close(
        cuda.gate_up_swiglu(x, gate_up),
        ref.gate_up_swiglu(x, ref.prepare_gate_up(weight)),
        0.05 if scheme == "fp8" else 1e-2,
    )


def test_gguf_blocks_are_dense_at_prepare_when_the_dtype_is_known(kernel_device):
    from lmiserve.rolling_batch.ops.cuda import CudaOps

    weight = q8_0_weight(N, 128).to(kernel_device)
    w = CudaOps(dtype=torch.bfloat16).prepare_linear(weight)
    assert w.quant is None and w.weight.dtype == torch.bfloat16
    assert torch.equal(w.weight, weight.dequantize(torch.bfloat16))


@pytest.mark.parametrize("scheme", ["int4", "fp8", "q8_0"])
def test_deterministic_rows_do_not_depend_on_the_other_rows(scheme, kernel_device):
    """Rows alone, among 5 and among 70 (two row tiles of the fixed configuration): bit for bit."""
    ops = BatchInvariantOps(create_ops("cpu", "cuda"))
    w = ops.prepare_linear(_weights()[scheme].to(kernel_device))
    x, _ = (t.to(kernel_device) for t in activations(70, 128))
    full = ops.linear(x, w)
    assert torch.equal(ops.linear(x[:5], w), full[:5])
    assert torch.equal(ops.linear(x[4:5], w), full[4:5])
    assert torch.equal(ops.linear(x[66:], w), full[66:])
    assert torch.equal(ops.linear(torch.cat([x[60:], x[:5]]), w)[10:], full[:5])


def test_scaled_mm_is_only_taken_where_it_runs():
    x = torch.zeros(2, 32, dtype=torch.bfloat16)
    assert not fp8_matmul.scaled_mm_takes(x, torch.zeros(32, 32, dtype=torch.float8_e4m3fn))  # not CUDA


def test_w8a16_decodes_every_e4m3_value(kernel_device):
    """W8A16 reads the weight as bytes (no e4m3 type below compute capability 8.9): every
    finite e4m3 value, negative zero and subnormals included, read back exactly."""
    bits = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    bits[(bits & 0x7F) == 0x7F] = 0  # the two NaNs
    weight = torch.stack([bits, bits.flip(0)]).view(torch.float8_e4m3fn).to(kernel_device)
    eye = torch.eye(256, device=kernel_device)
    got = fp8_linear(eye, weight, torch.ones(2, device=kernel_device), activations=False)
    assert torch.equal(got.t().cpu(), weight.float().cpu())


def test_cuda_ops_below_compute_capability_8_9_take_w8a16(monkeypatch, kernel_device):
    """Without fp8 instructions the activations stay as they are: the product of the dequantized
    weights (the reference ops' FP8 product quantizes the activations too, W8A8)."""
    from lmiserve.rolling_batch.ops import cuda_quant

    monkeypatch.setattr(cuda_quant, "fp8_activations", lambda x: False)
    weight = fp8_weight(N, 128).to(kernel_device)
    x, b = (t.to(kernel_device) for t in activations(5, 128))
    cuda = create_ops("cpu", "cuda")
    close(cuda.linear(x, cuda.prepare_linear(weight, b)), F.linear(x, weight.dequantize(x.dtype), b), 4e-3)


def test_no_rows(kernel_device):
    w = int4_weight(N, 128, 32).to(kernel_device)
    f = fp8_weight(N, 128).to(kernel_device)
    x = torch.zeros(0, 128, dtype=torch.bfloat16, device=kernel_device)
    assert int4_linear(x, w.qweight, w.scales, w.zeros, 32).shape == (0, N)
    assert fp8_linear(x, f.weight, f.scale).shape == (0, N)


def test_the_warm_up_steps_reach_every_configuration():
    """The warm-up's eager steps of 1 and PROMPT_ROWS rows run both configurations of each
    kernel (every quantized projection of the model, in the model's dtype)."""
    from lmiserve.rolling_batch.runner.warmup import PROMPT_ROWS

    reached = {int4_config(m, 4096, 4096, 128) for m in (1, PROMPT_ROWS)}
    assert reached == {c for _, c in int4_matmul.int4_variants(4096, 4096, 128)}
    assert {fp8_matmul.fp8_config(m) for m in (1, PROMPT_ROWS)} == {c for _, c in fp8_matmul.fp8_variants()}

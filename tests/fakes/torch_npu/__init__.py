"""A semantic stand-in for ``torch_npu`` on the CPU, for tests.

Each function does what torch_npu's operator documentation says the real kernel does, on CPU
tensors, and refuses what the documentation says the kernel does not accept (wrong dtypes,
layouts, non-contiguous inputs, decreasing cumulative lengths, a mask of the wrong polarity).
Every call is recorded in :data:`CALLS` as ``(name, kwargs)`` so tests can check the layouts,
lengths and tables the NPU backend passes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__version__ = "0.0.0+cpu-semantic-fake"
CALLS: list[tuple[str, dict]] = []


class KernelError(RuntimeError):
    """What the real kernel would reject (it raises, or silently computes garbage)."""


def _record(name: str, **kwargs) -> None:
    CALLS.append((name, kwargs))


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise KernelError(message)


def _contiguous(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        _need(t.is_contiguous(), f"{name}: non-contiguous input is not supported")


# --- normalisation, activation, rotary ------------------------------------------------------


def npu_rms_norm(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6):
    _record("npu_rms_norm", shape=tuple(x.shape), epsilon=epsilon)
    _need(x.dtype in (torch.float16, torch.bfloat16, torch.float32), "npu_rms_norm: dtype")
    _need(gamma.dtype == x.dtype, "npu_rms_norm: gamma must have the dtype of the input")
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon)
    return gamma * (xf * rstd).to(x.dtype), rstd


def npu_swiglu(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    _record("npu_swiglu", shape=tuple(x.shape), dim=dim)
    a, b = x.chunk(2, dim=dim)
    return F.silu(a) * b


def npu_apply_rotary_pos_emb(query, key, cos, sin, *, layout="BSND", rotary_mode="half"):
    _record("npu_apply_rotary_pos_emb", layout=layout, rotary_mode=rotary_mode, shape=tuple(query.shape))
    _need(rotary_mode == "half", "npu_apply_rotary_pos_emb: only half mode on Atlas A2/A3")
    _need(layout in ("BSND", "TND"), "npu_apply_rotary_pos_emb: layout")
    dims = 3 if layout == "TND" else 4
    for name, t in (("query", query), ("key", key), ("cos", cos), ("sin", sin)):
        _need(t.dim() == dims, f"npu_apply_rotary_pos_emb: {name} must have {dims} dims for {layout}")
        _need(t.shape[-1] in (64, 128), f"npu_apply_rotary_pos_emb: {name} head dim must be 64 or 128")
        _need(t.dtype == query.dtype, "npu_apply_rotary_pos_emb: all inputs must share a dtype")
    _need(cos.shape[-2] == 1 and sin.shape[-2] == 1, "npu_apply_rotary_pos_emb: cos/sin N must be 1")
    _need(query.shape[0] == key.shape[0] == cos.shape[0], "npu_apply_rotary_pos_emb: T must match")
    query.copy_(_half_rotate(query, cos, sin))
    key.copy_(_half_rotate(key, cos, sin))
    return query, key


def _half_rotate(x: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return r1 * x + r2 * torch.cat((-x2, x1), dim=-1)


def npu_rotary_mul(input, r1, r2, rotary_mode="half", rotate=None):  # noqa: A002 - the documented name
    _record("npu_rotary_mul", rotary_mode=rotary_mode, shape=tuple(input.shape))
    _need(input.dim() == 4 and r1.dim() == 4 and r2.dim() == 4, "npu_rotary_mul: 4-D inputs")
    if rotary_mode == "half":
        return _half_rotate(input, r1, r2)
    _need(rotary_mode == "interleave", "npu_rotary_mul: rotary_mode")
    x1, x2 = input[..., ::2], input[..., 1::2]
    x_new = torch.stack((-x2, x1), dim=-1).flatten(-2)
    return r1 * input + r2 * x_new


# --- KV cache ----------------------------------------------------------------------------------


def npu_scatter_pa_kv_cache(
    key, value, key_cache, value_cache, slot_mapping, *, compress_lens=None, compress_seq_offsets=None,
    seq_lens=None, cache_mode="PA_NZ",
):  # fmt: skip
    _record(
        "npu_scatter_pa_kv_cache",
        key_shape=tuple(key.shape),
        cache_shape=tuple(key_cache.shape),
        slot_dtype=slot_mapping.dtype,
        cache_mode=cache_mode,
        slots=slot_mapping.tolist(),
    )
    _contiguous(key=key, value=value, key_cache=key_cache, value_cache=value_cache, slot_mapping=slot_mapping)
    _need(cache_mode in (None, "Norm"), "npu_scatter_pa_kv_cache: ND caches need cache_mode='Norm' (PA_NZ is NZ)")
    _need(key.dtype == value.dtype == key_cache.dtype == value_cache.dtype, "npu_scatter_pa_kv_cache: dtypes")
    _need(slot_mapping.dtype in (torch.int32, torch.int64), "npu_scatter_pa_kv_cache: slot dtype")
    # scenario 2: key (T, N, D), cache (num_blocks, block_size, N, D), slots (T,)
    _need(key.dim() == 3 and key_cache.dim() == 4, "npu_scatter_pa_kv_cache: scenario 2 shapes")
    _need(key.shape[:2] == value.shape[:2], "npu_scatter_pa_kv_cache: key/value shapes")
    _need(key_cache.shape[2:] == key.shape[1:], "npu_scatter_pa_kv_cache: cache head layout")
    _need(slot_mapping.shape == (key.shape[0],), "npu_scatter_pa_kv_cache: one slot per token")
    capacity = key_cache.shape[0] * key_cache.shape[1]
    slots = slot_mapping.long()
    _need(bool(((slots >= 0) & (slots < capacity)).all()), "npu_scatter_pa_kv_cache: slot out of [0, capacity)")
    _need(slots.unique().numel() == slots.numel(), "npu_scatter_pa_kv_cache: repeated slots")
    heads, dim = key_cache.shape[2], key_cache.shape[3]
    key_cache.view(-1, heads, dim).index_copy_(0, slots, key)
    value_cache.view(-1, heads, dim).index_copy_(0, slots, value)


# --- attention ---------------------------------------------------------------------------------


def _kv(cache: torch.Tensor, table: torch.Tensor, length: int, block_size: int, kv_heads: int) -> torch.Tensor:
    dim = cache.shape[-1] // kv_heads
    flat = cache.reshape(-1, kv_heads, dim)
    pos = torch.arange(length)
    slots = table.long()[pos // block_size] * block_size + pos % block_size
    return flat[slots].float()  # (L, KVH, D)


def _attend(q, k, v, heads, kv_heads, scale, causal_offset):  # type: ignore[no-untyped-def]
    """q (n, H, D), k/v (L, KVH, D); query i sits at position causal_offset + i."""
    group = heads // kv_heads
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    n, length = q.shape[0], k.shape[0]
    if causal_offset is not None:
        qp = torch.arange(causal_offset, causal_offset + n).unsqueeze(1)
        kp = torch.arange(length).unsqueeze(0)
        scores = scores.masked_fill(kp > qp, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)


def npu_fused_infer_attention_score(
    query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None, actual_seq_lengths_kv=None,
    block_table=None, num_heads=1, scale=1.0, pre_tokens=2147483647, next_tokens=2147483647, input_layout="BSH",
    num_key_value_heads=0, sparse_mode=0, inner_precise=0, block_size=0, softmax_lse_flag=False, **unused,
):  # fmt: skip
    _record(
        "npu_fused_infer_attention_score",
        input_layout=input_layout,
        query_shape=tuple(query.shape),
        key_shape=tuple(key.shape),
        actual_seq_lengths=None if actual_seq_lengths is None else list(actual_seq_lengths),
        actual_seq_lengths_kv=None if actual_seq_lengths_kv is None else list(actual_seq_lengths_kv),
        block_table_dtype=None if block_table is None else block_table.dtype,
        block_table_shape=None if block_table is None else tuple(block_table.shape),
        sparse_mode=sparse_mode,
        mask_shape=None if atten_mask is None else tuple(atten_mask.shape),
        num_heads=num_heads,
        num_key_value_heads=num_key_value_heads,
        block_size=block_size,
    )
    _need(not any(v is not None for v in unused.values()), f"unsupported arguments in this fake: {unused}")
    _contiguous(query=query, key=key, value=value)
    _need(query.dtype in (torch.float16, torch.bfloat16), "query: float16 or bfloat16 (int8 only when quantised)")
    _need(key.dtype == value.dtype == query.dtype, "key and value must have the query's dtype")
    kv_heads = num_key_value_heads or num_heads
    _need(num_heads % kv_heads == 0 and num_heads // kv_heads <= 64, "num_heads must be a multiple (<= 64) of KV heads")
    # page attention: the KV come from the paged cache through the block table
    _need(block_table is not None, "this fake implements the page-attention path only")
    _need(block_table.dtype == torch.int32 and block_table.dim() == 2, "block_table must be 2-D int32")
    _need(actual_seq_lengths_kv is not None, "page attention needs actual_seq_lengths_kv")
    _need(key.dim() == 3 and key.shape == value.shape, "the paged KV must be (blocknum, blocksize, H)")
    _need(key.shape[1] == block_size, "block_size must be the cache's block size")
    _need(block_size % 16 == 0 and 0 < block_size <= 512, "block_size must be 16-aligned and at most 512")
    kv_lens = [int(n) for n in actual_seq_lengths_kv]
    _need(all(n >= 0 for n in kv_lens), "actual_seq_lengths_kv must not be negative")
    batch = len(kv_lens)
    _need(block_table.shape[0] == batch, "block_table needs one row per batch")
    needed = max((math.ceil(n / block_size) for n in kv_lens), default=0)
    _need(block_table.shape[1] >= needed, "block_table is narrower than the longest sequence")
    if input_layout == "BSH":
        b, s, hidden = query.shape
        _need(s == 1 and b == batch, "this fake's BSH path is decode: (B, 1, H)")
        dim = hidden // num_heads
        q = query.view(b, num_heads, dim)
        out = torch.empty(b, num_heads, dim)
        for i, n in enumerate(kv_lens):
            k = _kv(key, block_table[i], n, block_size, kv_heads)
            v = _kv(value, block_table[i], n, block_size, kv_heads)
            out[i] = _attend(q[i : i + 1], k, v, num_heads, kv_heads, scale, None)[0]
        return out.view(b, 1, hidden).to(query.dtype), torch.zeros(1)
    _need(input_layout == "TND", f"layout {input_layout} is not in this fake")
    _need(actual_seq_lengths is not None, "TND needs cumulative actual_seq_lengths")
    cu = [int(n) for n in actual_seq_lengths]
    _need(len(cu) == batch, "TND: one cumulative query length per batch")
    _need(all(b >= a for a, b in zip([0, *cu], cu)), "actual_seq_lengths must not decrease")
    _need(cu[-1] == query.shape[0], "the last cumulative length must be T")
    _need(sparse_mode == 3, "this fake's TND path is causal prefill: sparse_mode=3")
    _need(atten_mask is not None and tuple(atten_mask.shape[-2:]) == (2048, 2048), "sparse_mode=3 needs the 2048 mask")
    expected = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)
    _need(bool((atten_mask.bool().reshape(2048, 2048) == expected).all()), "the mask must be True above the diagonal")
    out = torch.empty(query.shape, dtype=torch.float32)
    start = 0
    for i, end in enumerate(cu):
        n, length = end - start, kv_lens[i]
        _need(n <= length, "a query chunk is longer than its sequence")
        if n:
            k = _kv(key, block_table[i], length, block_size, kv_heads)
            v = _kv(value, block_table[i], length, block_size, kv_heads)
            out[start:end] = _attend(query[start:end], k, v, num_heads, kv_heads, scale, length - n)
        start = end
    return out.to(query.dtype), torch.zeros(1)


# --- sampling --------------------------------------------------------------------------------


def npu_grouped_matmul(x, weight, *, group_list=None, split_item=0, group_type=None, group_list_type=0, **rest):
    """The documented "single x, single 3-D weight, single y" form (group_type 0, group_list a
    tensor): rows ``group_list[i-1]:group_list[i]`` of ``x`` times ``weight[i]`` (``(k, n)``, which
    may be a transposed view), one output tensor."""
    groups = group_list.tolist() if isinstance(group_list, torch.Tensor) else group_list
    _record("npu_grouped_matmul", group_list=groups, split_item=split_item, group_type=group_type)
    _need(len(x) == 1 and len(weight) == 1, "npu_grouped_matmul: this form takes one x and one weight tensor")
    xs, w = x[0], weight[0]
    _need(group_type == 0 and split_item in (2, 3), "npu_grouped_matmul: group_type 0 needs split_item 2 or 3")
    _need(isinstance(group_list, torch.Tensor) and group_list.dtype == torch.int64, "npu_grouped_matmul: group_list")
    _need(group_list_type == 0, "npu_grouped_matmul: only cumulative group lists here")
    _need(xs.dim() == 2 and w.dim() == 3, "npu_grouped_matmul: x must be 2-D and the weight 3-D")
    _need(xs.is_contiguous(), "npu_grouped_matmul: x does not support transposition")
    _need(
        xs.dtype == w.dtype and xs.dtype in (torch.float16, torch.bfloat16, torch.float32), "npu_grouped_matmul: dtype"
    )
    _need(len(groups) == w.shape[0] <= 1024, "npu_grouped_matmul: one group per weight, at most 1024")
    _need(all(b >= a for a, b in zip([0, *groups], groups)), "npu_grouped_matmul: group_list must not decrease")
    _need(groups[-1] == xs.shape[0], "npu_grouped_matmul: the last group must end at x's rows")
    _need(xs.shape[1] == w.shape[1], "npu_grouped_matmul: x's columns must be the weight's k")
    out = torch.empty(xs.shape[0], w.shape[2], dtype=xs.dtype)
    start = 0
    for i, end in enumerate(groups):
        out[start:end] = (xs[start:end].float() @ w[i].float()).to(xs.dtype)
        start = end
    return [out]


def npu_top_k_top_p(logits: torch.Tensor, p: torch.Tensor | None = None, k: torch.Tensor | None = None):
    _record("npu_top_k_top_p", k=None if k is None else k.tolist(), p=None if p is None else p.tolist())
    _need(p is not None or k is not None, "npu_top_k_top_p: p and k cannot both be None")
    _need(logits.dim() == 2, "npu_top_k_top_p: 2-D logits")
    if k is not None:
        _need(k.dtype == torch.int32, "npu_top_k_top_p: k must be int32")
        _need(bool(((k >= 1) & (k <= 1024) & (k <= logits.shape[1])).all()), "npu_top_k_top_p: k out of range")
    if p is not None:
        _need(p.dtype == logits.dtype, "npu_top_k_top_p: p must have the dtype of the logits")
    values, indices = logits.sort(dim=-1, descending=False, stable=True)
    vocab = logits.shape[1]
    if k is not None:
        threshold = values.gather(1, (vocab - k.long()).unsqueeze(1))
        values = values.masked_fill(values < threshold, float("-inf"))
    if p is not None:
        cumulative = torch.softmax(values, dim=-1).cumsum(dim=-1)
        mask = cumulative <= (1 - p).unsqueeze(1)
        mask[:, -1] = False
        values = values.masked_fill(mask, float("-inf"))
    return torch.empty_like(logits).scatter_(1, indices, values)

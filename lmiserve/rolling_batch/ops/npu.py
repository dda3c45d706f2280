"""The device ops on Huawei Ascend NPUs, with torch_npu's fused kernels.

``torch_npu`` is imported when these ops are created, never when this module is: without
Ascend's CANN libraries its import fails (and with ``TORCH_DEVICE_BACKEND_AUTOLOAD`` unset it
even breaks ``import torch``), so nothing outside the NPU backend may touch it.

The KV cache keeps the layout of every backend, per layer ``(num_blocks, block_size,
kv_heads, head_dim)``; the attention kernel reads it as ``(num_blocks, block_size, kv_heads *
head_dim)``, a free view. Kernels and how they are called (signatures from torch_npu's own
operator documentation):

- K/V writes: ``npu_scatter_pa_kv_cache`` with the ND layout (``cache_mode="Norm"``) and int32
  slots; slots of -1 (tokens not to store) are dropped first, as the kernel takes only valid ones.
- Prefill and chunked prefill: ``npu_fused_infer_attention_score`` in the TND layout with
  cumulative query lengths (``actual_seq_lengths``), per-sequence KV lengths
  (``actual_seq_lengths_kv``), the int32 block table, and ``sparse_mode=3``
  (causal, aligned to the bottom right, so a chunk continuing a cached prefix sees all of it)
  with the kernel's 2048 x 2048 mask in which True means masked.
- Decodes: the same call (:meth:`NpuOps.attention`): decodes and prompt chunks together in one
  TND call per layer (a decode is a sequence of one query token), its lengths taken from the
  step's host copies, so the device is never read for them. The kernel takes fp16 and bf16
  only: an fp32 model's attention runs the reference ops (plain torch, on the NPU).
- RMSNorm ``npu_rms_norm`` (it returns ``(y, rstd)`` like our interface), SwiGLU ``npu_swiglu``,
  rotary ``npu_apply_rotary_pos_emb`` (TND, half layout, head sizes 64 and 128) else
  ``npu_rotary_mul``, top-k/top-p ``npu_top_k_top_p`` (k between 1 and 1024).
"""

from __future__ import annotations

import torch

from .reference import ReferenceOps

MASK_SIZE = 2048
FUSED_ROPE_HEAD_DIMS = (64, 128)
MAX_FUSED_TOP_K = 1024
ATTENTION_DTYPES = (torch.float16, torch.bfloat16)
"""What npu_fused_infer_attention_score computes in (besides quantised int8)."""


class NpuOps(ReferenceOps):
    name = "npu"
    native_formats: tuple[str, ...] = ()

    def __init__(self) -> None:
        import torch_npu

        self.npu = torch_npu
        self._masks: dict[torch.device, torch.Tensor] = {}
        self._slots: tuple[torch.Tensor, torch.Tensor] | None = None

    # --- normalisation, activation, rotary ----------------------------------------------
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        y, rstd = self.npu.npu_rms_norm(x, weight, epsilon=eps)
        return y, rstd

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = residual + x
        return self.npu.npu_rms_norm(h, weight, epsilon=eps)[0], h

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.npu.npu_swiglu(gate_up, dim=-1)

    def rotary(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = q.contiguous(), k.contiguous()
        if not interleaved and q.shape[-1] in FUSED_ROPE_HEAD_DIMS:
            # (T, N, D) with cos/sin (T, 1, D); rotates q and k in place
            c, s = cos.unsqueeze(1).contiguous(), sin.unsqueeze(1).contiguous()
            self.npu.npu_apply_rotary_pos_emb(q, k, c, s, layout="TND", rotary_mode="half")
            return q, k
        # BSND with B = tokens, S = 1; cos/sin as BS1D
        mode = "interleave" if interleaved else "half"
        c, s = cos[:, None, None, :].contiguous(), sin[:, None, None, :].contiguous()
        q = self.npu.npu_rotary_mul(q.unsqueeze(1), c, s, rotary_mode=mode).squeeze(1)
        k = self.npu.npu_rotary_mul(k.unsqueeze(1), c, s, rotary_mode=mode).squeeze(1)
        return q, k

    # --- KV cache ---------------------------------------------------------------------
    def _valid_slots(self, slot_mapping: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(rows to keep or None for all, int32 slots): worked out once per step (every layer
        of a step gets the same slot mapping), so the host waits for the device once."""
        cached = self._slots
        if cached is not None and cached[0] is slot_mapping:
            return cached[1]  # type: ignore[return-value]
        keep = slot_mapping >= 0
        if bool(keep.all()):
            result: tuple[torch.Tensor | None, torch.Tensor] = (None, slot_mapping.to(torch.int32).contiguous())
        else:
            rows = keep.nonzero().squeeze(1)
            result = (rows, slot_mapping[rows].to(torch.int32).contiguous())
        self._slots = (slot_mapping, result)  # type: ignore[assignment]
        return result

    def write_kv(
        self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        rows, slots = self._valid_slots(slot_mapping)
        if rows is not None:
            if rows.numel() == 0:
                return
            k, v = k.index_select(0, rows), v.index_select(0, rows)
        k = k.to(k_cache.dtype).contiguous()
        v = v.to(v_cache.dtype).contiguous()
        self.npu.npu_scatter_pa_kv_cache(k, v, k_cache, v_cache, slots, cache_mode="Norm")

    # --- attention --------------------------------------------------------------------
    def causal_mask(self, device: torch.device) -> torch.Tensor:
        """The kernel's compressed causal mask for ``sparse_mode=3``: True above the diagonal."""
        mask = self._masks.get(device)
        if mask is None:
            mask = torch.triu(torch.ones(MASK_SIZE, MASK_SIZE, dtype=torch.bool, device=device), diagonal=1)
            self._masks[device] = mask
        return mask

    def _step_attention(self, q, k_cache, v_cache, paged, scale, window=0, softcap=0.0):  # type: ignore[no-untyped-def]
        if window > 0:
            raise NotImplementedError("sliding-window attention is not available on NPUs")
        if softcap > 0:
            raise NotImplementedError("attention score capping is not available on NPUs")
        if q.dtype not in ATTENTION_DTYPES:
            return super()._step_attention(q, k_cache, v_cache, paged, scale)
        return self._tnd(q, k_cache, v_cache, paged.block_tables, paged.host_cu_q_lens, paged.host_seq_lens, scale)

    def _tnd(self, q, k_cache, v_cache, block_tables, cu, lens, scale):  # type: ignore[no-untyped-def]
        """Query rows of many sequences (TND), causal and aligned to each sequence's end."""
        mask = self.causal_mask(q.device)
        layout = {"atten_mask": mask, "actual_seq_lengths": cu[1:], "sparse_mode": 3}
        return self._fused(q, k_cache, v_cache, q.shape[1], block_tables, lens, scale, "TND", **layout)

    def _fused(self, query, k_cache, v_cache, heads, block_tables, lens, scale, layout, **extra):  # type: ignore[no-untyped-def]
        """``npu_fused_infer_attention_score`` over the paged cache, each block's K and V as
        ``(block_size, kv_heads * head_dim)`` rows; ``lens`` are the sequences' lengths."""
        blocks, block_size, kv_heads, dim = k_cache.shape
        key = k_cache.view(blocks, block_size, kv_heads * dim)
        value = v_cache.view(blocks, block_size, kv_heads * dim)
        paged = {"block_table": block_tables, "block_size": block_size, "actual_seq_lengths_kv": lens}
        shape = {"num_heads": heads, "num_key_value_heads": kv_heads, "input_layout": layout}
        out, _ = self.npu.npu_fused_infer_attention_score(query, key, value, scale=scale, **paged, **shape, **extra)
        return out

    # --- LoRA -----------------------------------------------------------------------
    def lora_add(self, y, x, a, b, lora, parts=None):  # type: ignore[no-untyped-def]
        """The runs' rows gathered, then two grouped matrix multiplies (one group per run, each
        with its slot's factor; A transposed in place) and the update added back to those rows."""
        if len(lora.segments) == 1 or y.dtype not in ATTENTION_DTYPES:
            return super().lora_add(y, x, a, b, lora, parts)
        slots, firsts, ends = lora.tensors()
        rows = lora.rows()
        index = slots.long()
        ends_cum = torch.cumsum(ends - firsts, 0).long()
        grouped = self.npu.npu_grouped_matmul
        xs = x.index_select(0, rows)
        (u,) = grouped(
            [xs], [a.index_select(0, index).transpose(1, 2)], group_list=ends_cum, split_item=3, group_type=0
        )
        (v,) = grouped([u], [b.index_select(0, index)], group_list=ends_cum, split_item=3, group_type=0)
        y.index_add_(0, rows, v)

    # --- sampling ---------------------------------------------------------------------
    def top_k_top_p(self, logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
        """The fused filter where its limits allow (every row's k in 1..1024, or no k at all);
        otherwise the reference filter."""
        if top_k is None and top_p is None:
            return logits
        k = None
        if top_k is not None:
            limit = min(MAX_FUSED_TOP_K, logits.shape[-1])
            if not bool(((top_k >= 1) & (top_k <= limit)).all()):
                return super().top_k_top_p(logits, top_k, top_p)
            k = top_k.to(torch.int32)
        p = None if top_p is None else top_p.to(logits.dtype)
        return self.npu.npu_top_k_top_p(logits, p, k)

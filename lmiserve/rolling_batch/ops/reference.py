"""The device ops in plain torch: the definition of correct (CPU and CUDA).

KV cache of one layer: K and V, each ``(num_blocks, block_size, num_kv_heads, head_dim)``.
Token ``pos`` of sequence ``s`` lives in slot
``block_tables[s][pos // block_size] * block_size + pos % block_size``.
Query heads are grouped contiguously over KV heads: head ``h`` reads KV head
``h // (num_heads // num_kv_heads)``. Softmax is computed in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...generation.sampling import apply_top_k_top_p_min_p
from ..quant.fp8_activations import w8a8_reference
from ..quant.int8_activations import linear_int8_activations
from ..quant.weights import BlockWeight, Fp8Weight, QuantizedWeight, is_quantized
from .interface import ExpertWeights, LinearWeight, Ops
from .metadata import LoraStep, PagedAttentionInputs


def _slots(block_table: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    positions = torch.arange(length, device=block_table.device)
    return block_table.long()[positions // block_size] * block_size + positions % block_size


def split_qkv(
    qkv: torch.Tensor, heads: int, kv_heads: int, dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused projection ``(T, (heads + 2 kv_heads) dim)`` as queries ``(T, heads, dim)``, keys
    and values ``(T, kv_heads, dim)``, each contiguous: the ops contract (and the NPU kernels) take
    no strided inputs."""
    tokens = qkv.shape[0]
    q, k, v = (t.contiguous() for t in qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1))
    return q.view(tokens, heads, dim), k.view(tokens, kv_heads, dim), v.view(tokens, kv_heads, dim)


def quantized_linear(weight: QuantizedWeight, bias: torch.Tensor | None = None) -> LinearWeight:
    """A quantized weight as the ops take it: its shape on the meta device, the weight itself in ``quant``."""
    shape = torch.empty(weight.shape, device="meta")
    return LinearWeight(shape, bias, quant=weight)


class ReferenceOps(Ops):
    """The :class:`~.interface.Ops` in plain torch; the device implementations fall back to it."""

    name = "reference"
    native_formats: tuple[str, ...] = ("gguf", "int4", "fp8")
    """Every format: :meth:`linear` is each one's definition (it dequantizes per call)."""
    int8_activations: bool = False
    """``option.quantize_activations=int8``: GGUF blocks multiply activations quantized to int8
    (:mod:`..quant.int8_activations`, which defines it)."""

    # --- linear layers -----------------------------------------------------------------
    def prepare_linear(self, weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None = None) -> LinearWeight:
        bias = None if bias is None else bias.contiguous()
        if is_quantized(weight):
            return quantized_linear(weight, bias)  # type: ignore[arg-type]
        return LinearWeight(weight.contiguous(), bias)  # type: ignore[union-attr]

    def linear(self, x: torch.Tensor, w: LinearWeight) -> torch.Tensor:
        if isinstance(w.quant, Fp8Weight):  # W8A8: activations quantized per token too
            return w8a8_reference(x, w.quant.weight, w.quant.scale, w.bias)
        if self.int8_activations and isinstance(w.quant, BlockWeight):
            return linear_int8_activations(x, w.quant, w.bias)
        if w.quant is not None:  # the definition: weights dequantized in fp32, then the product
            return F.linear(x, w.quant.dequantize(x.dtype), w.bias)
        return F.linear(x, w.weight, w.bias)

    def prepare_gate_up(self, weight: torch.Tensor) -> LinearWeight:
        """The MLP's gate and up projections as one weight (gate rows, then up rows); a backend
        may lay it out for :meth:`gate_up_swiglu`. :meth:`linear` of it is still gate_up."""
        return self.prepare_linear(weight)

    def gate_up_swiglu(self, x: torch.Tensor, w: LinearWeight) -> torch.Tensor:
        """``swiglu(linear(x, w))`` (a backend may not write gate_up out at all)."""
        return self.swiglu(self.linear(x, w))

    # --- normalisation, activation, rotary ----------------------------------------------
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(y, rstd)``: ``y = weight * (x / rms(x))`` computed in fp32 then cast back, as HF does."""
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return weight * (xf * rstd).to(x.dtype), rstd

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rms_norm(residual + x), residual + x)``: the residual connection and the next norm."""
        h = residual + x
        return self.rms_norm(h, weight, eps)[0], h

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def geglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``gelu(gate) * up`` with the tanh approximation of gelu (Gemma's MLP)."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up

    def rotary(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q ``(T, H, D)`` and k ``(T, KVH, D)`` by per-token ``cos``/``sin`` ``(T, D)``.

        Half layout (Llama/Qwen): pairs are ``(x[i], x[i + D/2])`` and cos/sin repeat their
        first half. Interleaved layout (GPT-J): pairs are ``(x[2i], x[2i+1])``.
        """
        cos = cos.unsqueeze(1)
        sin = sin.unsqueeze(1)
        return _rotate(q, cos, sin, interleaved), _rotate(k, cos, sin, interleaved)

    def rotate_and_store(
        self,
        qkv: torch.Tensor,
        heads: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> torch.Tensor:
        """From the fused projection ``qkv`` ``(T, (heads + 2 kv_heads) D)``: the rotated queries
        ``(T, heads, D)`` (contiguous), with the rotated keys and the values stored at their slots
        (half rotation layout)."""
        q, k, v = split_qkv(qkv, heads, k_cache.shape[2], k_cache.shape[3])
        q, k = self.rotary(q, k, cos, sin)
        self.write_kv(k, v, k_cache, v_cache, slot_mapping)
        return q

    # --- KV cache ---------------------------------------------------------------------
    def write_kv(
        self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        """Store each token's key and value at its slot; slot -1 means "do not store"."""
        keep = slot_mapping >= 0
        if not bool(keep.all()):
            k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
        kv_heads, dim = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, kv_heads, dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
        v_cache.view(-1, kv_heads, dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))

    # --- attention --------------------------------------------------------------------
    def _attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        kv_len: int,
        scale: float,
        window: int,
        softcap: float = 0.0,
    ) -> torch.Tensor:
        """Attention of ``q`` (n, H, D), the last n positions of a sequence of ``kv_len`` tokens."""
        n, heads, dim = q.shape
        block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
        slots = _slots(block_table, kv_len, block_size)
        k = k_cache.view(-1, kv_heads, dim)[slots].float()
        v = v_cache.view(-1, kv_heads, dim)[slots].float()
        group = heads // kv_heads
        k = k.repeat_interleave(group, dim=1)  # (L, H, D): head h reads KV head h // group
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
        if softcap > 0:
            scores = torch.tanh(scores / softcap) * softcap
        q_pos = torch.arange(kv_len - n, kv_len, device=q.device).unsqueeze(1)
        k_pos = torch.arange(kv_len, device=q.device).unsqueeze(0)
        allowed = k_pos <= q_pos  # causal, aligned to the bottom right
        if window > 0:
            allowed &= k_pos > q_pos - window
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)

    def attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        paged: PagedAttentionInputs,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
    ) -> torch.Tensor:
        """Every sequence of the step at once: q ``(T, H, D)``, sequence ``s`` at rows
        ``cu_q_lens[s]:cu_q_lens[s+1]`` (one row for a decode), continuing its cached tokens.
        ``window``: keys more than ``window - 1`` positions back are masked (0: none);
        ``softcap``: scores capped as ``tanh(s / softcap) * softcap`` before the softmax (0: none).
        The rows ``paged.generated`` names (generated tokens run again in a prompt chunk) are
        attended once more, each as the decode of its position (:mod:`.generated_rows`). A
        device's ops implement :meth:`_step_attention` and inherit this."""
        out = self._step_attention(q, k_cache, v_cache, paged, scale, window, softcap)
        generated = paged.generated
        if generated is not None:
            rows = q.index_select(0, generated.rows)
            decoded = self._step_attention(rows, k_cache, v_cache, generated.paged, scale, window, softcap)
            out.index_copy_(0, generated.rows, decoded)
        return out

    def _step_attention(self, q, k_cache, v_cache, paged: PagedAttentionInputs, scale, window=0, softcap=0.0):  # type: ignore[no-untyped-def]
        """:meth:`attention` of the rows as they are laid out (generated rows not set apart)."""
        out = torch.empty_like(q)
        bounds, tables = paged.host_cu_q_lens, paged.block_tables
        for s, length in enumerate(paged.host_seq_lens):
            lo, hi = bounds[s], bounds[s + 1]
            out[lo:hi] = self._attend(q[lo:hi], k_cache, v_cache, tables[s], length, scale, window, softcap)
        return out

    # --- mixture of experts -------------------------------------------------------------
    def prepare_experts(self, w13: torch.Tensor, w2: torch.Tensor) -> ExpertWeights:
        """Experts as :meth:`fused_moe` takes them: ``w13`` ``(E, 2I, H)`` (gate rows, then up rows),
        ``w2`` ``(E, H, I)``."""
        return ExpertWeights(w13.contiguous(), w2.contiguous())

    def fused_moe(
        self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, experts: ExpertWeights
    ) -> torch.Tensor:
        """``y[t] = sum_j topk_weights[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t]))`` with
        ``e = topk_ids[t, j]``: x ``(T, H)``, ``topk_weights`` ``(T, k)`` fp32, ``topk_ids`` ``(T, k)``
        int32. Each expert runs once, on the rows routed to it; each product is rounded to x's dtype
        and the weighted sum is taken in fp32 (in the order of the k choices), then cast to x's dtype."""
        tokens, k = topk_ids.shape
        out = torch.zeros(tokens, k, x.shape[1], dtype=torch.float32, device=x.device)
        flat = topk_ids.reshape(-1).long()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=experts.num_experts).tolist()
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            pairs = order[start : start + n]
            start += n
            rows = pairs // k
            act = self.swiglu(F.linear(x[rows], experts.w13[e]))
            out.view(-1, x.shape[1])[pairs] = F.linear(act, experts.w2[e]).float()
        return (out * topk_weights.float().unsqueeze(-1)).sum(dim=1).to(x.dtype)

    # --- LoRA ---------------------------------------------------------------------------
    def lora_add(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        lora: LoraStep,
        parts: tuple[int, ...] | None = None,
    ) -> None:
        """Add each adapter's low-rank update to the rows of its requests, in place: for every run
        ``(slot, first, end)`` of ``lora``, ``y[first:end] += x[first:end] @ a[slot].T @ b[slot]``
        (``a`` ``(slots, r, in)``, ``b`` ``(slots, r, out)``, scaling folded into ``b``).

        ``parts`` (a hint; the result is the same without it): ``b``'s columns split at these
        bounds into parts, part ``p`` nonzero only in rows ``p*r/P .. (p+1)*r/P`` (a fused projection)."""
        for slot, first, end in lora.segments:
            u = x[first:end] @ a[slot].t()
            y[first:end].addmm_(u, b[slot])

    # --- sampling ---------------------------------------------------------------------
    def argmax_logsumexp(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row of fp32 logits: the index of the first maximum and log(sum(exp))."""
        return torch.argmax(logits, dim=-1), torch.logsumexp(logits, dim=-1)

    def top_k_top_p(self, logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
        return apply_top_k_top_p_min_p(logits, top_k, top_p)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        c, s = cos[..., 0::2], sin[..., 0::2]
        return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin

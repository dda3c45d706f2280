"""An EAGLE or EAGLE-3 head's forward pass over rows of several sequences at once.

Row ``p`` of a sequence pairs the token at position ``p + 1`` with a hidden state of position
``p`` (the target's, or the head's own output for a proposal) and runs at rotary position ``p``,
as in EAGLE and vLLM. Each sequence keeps its keys and values of the head's layers in a
:class:`HeadKV`; the linear layers run once over all rows of the pass, the attention sequence by
sequence. The projections and norms are the target's ops (:mod:`..ops`), the attention is plain
torch with its softmax in fp32.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..models.spec import UnsupportedModel
from ..ops.interface import LinearWeight
from ..ops.reference import split_qkv
from .eagle_weights import HeadConfig, rope_tables


class HeadKV:
    """One sequence's keys and values in the head's layers: a row per position the head has run,
    positions ascending (with a gap where the target's states of some positions never came),
    grown by doubling. Rows from :attr:`length` on are scratch: a proposal's keys and values,
    forgotten when the proposal is made."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device):
        self._shape = (kv_heads, head_dim)
        self._dtype, self._device = dtype, device
        self.k: list[torch.Tensor] = [self._empty(0) for _ in range(layers)]
        self.v: list[torch.Tensor] = [self._empty(0) for _ in range(layers)]
        self.length = 0
        self.positions: list[int] = []
        """The position of each kept row."""

    def _empty(self, rows: int) -> torch.Tensor:
        return torch.empty((rows, *self._shape), dtype=self._dtype, device=self._device)

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` rows in all (the scratch rows written so far move along)."""
        have = self.k[0].shape[0]
        if rows <= have:
            return
        size = max(rows, 2 * have, 16)
        for cache in (self.k, self.v):
            for i, old in enumerate(cache):
                grown = self._empty(size)
                grown[:have] = old
                cache[i] = grown

    def cut(self, position: int) -> None:
        """Forget the rows of ``position`` and after."""
        self.length = bisect.bisect_left(self.positions, position, hi=self.length)
        del self.positions[self.length :]

    def keep(self, positions: list[int]) -> None:
        """The next rows (written already) are kept, at these positions."""
        self.length += len(positions)
        self.positions.extend(positions)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: int, scale: float) -> torch.Tensor:
    """Causal attention of queries ``(n, H, D)``, the rows ``first ..`` of their sequence, over its
    keys and values ``(first + n, KVH, D)`` (query heads grouped over KV heads), in fp32."""
    n, heads = q.shape[0], q.shape[1]
    group = heads // k.shape[1]
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), kf) * scale
    rows = torch.arange(first, first + n, device=q.device)
    cols = torch.arange(k.shape[0], device=q.device)
    scores.masked_fill_(cols[None, :] > rows[:, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vf).to(q.dtype)


@dataclass
class HeadLayer:
    input_norm: torch.Tensor | None
    """None on layer 0 (EAGLE has none there; EAGLE-3 normalises its two inputs apart)."""
    qkv: LinearWeight
    o: LinearWeight
    post_norm: torch.Tensor
    gate_up: LinearWeight
    down: LinearWeight


def _numel(w: LinearWeight | None) -> int:
    return 0 if w is None else w.weight.shape.numel()


class EagleHead:
    def __init__(
        self,
        config: HeadConfig,
        tensors: dict[str, torch.Tensor],
        target: Any,
        device: torch.device,
        dtype: torch.dtype,
        max_len: int,
    ):
        """``target``: the target :class:`~..models.decoder.DecoderModel`, whose ops run the head
        and whose embeddings and LM head stand in for those the head has none of."""
        self.config, self.target, self.ops = config, target, target.ops
        self.device, self.dtype = device, dtype
        self.eagle3 = config.method == "eagle3"

        def w(name: str) -> torch.Tensor:
            return tensors[name].to(device=device, dtype=dtype)

        def maybe(name: str) -> torch.Tensor | None:
            return w(name) if name in tensors else None

        own = tensors.get("embed_tokens.weight")
        self.embed = w("embed_tokens.weight") if own is not None and own.shape[1] == config.hidden_size else None
        """The head's own embeddings; None: the target's."""
        self.fc = self.ops.prepare_linear(w("fc.weight"), maybe("fc.bias")) if "fc.weight" in tensors else None
        reads = len(config.aux_layers) * config.target_hidden_size if self.eagle3 else 2 * config.hidden_size
        if self.fc is not None and tuple(self.fc.weight.shape) != (config.hidden_size, reads):
            raise UnsupportedModel(f"EAGLE head's fc is {tuple(self.fc.weight.shape)}, not {config.hidden_size, reads}")
        self.fc_norms = [w(f"fc_norm.{i}.weight") for i in range(len(config.aux_layers))] if config.fc_norm else []
        self.input_norm = w("input_norm.weight") if config.norm_before_fc else None
        if self.eagle3:
            self.emb_norm = w("layers.0.input_layernorm.weight")
            self.hidden_norm = w("layers.0.hidden_norm.weight")
            self.norm = w("norm.weight")
        self.layers = [self._layer(w, maybe, i) for i in range(config.num_layers)]
        self.lm_head = self.ops.prepare_linear(w("lm_head.weight")) if "lm_head.weight" in tensors else None
        """The head's own LM head (over the draft vocabulary); None: the target's."""
        self.draft_to_target: torch.Tensor | None = None
        """Target id of each draft id (None: the same ids)."""
        if "d2t" in tensors:
            d2t = tensors["d2t"].to(device=device, dtype=torch.long)
            self.draft_to_target = torch.arange(d2t.shape[0], device=device) + d2t
        vocab = target.embed.shape[0]
        rows = vocab if self.lm_head is None else self.lm_head.out_features
        if rows != vocab and (self.draft_to_target is None or self.draft_to_target.shape[0] != rows):
            raise UnsupportedModel(f"EAGLE head's LM head has {rows} rows, the target {vocab}, and no d2t maps them")
        cos, sin = rope_tables(config.raw, config.head_dim, max_len)
        self.cos, self.sin = cos.to(device), sin.to(device)
        self.scale = config.head_dim**-0.5

    def _layer(self, w: Any, maybe: Any, i: int) -> HeadLayer:
        p, a = f"layers.{i}.", f"layers.{i}.self_attn."
        qkv_w = torch.cat([w(a + f"{x}_proj.weight") for x in "qkv"])
        biases = [maybe(a + f"{x}_proj.bias") for x in "qkv"]
        qkv_b = torch.cat(biases) if all(b is not None for b in biases) else None  # type: ignore[arg-type]
        gate_up = torch.cat([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")])
        return HeadLayer(
            input_norm=None if i == 0 else w(p + "input_layernorm.weight"),
            qkv=self.ops.prepare_linear(qkv_w, qkv_b),
            o=self.ops.prepare_linear(w(a + "o_proj.weight"), maybe(a + "o_proj.bias")),
            post_norm=w(p + "post_attention_layernorm.weight"),
            gate_up=self.ops.prepare_gate_up(gate_up),
            down=self.ops.prepare_linear(w(p + "mlp.down_proj.weight")),
        )

    def cost_ratio(self) -> float:
        """The head's weights a proposed token reads, as a share of the target's dense weights
        (its projections and LM head; experts aside)."""
        mine = _numel(self.fc) + _numel(self.lm_head if self.lm_head is not None else self.target.lm_head)
        mine += sum(_numel(x.qkv) + _numel(x.o) + _numel(x.gate_up) + _numel(x.down) for x in self.layers)
        theirs = _numel(self.target.lm_head)
        for x in self.target.layers:
            theirs += _numel(x.qkv) + _numel(x.o) + _numel(x.gate_up) + _numel(x.down)
        return mine / max(theirs, 1)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, weight, self.config.rms_norm_eps)[0]

    def combine(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's hidden states of some positions ``(rows, width)`` as the head's first layer
        reads them ``(rows, hidden_size)``: EAGLE-3's ``fc`` over the layers' streams (after its
        norms, where it has them); EAGLE's as they are. Always a new tensor."""
        x = hidden.to(device=self.device, dtype=self.dtype, copy=True)
        if not self.eagle3 or not self.config.aux_layers:
            return x
        if self.input_norm is not None:
            x = self._rms(x, self.input_norm)
        if self.fc_norms:
            chunks = x.chunk(len(self.fc_norms), dim=-1)
            x = torch.cat([self._rms(c.contiguous(), n) for c, n in zip(chunks, self.fc_norms)], dim=-1)
        return self.ops.linear(x, self.fc)  # type: ignore[arg-type]

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        table = self.target.embed if self.embed is None else self.embed
        return F.embedding(ids, table).to(self.dtype)

    def forward(
        self,
        ids: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        spans: list[tuple[HeadKV, int, int]],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of tokens ``ids`` with hidden states ``hidden`` (as :meth:`combine` gives them) at
        ``positions``: ``spans`` names, in row order, each sequence's cache, the cache row its first
        row's keys and values go to, and its number of rows. Returns ``(the hidden state the next
        row reads, what the LM head reads)`` for every row."""
        ops, cfg = self.ops, self.config
        emb = self.embed_tokens(ids)
        cos, sin = self.cos[positions].to(self.dtype), self.sin[positions].to(self.dtype)
        tokens = ids.shape[0]
        h = hidden
        for i, layer in enumerate(self.layers):
            if i > 0:
                residual, x = h, self._rms(h, layer.input_norm)  # type: ignore[arg-type]
            elif self.eagle3:
                normed = self._rms(h, self.hidden_norm)
                residual = normed if cfg.norm_before_residual else h
                x = torch.cat([self._rms(emb, self.emb_norm), normed], dim=-1)
            else:
                x = ops.linear(torch.cat([emb, h], dim=-1), self.fc)  # type: ignore[arg-type]
                residual = x
            q, k, v = split_qkv(ops.linear(x, layer.qkv), cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
            q, k = ops.rotary(q, k, cos, sin)
            attn = torch.empty_like(q)
            row = 0
            for kv, at, n in spans:
                kv.k[i][at : at + n] = k[row : row + n]
                kv.v[i][at : at + n] = v[row : row + n]
                attn[row : row + n] = attend(q[row : row + n], kv.k[i][: at + n], kv.v[i][: at + n], at, self.scale)
                row += n
            residual = residual + ops.linear(attn.view(tokens, -1), layer.o)
            act = ops.gate_up_swiglu(self._rms(residual, layer.post_norm), layer.gate_up)
            h = residual + ops.linear(act, layer.down)
        if not self.eagle3:
            return h, h
        normed = self._rms(h, self.norm)
        return (normed if cfg.norm_output else h), normed

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """The greedy target token of each row of LM head input ``x``."""
        if self.lm_head is None:
            logits = self.target.ops.linear(x.to(self.target.dtype), self.target.lm_head)
        else:
            logits = self.ops.linear(x, self.lm_head)
        ids = logits.argmax(dim=-1)
        return ids if self.draft_to_target is None else self.draft_to_target[ids]

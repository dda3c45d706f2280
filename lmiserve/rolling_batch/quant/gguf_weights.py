"""A GGUF file's tensors, under Hugging Face names, with the linear layers' blocks kept as they are.

Q4_0, Q4_1 and Q8_0 weights of the linear layers (and of an LM head of its own) become
:class:`~.weights.BlockWeight`; every other tensor, and a linear weight of a type the block
kernels do not run (the K-quants, for one), is dequantized by gguf-py to the model's dtype, and
the types dequantized are named once at start. The token embeddings are dequantized too: a step
reads only its tokens' rows, and an LM head tied to them multiplies the dense table (on a CPU
whose caches hold it, faster than Q8_0 blocks; it is in memory for the lookup anyway).

llama.cpp stores a Llama's query and key rows permuted for its rotary layout (each head's rows
interleaved by halves); they are put back in Hugging Face's order, as transformers does when it
reads the file. Qwen2 and Qwen3 files are stored unpermuted.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from .gguf_index import read_index
from .weights import BlockWeight

log = logging.getLogger("lmiserve.quant")

_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_KINDS = {"Q4_0": "q4_0", "Q4_1": "q4_1", "Q8_0": "q8_0"}
_PERMUTED = {"llama"}
"""Architectures whose query and key rows llama.cpp stores permuted."""
_NAME = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def hf_name(name: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``; None if unknown."""
    m = _NAME.match(name)
    if m:
        part = _LAYER.get(m.group(2))
        return None if part is None else f"model.layers.{m.group(1)}.{part}.{m.group(3)}"
    stem, _, kind = name.rpartition(".")
    return f"{_GLOBAL[stem]}.{kind}" if stem in _GLOBAL else None


def unpermute_rows(rows: int, heads: int) -> torch.Tensor:
    """The row order that undoes llama.cpp's permutation of a query or key weight: HF row
    ``i`` is stored at row ``order[i]``."""
    half = rows // heads // 2
    return torch.arange(rows).reshape(heads, half, 2).transpose(1, 2).reshape(rows)


def read_gguf(
    path: Path, dtype: torch.dtype, blocks: bool = True, embed_blocks: bool = False
) -> dict[str, torch.Tensor | BlockWeight]:
    """Every tensor of the file under its Hugging Face name; linear weights in blocks where
    ``blocks`` and their type allows, else dequantized to ``dtype``; the token embeddings in
    blocks too where ``embed_blocks`` (a tied LM head then runs from them)."""
    from gguf.quants import dequantize

    meta, tensors = read_index(path)
    arch = str(meta.get("general.architecture", ""))
    heads = meta.get(f"{arch}.attention.head_count")
    heads = None if heads is None else int(heads)
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv") or 0) or heads
    out: dict[str, torch.Tensor | BlockWeight] = {}
    dequantized: Counter[str] = Counter()
    for t in tensors:
        name = hf_name(t.name)
        if name is None:
            log.warning("%s: tensor %s is not used", path.name, t.name)
            continue
        kind = t.tensor_type.name
        linear = name.endswith("_proj.weight") or name == "lm_head.weight"
        linear = linear or (embed_blocks and name == "model.embed_tokens.weight")
        order = None
        if arch in _PERMUTED and heads and (".q_proj." in name or ".k_proj." in name):
            order = unpermute_rows(int(t.shape[-1]), heads if ".q_proj." in name else kv_heads)
        if blocks and linear and kind in _BLOCK_KINDS:
            data = torch.from_numpy(np.array(t.data, dtype=np.uint8, copy=True))
            weight = BlockWeight(_BLOCK_KINDS[kind], data, int(t.shape[0]))
            out[name] = weight if order is None else weight.rows(order)
            continue
        if kind in ("F32", "F16", "BF16"):
            array = np.array(t.data, copy=True)
            tensor = (
                torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
                if kind == "BF16"
                else torch.from_numpy(array)
            )
        else:
            dequantized[kind] += 1
            tensor = torch.from_numpy(dequantize(t.data, t.tensor_type).astype(np.float32))
        tensor = tensor.reshape([int(d) for d in reversed(t.shape)])
        if order is not None:
            tensor = tensor[order]
        out[name] = tensor.to(dtype).contiguous()
    if dequantized and blocks:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(dequantized.items()))
        log.info("%s: dequantized at load (types the block kernels do not run): %s", path.name, kinds)
    return out


def block_types(weights: dict[str, torch.Tensor | BlockWeight]) -> str:
    """``q4_1 x210, q8_0 x1``: the block types served, for the start-up line."""
    kinds = Counter(w.kind for w in weights.values() if isinstance(w, BlockWeight))
    return ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items()))

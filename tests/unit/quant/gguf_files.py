"""Tiny GGUF files written the way llama.cpp's converter lays them out, for tests: tensor names,
quantized blocks by gguf-py's own quantizer, a Llama's query and key rows permuted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as GT
from gguf import GGUFWriter
from safetensors.torch import load_file

NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}
KINDS = {"attn": GT.Q4_0, "ffn": GT.Q4_1, "token_embd": GT.Q8_0, "output": GT.Q8_0}


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")  # model.layers.N.<module...>.weight
    return f"blk.{parts[2]}.{NAMES['.'.join(parts[3:-1])]}.{parts[-1]}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's permutation of a query or key weight (its rotary layout)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model_dir: Path, out: Path, arch: str = "llama") -> dict[str, np.ndarray]:
    """``model_dir``'s weights as a GGUF file; returns what each HF weight dequantizes to."""
    from gguf.quants import dequantize, quantize

    config = json.loads((model_dir / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer = GGUFWriter(str(out), arch)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    expected: dict[str, np.ndarray] = {}
    for name, tensor in sorted(load_file(str(model_dir / "model.safetensors")).items()):
        w = tensor.float().numpy()
        target = gguf_name(name)
        permuted = arch == "llama" and (".q_proj." in name or ".k_proj." in name)
        if permuted:
            w = permute(w, heads if ".q_proj." in name else kv_heads)
        kind = next((k for prefix, k in KINDS.items() if prefix in target), None) if w.ndim == 2 else None
        if kind is None:
            writer.add_tensor(target, w)
            stored = w
        else:
            raw = quantize(w, kind)
            writer.add_tensor(target, raw, raw_dtype=kind)
            stored = dequantize(raw, kind)
        if permuted:  # back in the HF order
            inverse = np.argsort(permute(np.arange(w.shape[0]), heads if ".q_proj." in name else kv_heads))
            stored = stored[inverse]
        expected[name] = stored.astype(np.float32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def dense_copy(model_dir: Path, weights: dict[str, np.ndarray], out: Path) -> Path:
    """``model_dir`` with ``weights`` as its safetensors: the dequantized reference model."""
    import shutil

    from safetensors.torch import save_file

    shutil.copytree(model_dir, out)
    save_file({k: torch.from_numpy(v.copy()) for k, v in weights.items()}, str(out / "model.safetensors"))
    return out

"""Writing plain weights quantized in a checkpoint format, laid out as the tools that make such
checkpoints lay them out (AutoAWQ GEMM, AutoGPTQ/GPTQModel v1, llm-compressor's
compressed-tensors), with the ``quantization_config`` they write: for test checkpoints and
``scripts/random_model.py --quantize``.

The packing here is written from each format's description, word by word, apart from the
readers' unpacking, so that writing then reading checks one against the other. Each
``*_tensors`` function returns the module's checkpoint tensors and the weight they stand for
(``(out, in)`` fp32, computed from the integer quants, not from the packed words).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from .onthefly import FP8_MAX, PROJECTION

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""AutoAWQ: nibble ``i`` of a word holds output column ``AWQ_ORDER[i]`` of its eight."""

Module = tuple[dict[str, torch.Tensor], torch.Tensor]


def pack_words(values: torch.Tensor, dim: int, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """Unsigned 4-bit ``values`` eight to an int32 along ``dim``: nibble ``i`` (bits ``4 i`` up)
    of word ``j`` holds element ``8 j + order[i]``."""
    v = values.to(torch.int64).movedim(dim, -1)
    words = torch.zeros(*v.shape[:-1], v.shape[-1] // 8, dtype=torch.int64)
    for i, j in enumerate(order):
        words |= v[..., j::8] << (4 * i)
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32).movedim(-1, dim).contiguous()


def _groups(k: int, group_size: int) -> torch.Tensor:
    return torch.arange(k) // (k if group_size <= 0 else group_size)


def _group_stats(w: torch.Tensor, g_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per ``(out, group)``: the minimum and maximum of the group's weights."""
    groups = int(g_idx.max()) + 1
    if torch.equal(g_idx, torch.arange(w.shape[1]) // (w.shape[1] // groups)):  # contiguous groups
        grouped = w.reshape(w.shape[0], groups, -1)
        return grouped.amin(dim=2), grouped.amax(dim=2)
    lo = torch.stack([w[:, g_idx == g].amin(dim=1) for g in range(groups)], dim=1)
    hi = torch.stack([w[:, g_idx == g].amax(dim=1) for g in range(groups)], dim=1)
    return lo, hi


def awq_tensors(weight: torch.Tensor, group_size: int = 128) -> Module:
    """AutoAWQ GEMM, zero point: ``scale = (max - min) / 15``, ``zero = round(-min / scale)``,
    ``q = clamp(round(w / scale) + zero, 0, 15)``; scales fp16."""
    w = weight.float()
    g = _groups(w.shape[1], group_size)
    lo, hi = _group_stats(w, g)
    scale = ((hi - lo).clamp(min=1e-5) / 15).half().float()  # (out, groups)
    zero = (-lo / scale).round().clamp(0, 15)
    q = ((w / scale[:, g]).round() + zero[:, g]).clamp(0, 15)
    w_hat = (q - zero[:, g]) * scale[:, g]
    tensors = {
        "qweight": pack_words(q.t(), dim=1, order=AWQ_ORDER),  # (in, out / 8)
        "qzeros": pack_words(zero.t(), dim=1, order=AWQ_ORDER),  # (groups, out / 8)
        "scales": scale.t().half().contiguous(),
    }
    return tensors, w_hat


def gptq_tensors(
    weight: torch.Tensor, group_size: int = 128, sym: bool = True, perm: torch.Tensor | None = None
) -> Module:
    """GPTQ v1, 4-bit. Symmetric: ``scale = 2 max|w| / 15``, zero point 8; asymmetric:
    ``scale = (max - min) / 15``, ``zero = round(-min / scale)``. ``perm`` (act-order): the
    order the input rows are grouped in, ``g_idx[perm[j]] = j // group_size``. ``qzeros`` hold
    the zero points minus one."""
    w = weight.float()
    k = w.shape[1]
    g_idx = _groups(k, group_size)
    if perm is not None:
        g_idx = torch.empty_like(g_idx).scatter_(0, perm, _groups(k, group_size))
    lo, hi = _group_stats(w, g_idx)
    if sym:
        amax = torch.maximum(lo.abs(), hi.abs()).clamp(min=1e-5)
        scale = (2 * amax / 15).half().float()
        zero = torch.full_like(scale, 8)
    else:
        scale = ((hi - lo).clamp(min=1e-5) / 15).half().float()
        zero = (-lo / scale).round().clamp(0, 15)
    q = ((w / scale[:, g_idx]).round() + zero[:, g_idx]).clamp(0, 15)
    w_hat = (q - zero[:, g_idx]) * scale[:, g_idx]
    tensors = {
        "qweight": pack_words(q, dim=1).t().contiguous(),  # packed along in, then (in / 8, out)
        "qzeros": pack_words((zero.t() - 1).remainder(16), dim=1),  # (groups, out / 8)
        "scales": scale.t().half().contiguous(),
        "g_idx": g_idx.to(torch.int32),
    }
    return tensors, w_hat


def compressed_int4_tensors(weight: torch.Tensor, group_size: int = 128, symmetric: bool = True) -> Module:
    """compressed-tensors pack-quantized: signed quants -8..7; symmetric ``scale = max|w| / 7.5``,
    asymmetric ``scale = (max - min) / 15``, ``zp = clamp(round(-8 - min / scale), -8, 7)``;
    ``q = clamp(round(w / scale + zp), -8, 7)``. Stored plus 8, packed along the input
    dimension (zero points along the output one); scales in the weight's dtype."""
    w = weight.float()
    out, k = w.shape
    g = _groups(k, group_size)
    lo, hi = _group_stats(w, g)
    if symmetric:
        scale = (torch.maximum(lo.abs(), hi.abs()).clamp(min=1e-5) / 7.5).to(weight.dtype).float()
        zp = torch.zeros_like(scale)
    else:
        scale = ((hi - lo).clamp(min=1e-5) / 15).to(weight.dtype).float()
        zp = (-8 - lo / scale).round().clamp(-8, 7)
    q = (w / scale[:, g] + zp[:, g]).round().clamp(-8, 7)
    w_hat = (q - zp[:, g]) * scale[:, g]
    tensors = {
        "weight_packed": pack_words(q + 8, dim=1),  # (out, in / 8)
        "weight_shape": torch.tensor([out, k]),
        "weight_scale": scale.to(weight.dtype).contiguous(),  # (out, groups)
    }
    if not symmetric:
        tensors["weight_zero_point"] = pack_words(zp + 8, dim=0)  # (out / 8, groups)
    return tensors, w_hat


def fp8_tensors(weight: torch.Tensor, per_channel: bool = True) -> Module:
    """e4m3 with ``scale = amax / 448`` per output channel (``(out, 1)``, compressed-tensors'
    "channel") or per tensor (a scalar, vLLM's ``quant_method: fp8``), fp32."""
    w = weight.float()
    amax = w.abs().amax(dim=1, keepdim=True) if per_channel else w.abs().amax()
    scale = (amax.clamp(min=1e-12) / FP8_MAX).float()
    q = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale": scale}, q.float() * scale


def _ct_config(fmt: str, weights: dict, activations: dict | None) -> dict:
    group = {"targets": ["Linear"], "weights": weights, "input_activations": activations, "output_activations": None}
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {"group_0": {**group, "format": fmt}},
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
    }


def quantization_config(fmt: str, group_size: int = 128, act_order: bool = False) -> dict:
    """The ``quantization_config`` each tool writes for :func:`module_tensors`' formats."""
    if fmt == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm",
                "modules_to_not_convert": None}  # fmt: skip
    if fmt == "gptq":
        return {"quant_method": "gptq", "bits": 4, "group_size": group_size, "desc_act": act_order, "sym": True,
                "checkpoint_format": "gptq", "damp_percent": 0.01, "true_sequential": True, "static_groups": False}  # fmt: skip
    if fmt == "fp8":
        weights = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False}
        activations = {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True}
        return _ct_config("float-quantized", weights, activations)
    if fmt == "fp8-tensor":
        return {"quant_method": "fp8", "activation_scheme": "dynamic"}
    if fmt == "int4":
        weights = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": group_size, "symmetric": True,
                   "dynamic": False, "actorder": None}  # fmt: skip
        return _ct_config("pack-quantized", weights, None)
    raise ValueError(f"unknown format {fmt!r}")


FORMATS = ("awq", "gptq", "fp8", "fp8-tensor", "int4")
"""awq: AutoAWQ GEMM zero point; gptq: GPTQ v1 symmetric (``act_order``: desc_act); fp8:
compressed-tensors float-quantized per channel, dynamic activations; fp8-tensor: ``quant_method``
fp8 per tensor; int4: compressed-tensors pack-quantized symmetric groups."""


def module_tensors(
    fmt: str, weight: torch.Tensor, group_size: int = 128, act_order: bool = False, seed: int = 0
) -> Module:
    if fmt == "awq":
        return awq_tensors(weight, group_size)
    if fmt == "gptq":
        perm = torch.randperm(weight.shape[1], generator=torch.Generator().manual_seed(seed)) if act_order else None
        return gptq_tensors(weight, group_size, sym=True, perm=perm)
    if fmt in ("fp8", "fp8-tensor"):
        return fp8_tensors(weight, per_channel=fmt == "fp8")
    if fmt == "int4":
        return compressed_int4_tensors(weight, group_size)
    raise ValueError(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")


def write_quantized(
    src: Path, out: Path, fmt: str, group_size: int = 128, act_order: bool = False
) -> dict[str, torch.Tensor]:
    """The plain checkpoint ``src`` written to ``out`` (may be ``src``) with its decoder layers'
    projections quantized in ``fmt``. Returns the weights the new checkpoint stands for: the
    plain ones with each projection replaced by its dequantized self (fp32)."""
    from safetensors.torch import load_file, save_file

    src, out = Path(src), Path(out)
    files = sorted(src.glob("*.safetensors"))
    tensors = {name: t for f in files for name, t in load_file(str(f)).items()}
    config = json.loads((src / "config.json").read_text())
    if out != src:
        shutil.copytree(src, out, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.safetensors*"))
    for f in files if out == src else []:
        f.unlink()
    for index in out.glob("*.safetensors.index.json"):
        index.unlink()
    stored: dict[str, torch.Tensor] = {}
    represented: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if PROJECTION.search(name):  # act-order: one permutation per input width, as q, k, v share theirs
            prefix = name[: -len(".weight")]
            parts, w_hat = module_tensors(fmt, t, group_size, act_order, seed=t.shape[1])
            stored.update({f"{prefix}.{suffix}": p for suffix, p in parts.items()})
            represented[name] = w_hat
        else:
            stored[name] = t
            represented[name] = t
    save_file({k: v.contiguous() for k, v in stored.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    config["quantization_config"] = quantization_config(fmt, group_size, act_order)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return represented

"""Which quantization a model's weights are in: a checkpoint's ``quantization_config`` and
``option.quantize``, read into one :class:`CheckpointScheme` (no torch here: the API process
imports this to describe the model).

The ``quantization_config`` of ``config.json``, per ``quant_method``:

- ``awq`` (AutoAWQ): ``bits`` 4, ``group_size``, ``zero_point``, ``version`` ("gemm" is the
  only layout read: GEMV, Marlin and ExLlama checkpoints pack differently), and
  ``modules_to_not_convert``. AutoAWQ writes GEMM checkpoints with zero points only.
- ``gptq`` (AutoGPTQ, GPTQModel): ``bits``, ``group_size`` (-1: one group per output channel),
  ``desc_act`` (act-order: the groups follow ``g_idx``), ``sym``, and ``checkpoint_format``
  (or ``format``): "gptq" is v1, whose ``qzeros`` hold each zero point minus one.
- ``fp8`` (vLLM, transformers' FP8): e4m3 ``weight`` with a per-tensor (or per-channel)
  ``weight_scale``, ``activation_scheme`` "dynamic" or "static" (an ``input_scale`` per
  module). ``weight_block_size`` means 2-D block scales (``weight_scale_inv``).
- ``compressed-tensors`` (llm-compressor): ``format`` (at the top or per config group)
  "float-quantized" (FP8 ``weight`` + ``weight_scale``) or "pack-quantized" (``weight_packed``
  with 8 int4 per int32, ``weight_scale``, ``weight_zero_point`` when asymmetric), one config
  group whose ``targets`` are ``["Linear"]``, and ``ignore`` (modules left dense, e.g.
  ``lm_head``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

SUPPORTED = (
    "awq (AutoAWQ GEMM, 4-bit, with zero points)",
    "gptq (4-bit, v1 checkpoint format, any group size, desc_act)",
    "fp8 (e4m3, per-tensor or per-channel weight scales)",
    "compressed-tensors float-quantized (FP8 e4m3, per-tensor or per-channel)",
    "compressed-tensors pack-quantized (int4, per-group or per-channel, symmetric or not)",
)
"""What :func:`checkpoint_scheme` reads, in the words of the refusals."""


class UnsupportedQuantization(ValueError):
    """A checkpoint quantized in a way the engine does not read."""

    def __init__(self, scheme: str, why: str = ""):
        detail = f": {why}" if why else ""
        super().__init__(
            f"quantization {scheme} is not supported{detail}. Supported checkpoints: {'; '.join(SUPPORTED)}"
        )
        self.scheme = scheme


@dataclass(frozen=True)
class CheckpointScheme:
    """How the linear projections' weights are stored and what the engine makes of them.

    ``method``: the checkpoint's ``quant_method`` ("awq", "gptq", "fp8", "compressed-tensors"),
    or "dense" for a checkpoint of plain weights that ``option.quantize`` quantizes at load.
    ``weights``: the canonical layout they are read into, "int4", "fp8" or (at load) "q8_0".
    ``strategy``: "group", "channel" or "tensor" (the scales' granularity in the checkpoint).
    ``dequantize``: ``option.quantize=none``, every quantized weight made dense at load.
    """

    method: str
    weights: str
    bits: int
    strategy: str = "channel"
    group_size: int = -1
    zero_point: bool = False
    act_order: bool = False
    activations: str = ""
    """FP8: "dynamic" (per token, computed at run time) or "static" (the checkpoint's input_scale)."""
    ignore: tuple[str, ...] = ()
    dequantize: bool = False

    @property
    def on_the_fly(self) -> bool:
        return self.method == "dense"

    def describe(self) -> str:
        """One line for the start-up log and GET /models."""
        if self.weights == "int4":
            group = f"g{self.group_size}" if self.strategy == "group" else "per-channel"
            parts = [self.method, "int4", group, "zero-point" if self.zero_point else "symmetric"]
            if self.act_order:
                parts.append("act-order")
            text = " ".join(parts)
        elif self.weights == "fp8":
            origin = "quantized at load" if self.on_the_fly else self.method
            activations = "static per-tensor" if self.activations == "static" else "dynamic per-token"
            text = f"fp8 e4m3 per-{self.strategy} ({origin}), {activations} activations"
        else:
            text = "int8 q8_0 blocks of 32 (quantized at load)"
        return f"{text}, dequantized at load" if self.dequantize else text


def _refuse_bits(scheme: str, bits: Any, allowed: tuple[int, ...]) -> int:
    if bits not in allowed:
        raise UnsupportedQuantization(f"{scheme} {bits}-bit", f"only {', '.join(map(str, allowed))}-bit is read")
    return int(bits)


def _group(scheme: str, group_size: Any) -> tuple[str, int]:
    size = -1 if group_size in (None, -1, 0) else int(group_size)
    if size == -1:
        return "channel", -1
    if size < 1 or size % 8:
        raise UnsupportedQuantization(f"{scheme} group_size {group_size}", "groups must be a multiple of 8 rows")
    return "group", size


def _awq(q: dict[str, Any]) -> CheckpointScheme:
    version = str(q.get("version", "gemm")).lower()
    if version != "gemm":
        raise UnsupportedQuantization(f"awq version {version!r}", "only AutoAWQ's GEMM layout is read")
    bits = _refuse_bits("awq", q.get("bits", q.get("w_bit")), (4,))
    if not q.get("zero_point", True):
        raise UnsupportedQuantization("awq zero_point=false", "AutoAWQ GEMM checkpoints carry zero points")
    strategy, size = _group("awq", q.get("group_size", q.get("q_group_size", 128)))
    ignore = tuple(q.get("modules_to_not_convert") or ())
    return CheckpointScheme("awq", "int4", bits, strategy, size, zero_point=True, ignore=ignore)


def _gptq(q: dict[str, Any]) -> CheckpointScheme:
    fmt = str(q.get("checkpoint_format") or q.get("format") or "gptq").lower()
    if fmt != "gptq":
        raise UnsupportedQuantization(f"gptq checkpoint_format {fmt!r}", "only the v1 'gptq' format is read")
    bits = _refuse_bits("gptq", q.get("bits"), (4,))
    strategy, size = _group("gptq", q.get("group_size", 128))
    sym = bool(q.get("sym", True))
    act_order = bool(q.get("desc_act", False))
    return CheckpointScheme("gptq", "int4", bits, strategy, size, zero_point=not sym, act_order=act_order)


def _fp8(q: dict[str, Any]) -> CheckpointScheme:
    if q.get("weight_block_size"):
        raise UnsupportedQuantization(
            f"fp8 weight_block_size {q['weight_block_size']}", "block-wise weight scales are not read"
        )
    fmt = str(q.get("fmt", "e4m3")).lower()
    if fmt != "e4m3":
        raise UnsupportedQuantization(f"fp8 fmt {fmt!r}", "only e4m3 weights are read")
    activations = str(q.get("activation_scheme", "dynamic"))
    if activations not in ("dynamic", "static"):
        raise UnsupportedQuantization(f"fp8 activation_scheme {activations!r}")
    ignore = tuple(q.get("ignored_layers") or q.get("modules_to_not_convert") or ())
    return CheckpointScheme("fp8", "fp8", 8, "tensor", activations=activations, ignore=ignore)


def _compressed_tensors(q: dict[str, Any]) -> CheckpointScheme:
    groups = [g for g in (q.get("config_groups") or {}).values() if g.get("weights")]
    if len(groups) != 1:
        raise UnsupportedQuantization(
            f"compressed-tensors with {len(groups)} weight config groups", "exactly one config group is read"
        )
    group = groups[0]
    targets = group.get("targets") or []
    if targets != ["Linear"]:
        raise UnsupportedQuantization(f"compressed-tensors targets {targets}", 'only targets ["Linear"] are read')
    fmt = group.get("format") or q.get("format")
    w = group["weights"]
    kind, bits = w.get("type", "int"), w.get("num_bits")
    strategy = str(w.get("strategy", "tensor"))
    ignore = tuple(q.get("ignore") or ())
    name = f"compressed-tensors {fmt} {kind}{bits} {strategy}"
    if fmt == "float-quantized":
        if kind != "float" or bits != 8 or strategy not in ("tensor", "channel"):
            raise UnsupportedQuantization(name, "FP8 weights with per-tensor or per-channel scales are read")
        act = group.get("input_activations")
        activations = "dynamic" if not act or act.get("dynamic", True) else "static"
        return CheckpointScheme("compressed-tensors", "fp8", 8, strategy, activations=activations, ignore=ignore)
    if fmt == "pack-quantized":
        if kind != "int" or bits != 4 or strategy not in ("group", "channel"):
            raise UnsupportedQuantization(name, "int4 weights with per-group or per-channel scales are read")
        if group.get("input_activations"):
            raise UnsupportedQuantization(name + " with quantized activations")
        size = int(w["group_size"]) if strategy == "group" else -1
        act_order = w.get("actorder") in ("group", "weight", True)
        return CheckpointScheme(
            "compressed-tensors",
            "int4",
            4,
            strategy,
            size,
            zero_point=not w.get("symmetric", True),
            act_order=act_order,
            ignore=ignore,
        )
    raise UnsupportedQuantization(name)


READERS = {"awq": _awq, "gptq": _gptq, "fp8": _fp8, "compressed-tensors": _compressed_tensors}


def checkpoint_scheme(config: dict[str, Any]) -> CheckpointScheme | None:
    """The scheme of a checkpoint's ``config.json`` (None: plain weights)."""
    q = config.get("quantization_config") or config.get("compression_config")
    if not q:
        return None
    method = str(q.get("quant_method", "")).lower()
    if method not in READERS:
        raise UnsupportedQuantization(repr(method) if method else "with no quant_method")
    return READERS[method](q)


ON_THE_FLY = {
    "fp8": CheckpointScheme("dense", "fp8", 8, "channel", activations="dynamic"),
    "int8": CheckpointScheme("dense", "q8_0", 8, "group", 32),
}


def resolve_scheme(config: dict[str, Any], quantize: str | None) -> CheckpointScheme | None:
    """``option.quantize`` applied to a checkpoint's own scheme (None: dense weights, as stored).

    None: the checkpoint's own. "awq"/"gptq": the checkpoint must be in that format. "fp8": an
    FP8 checkpoint as it is, a dense one quantized at load. "int8": a dense checkpoint quantized
    at load to q8_0 blocks. "none": a quantized checkpoint read, then dequantized.
    """
    own = checkpoint_scheme(config)
    if quantize is None:
        return own
    if quantize == "none":
        return None if own is None else replace(own, dequantize=True)
    if quantize in ("awq", "gptq"):
        if own is None or own.method != quantize:
            found = "plain weights" if own is None else own.describe()
            raise ValueError(
                f"option.quantize={quantize} needs a {quantize} checkpoint, this one holds {found}; "
                "leave option.quantize unset to use the checkpoint's own scheme"
            )
        return own
    if quantize in ON_THE_FLY:
        if own is None:
            return ON_THE_FLY[quantize]
        if quantize == "fp8" and own.weights == "fp8":
            return own
        raise ValueError(
            f"option.quantize={quantize} quantizes plain weights at load, this checkpoint is already "
            f"quantized ({own.describe()}); leave option.quantize unset or set it to none"
        )
    raise ValueError(f"option.quantize={quantize!r} is not one of none, awq, gptq, fp8, int8")

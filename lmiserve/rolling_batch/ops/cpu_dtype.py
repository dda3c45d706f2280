"""fp32 or bf16 on a CPU without bf16 arithmetic: whichever runs this model's linear layers faster.

On a CPU with AVX512_BF16 or AMX, bf16 is the answer and nothing is measured. Elsewhere bf16 has
no arithmetic of its own, but a bf16 weight is half the bytes of an fp32 one and decoding reads
every weight at every step, so which format is faster depends on the machine: how fast it reads
memory, how its kernels widen bf16 to fp32 in registers. It is measured at start-up, in well under
a second: the model's linear layers as the engine will run them (:class:`~.cpu.CpuOps`, with its
C++ kernels), at one row and at 16 (a decode step of one stream and of sixteen), in fp32 and in
bf16, over weights of the model's shapes, as many layers as 64 MiB of weights hold (more than
the caches of most CPUs, so the weights come from memory as they do in a step) plus the LM head.
GGUF block layers keep their blocks in either format; only their activations change.

What is not measured: attention, norms and the rest of a step, which take a small share of it at
these sizes, and a prompt's prefill, which is bound by arithmetic (fp32's).
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..quant.weights import BLOCK, BLOCK_BYTES, BlockWeight

log = logging.getLogger("lmiserve.engine")

SAMPLE_BYTES = 64 << 20
"""Bytes of weights sampled (bf16 or blocks): more than the caches of most CPUs."""
ROWS = (1, 16)
REPEATS = 5
MARGIN = 0.95
"""bf16 is chosen when it takes less than this share of fp32's time (ties go to fp32: exact)."""


@dataclass(frozen=True)
class Layer:
    """One linear layer's shape (out, in) and how its weight is stored: ``dense``, or a GGUF
    block kind (``q4_0``, ``q4_1``, ``q8_0``) that stays as it is in either dtype."""

    name: str
    out_features: int
    in_features: int
    kind: str = "dense"


@dataclass(frozen=True)
class Choice:
    dtype: str
    seconds: dict[str, float]
    """Per dtype: the sampled layers at one row plus at 16 rows, per call."""

    def why(self) -> str:
        fp32, bf16 = self.seconds["fp32"], self.seconds["bf16"]
        faster = "faster" if bf16 < fp32 else "slower"
        return (
            f"auto: this CPU has no bf16 arithmetic; measured, bf16 weights widened in registers run the "
            f"model's linear layers in {bf16 * 1e3:.1f} ms against fp32's {fp32 * 1e3:.1f} ms ({faster})"
        )


def model_layers(model_dir: Path, quantize: str | None = None) -> tuple[list[Layer], int, Layer | None]:
    """One decoder layer's linear layers, the number of decoder layers, and the LM head (None
    when the config says nothing of the vocabulary)."""
    from ...model_store import GGUF_SOURCE

    config = json.loads((Path(model_dir) / "config.json").read_text())
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    layers = [
        Layer("qkv_proj", (heads + 2 * kv_heads) * head_dim, hidden),
        Layer("o_proj", hidden, heads * head_dim),
    ]
    inter = config.get("intermediate_size")
    if inter and not config.get("num_local_experts") and not config.get("num_experts"):
        layers += [Layer("gate_up_proj", 2 * int(inter), hidden), Layer("down_proj", hidden, int(inter))]
    head = Layer("lm_head", int(config["vocab_size"]), hidden) if config.get("vocab_size") else None
    source = Path(model_dir) / GGUF_SOURCE
    if source.exists() and quantize != "none":
        layers, head = _gguf_kinds(source, layers, head)
    return layers, int(config["num_hidden_layers"]), head


def _gguf_kinds(source: Path, layers: list[Layer], head: Layer | None) -> tuple[list[Layer], Layer | None]:
    """The kinds the GGUF file stores layer 0's projections (and the LM head) in."""
    from ..quant.gguf_index import read_index

    _, tensors = read_index(source.resolve())
    types = {t.name: t.tensor_type.name.lower() for t in tensors}

    def kind(*names: str) -> str:
        kinds = {types.get(n, "dense") for n in names}
        only = kinds.pop() if len(kinds) == 1 else "dense"
        return only if only in BLOCK_BYTES else "dense"

    parts = {
        "qkv_proj": ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"),
        "o_proj": ("blk.0.attn_output.weight",),
        "gate_up_proj": ("blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"),
        "down_proj": ("blk.0.ffn_down.weight",),
    }
    layers = [Layer(x.name, x.out_features, x.in_features, kind(*parts[x.name])) for x in layers]
    if head is not None and "output.weight" in types:  # a head of its own; a tied one is dense
        head = Layer(head.name, head.out_features, head.in_features, kind("output.weight"))
    return layers, head


def _weight(layer: Layer, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor | BlockWeight:
    if layer.kind == "dense":  # the values do not change the time (no subnormals): a constant
        return torch.full((layer.out_features, layer.in_features), 0.02, dtype=dtype)
    # blocks of random quants under a small valid fp16 scale (and zero minimum for Q4_1)
    blocks = layer.in_features // BLOCK
    raw = torch.randint(0, 256, (layer.out_features, blocks, BLOCK_BYTES[layer.kind]), generator=generator)
    raw = raw.to(torch.uint8)
    scale = torch.tensor([0.01], dtype=torch.float16).view(torch.uint8)
    raw[:, :, 0:2] = scale
    if layer.kind == "q4_1":
        raw[:, :, 2:4] = 0
    return BlockWeight(layer.kind, raw.reshape(layer.out_features, -1).contiguous(), layer.in_features)


def _bf16_bytes(layer: Layer) -> int:
    """The bytes of a layer's weight in bf16 (its blocks' bytes for a GGUF block layer)."""
    if layer.kind == "dense":
        return 2 * layer.out_features * layer.in_features
    return layer.out_features * layer.in_features // BLOCK * BLOCK_BYTES[layer.kind]


def _sample(layers: list[Layer], count: int) -> list[Layer]:
    """As many copies of a decoder layer's linear layers as ``SAMPLE_BYTES`` of bf16 hold (at
    least one, at most ``count``)."""
    per_layer = sum(_bf16_bytes(x) for x in layers) or 1
    copies = max(1, min(count, SAMPLE_BYTES // per_layer))
    return [x for _ in range(copies) for x in layers]


def time_layers(ops, layers: list[Layer], dtype: torch.dtype, rows=ROWS) -> float:  # type: ignore[no-untyped-def]
    """Seconds per call of every layer of ``layers`` in turn, summed over ``rows``: the median
    of ``REPEATS`` runs after one warm-up."""
    generator = torch.Generator().manual_seed(0)
    prepared = [(x, ops.prepare_linear(_weight(x, dtype, generator))) for x in layers]
    total = 0.0
    for m in rows:
        inputs = {x.in_features: torch.randn(m, x.in_features, generator=generator).to(dtype) for x, _ in prepared}
        runs = []
        for _ in range(REPEATS + 1):
            start = time.perf_counter()
            for x, w in prepared:
                ops.linear(inputs[x.in_features], w)
            runs.append(time.perf_counter() - start)
        total += statistics.median(runs[1:])
    return total


def measure(layers: list[Layer], count: int, head: Layer | None, ops=None) -> Choice:  # type: ignore[no-untyped-def]
    """Which of fp32 and bf16 runs these layers faster here (:class:`Choice`)."""
    if ops is None:
        from .cpu import CpuOps

        ops = CpuOps()
    sampled = _sample(layers, count)
    scale = count * len(layers) / len(sampled)
    seconds = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        spent = time_layers(ops, sampled, dtype) * scale
        if head is not None:
            spent += time_layers(ops, [head], dtype)
        seconds[name] = spent
    dtype = "bf16" if seconds["bf16"] < MARGIN * seconds["fp32"] else "fp32"
    return Choice(dtype, seconds)


def measured_dtype(model_dir: Path, quantize: str | None = None) -> tuple[str, str]:
    """The dtype for a model on a CPU without bf16 arithmetic, and why; fp32 where the model's
    shapes cannot be read from its config."""
    try:
        layers, count, head = model_layers(model_dir, quantize)
    except (OSError, KeyError, ValueError) as exc:
        return "fp32", f"auto: this CPU has no bf16 arithmetic (the model's shapes were not measured: {exc})"
    start = time.perf_counter()
    choice = measure(layers, count, head)
    log.info("dtype measured in %.2f s: fp32 %s", time.perf_counter() - start, choice.seconds)
    return choice.dtype, choice.why()

"""fp32 or bf16 on a CPU without bf16 arithmetic, and for a GGUF model its blocks or dense weights:
whichever runs this model's linear layers faster.

On a CPU with AVX512_BF16 or AMX, bf16 and the blocks are the answer and nothing is measured.
Elsewhere bf16 has no arithmetic of its own, but a bf16 weight is half the bytes of an fp32 one and
decoding reads every weight at every step, so which format is faster depends on the machine: how
fast it reads memory, how its kernels widen bf16 to fp32 in registers, how fast its block kernel
turns blocks into weights. It is measured at start-up, in two or three seconds: the model's linear layers
as the engine will run them (:class:`~.cpu.CpuOps`, with its C++ kernels), in fp32 and in bf16,
from the blocks and (for a GGUF model served from its blocks) dequantized, at one row (a decode
step of one stream) and at 8 and 32 rows (decode steps of 8 and 32 streams, which carry the
prompts' chunks too), each over as many layers as 64 MiB of weights hold (more than the caches of
most CPUs, so the weights come from memory as they do in a step) and scaled to the model's layer
count, plus the LM head. (Row counts of prompt chunks alone, 64 and more, are left out: there
fp32's FMAs win where bf16 must be widened first, but they are a small part of serving's time, and
counting them chose fp32 by a hair on an AVX2 machine where bf16 serves 1.6x faster at one stream.)
Dense weights are a candidate only where they take under ``DENSE_MEMORY_SHARE`` of the memory
available.

What is not measured: attention, norms and the rest of a step, which take a small share of it at
these sizes.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..quant.weights import BLOCK, BLOCK_BYTES, BlockWeight

log = logging.getLogger("lmiserve.engine")

SAMPLE_BYTES = 64 << 20
"""Bytes of weights sampled at one row (bf16 or blocks): more than the caches of most CPUs."""
ONE_ROW = 1
MANY_ROWS = (8, 32)
REPEATS = 5
MARGIN = 0.95
"""A candidate other than fp32 from the checkpoint's own format is chosen only when it takes less
than this share of that one's time (ties go to fp32 from the checkpoint: exact)."""
DENSE_MEMORY_SHARE = 0.4
"""Dense weights are a candidate for a GGUF model only where they take less than this share of
the memory available."""


@dataclass(frozen=True)
class Layer:
    """One linear layer's shape (out, in) and how its weight is stored: ``dense``, or a GGUF
    block kind (``q4_0``, ``q4_1``, ``q8_0``) that stays as it is in either dtype."""

    name: str
    out_features: int
    in_features: int
    kind: str = "dense"

    def dense(self) -> Layer:
        return Layer(self.name, self.out_features, self.in_features)


@dataclass(frozen=True)
class Choice:
    dtype: str
    seconds: dict[str, float]
    """Per candidate (``fp32``, ``bf16``, and for a GGUF model ``fp32 dense``, ``bf16 dense``): the
    model's linear layers at one row plus at 8 and 32 rows, seconds."""
    dense: bool = False
    """Serve a GGUF model's weights dequantized (``option.quantize=none``) instead of its blocks."""

    @property
    def name(self) -> str:
        return f"{self.dtype} dense" if self.dense else self.dtype

    def why(self) -> str:
        times = ", ".join(f"{name} {t * 1e3:.1f} ms" for name, t in sorted(self.seconds.items(), key=lambda kv: kv[1]))
        what = f"{self.dtype}, the GGUF weights dequantized at load" if self.dense else self.dtype
        return (
            f"auto: this CPU has no bf16 arithmetic; measured, the model's linear layers (1, 8 and 32 rows) "
            f"take {times}: {what}"
        )


def model_layers(model_dir: Path, quantize: str | None = None) -> tuple[list[Layer], int, Layer | None]:
    """One decoder layer's linear layers, the number of decoder layers, and the LM head (None
    when the config says nothing of the vocabulary)."""
    from ...model_store import GGUF_SOURCE

    config = json.loads((Path(model_dir) / "config.json").read_text())
    config = config.get("text_config") or config  # a vision-language model's language model
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


def random_weight(layer: Layer, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor | BlockWeight:
    """A weight of the layer's shape and kind for timing: a constant dense one, or GGUF blocks of
    random quants (their values do not change the time)."""
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


def sample_layers(
    layers: list[Layer], count: int, as_dense: bool = False, sample_bytes: int = SAMPLE_BYTES
) -> list[Layer]:
    """As many copies of a decoder layer's linear layers as ``sample_bytes`` of bf16 hold (at
    least one, at most ``count``); ``as_dense``: counting block layers as their dense weights, so
    that the blocks and the dense weights are timed over the same copies."""
    per_layer = sum(2 * x.out_features * x.in_features if as_dense else _bf16_bytes(x) for x in layers) or 1
    copies = max(1, min(count, sample_bytes // per_layer))
    return [x for _ in range(copies) for x in layers]


def time_rows(ops, layers: list[Layer], dtype: torch.dtype, rows: tuple[int, ...]) -> dict[int, float]:  # type: ignore[no-untyped-def]
    """Per row count of ``rows``, seconds per call of every layer of ``layers`` in turn: the
    median of ``REPEATS`` runs after one warm-up (the weights prepared once for all)."""
    return time_alternating(ops, [layers], dtype, rows)[0]


def time_alternating(ops, sets: list[list[Layer]], dtype: torch.dtype, rows: tuple[int, ...]) -> list[dict[int, float]]:  # type: ignore[no-untyped-def]
    """:func:`time_rows` of several sets of layers, their runs taking turns at each row count:
    a change in the machine's speed meanwhile (another process's work) falls on every set alike,
    not on the one measured last."""
    generator = torch.Generator().manual_seed(0)
    prepared = [[(x, ops.prepare_linear(random_weight(x, dtype, generator))) for x in layers] for layers in sets]
    seconds: list[dict[int, float]] = [{} for _ in sets]
    features = sorted({x.in_features for layers in sets for x in layers})
    for m in rows:
        inputs = {k: torch.randn(m, k, generator=generator).to(dtype) for k in features}
        runs: list[list[float]] = [[] for _ in sets]
        for _ in range(REPEATS + 1):
            for i, layers in enumerate(prepared):
                start = time.perf_counter()
                for x, w in layers:
                    ops.linear(inputs[x.in_features], w)
                runs[i].append(time.perf_counter() - start)
        for i in range(len(sets)):
            seconds[i][m] = statistics.median(runs[i][1:])
    return seconds


def time_layers(ops, layers: list[Layer], dtype: torch.dtype, rows: int) -> float:  # type: ignore[no-untyped-def]
    """:func:`time_rows` at one row count."""
    return time_rows(ops, layers, dtype, (rows,))[rows]


def model_time(ops, layers: list[Layer], count: int, head: Layer | None, dtype: torch.dtype) -> float:  # type: ignore[no-untyped-def]
    """The model's linear layers at one row and at each of ``MANY_ROWS``, each sampled over
    ``SAMPLE_BYTES`` and scaled to ``count`` decoder layers, plus the head."""
    sampled = sample_layers(layers, count)
    scale = count * len(layers) / len(sampled)
    spent = sum(time_rows(ops, sampled, dtype, (ONE_ROW, *MANY_ROWS)).values()) * scale
    if head is not None:
        spent += sum(time_rows(ops, [head], dtype, (ONE_ROW, *MANY_ROWS)).values())
    return spent


def measure(  # type: ignore[no-untyped-def]
    layers: list[Layer], count: int, head: Layer | None, ops=None, dense_allowed: bool = True
) -> Choice:
    """Which of fp32 and bf16 (and, for block layers, their blocks or dense weights) runs these
    layers fastest here (:class:`Choice`)."""
    if ops is None:
        from .cpu import CpuOps

        ops = CpuOps()
    blocks = any(x.kind != "dense" for x in [*layers, *([head] if head else [])])
    candidates = {"fp32": (torch.float32, False), "bf16": (torch.bfloat16, False)}
    if blocks and dense_allowed:
        candidates |= {"fp32 dense": (torch.float32, True), "bf16 dense": (torch.bfloat16, True)}
    seconds = {}
    for name, (dtype, dense) in candidates.items():
        shapes = [x.dense() for x in layers] if dense else layers
        top = head.dense() if dense and head is not None else head
        seconds[name] = model_time(ops, shapes, count, top, dtype)
    best = min(seconds, key=seconds.__getitem__)
    if seconds[best] >= MARGIN * seconds["fp32"]:
        best = "fp32"
    dtype, dense = candidates[best]
    return Choice("bf16" if dtype == torch.bfloat16 else "fp32", seconds, dense)


def memory_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _dense_bytes(layers: list[Layer], count: int, head: Layer | None) -> int:
    """fp32 bytes of the model's linear weights dequantized (the larger of the two dtypes)."""
    weights = sum(x.out_features * x.in_features for x in layers) * count
    if head is not None:
        weights += head.out_features * head.in_features
    return 4 * weights


def cache_file(layers: list[Layer], count: int, head: Layer | None, dense_allowed: bool, method: object = None) -> Path:
    """Where a measurement of these layers on this CPU, class, thread count, torch, kernel
    sources and bf16 linear tiles (:mod:`.cpu_linear_tiles`) is kept: a restarted engine (after a
    crash, or the next start) reuses it. ``method``: what was measured and how (JSON-able), so
    that a changed measurement is not answered from the cache of another."""
    import hashlib

    from ...cpu_isa import cpu_info, cpu_model_name, isa_class
    from ...model_store import cache_root
    from .cpu_linear_tiles import default_rows
    from .kernel_build import sources_digest

    key = json.dumps(
        [
            [vars(x) for x in layers],
            count,
            vars(head) if head else None,
            dense_allowed,
            isa_class(),
            sorted(cpu_info().features),
            cpu_model_name(),
            torch.get_num_threads(),
            torch.__version__,
            sources_digest(),
            default_rows(),
            method,
        ]
    )
    return cache_root() / "cpu-formats" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def measured_format(model_dir: Path, quantize: str | None = None) -> tuple[Choice | None, str]:
    """The :class:`Choice` for a model on a CPU without bf16 arithmetic, and why (None: fp32,
    where the model's shapes cannot be read from its config). Measured once per model shape and
    machine, then read from the cache."""
    try:
        layers, count, head = model_layers(model_dir, quantize)
    except (OSError, KeyError, ValueError) as exc:
        return None, f"auto: this CPU has no bf16 arithmetic (the model's shapes were not measured: {exc})"
    dense_allowed = quantize is None and _dense_bytes(layers, count, head) < DENSE_MEMORY_SHARE * memory_available()
    cached = cache_file(layers, count, head, dense_allowed, ["dtype", ONE_ROW, MANY_ROWS, SAMPLE_BYTES, MARGIN])
    saved = load_measurement(cached)
    try:
        choice = Choice(saved["dtype"], saved["seconds"], saved["dense"])
        return choice, f"{choice.why()} (measured at an earlier start, {cached})"
    except (ValueError, KeyError, TypeError):
        pass
    from .cpu import CpuOps

    ops = CpuOps()  # builds the kernels where they are not built yet: not part of the measurement
    start = time.perf_counter()
    choice = measure(layers, count, head, ops, dense_allowed=dense_allowed)
    log.info("weights' format measured in %.2f s", time.perf_counter() - start)
    save_measurement(cached, {"dtype": choice.dtype, "dense": choice.dense, "seconds": choice.seconds})
    return choice, choice.why()


def load_measurement(path: Path) -> dict:
    """A measurement kept by :func:`save_measurement` ({} where there is none)."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def save_measurement(path: Path, values: dict) -> None:
    """Keep a measurement for the next start (written whole, then renamed into place)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}")
        partial.write_text(json.dumps(values))
        partial.replace(path)
    except OSError as exc:  # a read-only cache: measured again at the next start
        log.warning("a measurement was not cached (%s)", exc)

"""``lmiserve bench --cpu-report``: how the engine uses this CPU, measured in-process.

The engine is built as ``lmiserve serve`` builds it (the same settings, model and dtype), then:
the machine (CPU, threads, the instruction-set class, the kernels' paths, the dtype and why), its
ceilings (:mod:`~lmiserve.rolling_batch.ops.cpu_ceilings`), and for each concurrency ``c`` the
decode steps of ``c`` random prompts: step time, tokens/s, each op's share of a step (torch's
profiler, self CPU time) and the weight bytes a step reads against the memory ceiling; last, a
prompt's prefill against the matrix-product ceiling, and its ops' shares.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from ..rolling_batch.core.engine import Engine
from ..rolling_batch.ops.interface import ExpertWeights, LinearWeight
from ..wire import SamplingParams

MATMUL = re.compile(r"^(aten|mkldnn)::\w*(mm|linear|matmul)")
"""torch's matrix products (``aten::addmm``, ``aten::mm``, ``mkldnn::_linear_pointwise``...)."""
OTHER = "other (torch ops and Python)"
TOP = 8
"""Op lines printed per level (the JSON has them all)."""
COUNTED = (
    "every weight a decode step reads: the decoder layers' linear weights (dense: their tensors' bytes; "
    "GGUF blocks: the blocks' bytes; other quantized formats: their tensors'), biases and norms, the final "
    "norm and the LM head (a tied head: the embedding table, read whole for the logits); not the token "
    "embeddings' lookup (a few rows a step)"
)


# --- what a step reads ----------------------------------------------------------------------
def linear_bytes(w: LinearWeight) -> int:
    """The bytes of a prepared linear weight, as its kernel reads them."""
    bias = 0 if w.bias is None else w.bias.nbytes
    if w.packing.startswith("gguf-"):
        return w.packed.nbytes + bias  # repacked blocks, as the kernel reads them
    if w.quant is not None:
        return weight_bytes(w.quant) + bias
    return w.weight.nbytes + bias


def weight_bytes(obj: Any) -> int:
    """The bytes of the weights in ``obj``: a tensor, a prepared weight, or a dataclass / list of them
    (a packed copy of a weight, or a field that is another field's tensor, is not counted again)."""
    if isinstance(obj, torch.Tensor):
        return 0 if obj.is_meta else obj.nbytes
    if isinstance(obj, LinearWeight):
        return linear_bytes(obj)
    if isinstance(obj, ExpertWeights):
        return weight_bytes(obj.w13) + weight_bytes(obj.w2)
    if isinstance(obj, (list, tuple)):
        return sum(weight_bytes(x) for x in obj)
    if dataclasses.is_dataclass(obj):
        # by identity: a field that names another field's tensor (a layer's MLP norm that is its
        # post-attention norm) is read once
        fields = {id(v): v for v in (getattr(obj, f.name) for f in dataclasses.fields(obj) if f.name != "packed")}
        return sum(weight_bytes(v) for v in fields.values())
    return 0


def step_bytes(model: Any) -> int:
    """The weight bytes a decode step reads (:data:`COUNTED`)."""
    head = model.lm_head
    return weight_bytes(model.layers) + weight_bytes(model.norm) + (0 if head is None else linear_bytes(head))


def linears(obj: Any) -> list[LinearWeight]:
    if isinstance(obj, LinearWeight):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [w for x in obj for w in linears(x)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, torch.Tensor):
        return [w for f in dataclasses.fields(obj) for w in linears(getattr(obj, f.name))]
    return []


# --- the machine --------------------------------------------------------------------------
def machine(engine: Engine, why: str) -> dict[str, Any]:
    from ..cpu_isa import cpu_model_name, describe, is_forced, isa_class
    from ..rolling_batch.ops.cpu_kernels import amx_tiles, load_kernels

    info: dict[str, Any] = {
        "cpu": cpu_model_name(),
        "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg()[0],
        "isa_class": isa_class(),
        "isa_forced": is_forced(),
        "isa": describe(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "kernels": load_kernels(),
        "dtype": engine.config.dtype,
        "dtype_why": why,
    }
    if info["kernels"]:
        ops = torch.ops.lmiserve_cpu
        info["quant_linear_isa"] = str(ops.quant_linear_isa())
        info["linear_bf16_supported"] = bool(ops.linear_bf16_supported())
        if hasattr(ops, "linear_bf16_isa"):
            info["linear_bf16_isa"] = str(ops.linear_bf16_isa())
            info["linear_fma_rows"] = int(ops.linear_bf16_fma_rows())
        info["amx_tiles"] = amx_tiles()
    model = engine.runner.model
    counts = Counter(w.packing or "dense" for w in linears(model.layers) + linears([model.lm_head]))
    info["linear_packings"] = dict(counts)
    return info


# --- decode steps ---------------------------------------------------------------------------
def _prompts(n: int, length: int, vocab: int, rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(n)]


def _drain(engine: Engine, ids: list[str]) -> None:
    for rid in ids:
        engine.abort(rid)
    while engine.has_work():
        engine.step()


def _timed_steps(engine: Engine, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return times


def op_shares(events: Any, total_us: float) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Per op (self CPU time of ``key_averages()``) its share of ``total_us``: the C++ kernels and
    torch's matrix products each on a line, the rest of torch's ops and the Python between them on
    one (step time less every op's self time)."""
    lines, other_ops = [], 0.0
    for e in events:
        if e.key.startswith("lmiserve_cpu::") or MATMUL.match(e.key):
            lines.append({"op": e.key, "share": e.self_cpu_time_total / total_us, "calls": e.count})
        else:
            other_ops += e.self_cpu_time_total / total_us
    lines.sort(key=lambda x: -x["share"])
    named = sum(x["share"] for x in lines)
    python = max(0.0, 1.0 - named - other_ops)
    other = {"share": max(0.0, 1.0 - named), "torch_ops": other_ops, "python": python}
    return lines, other


def decode_level(engine: Engine, c: int, prompt_tokens: int, steps: int, rng: random.Random) -> dict[str, Any]:
    """``c`` requests decoding together: ``steps`` timed steps, then ``steps`` profiled ones."""
    from torch.profiler import ProfilerActivity, profile

    ids = [f"c{c}-{i}-{rng.randrange(10**9)}" for i in range(c)]
    params = SamplingParams(max_new_tokens=engine.max_model_len - prompt_tokens, ignore_eos=True)
    for rid, prompt in zip(ids, _prompts(c, prompt_tokens, engine.spec.vocab_size, rng)):
        engine.add_request(rid, prompt, params)
    while any(s.num_generated < 1 for rid in ids for s in engine.groups[rid].sequences):
        engine.step()
    _timed_steps(engine, 2)  # warm-up at this batch size
    times = _timed_steps(engine, steps)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        profiled = _timed_steps(engine, steps)
    _drain(engine, ids)
    step_s = statistics.median(times)
    lines, other = op_shares(prof.key_averages(), sum(profiled) * 1e6)
    return {
        "concurrency": c,
        "step_s": step_s,
        "profiled_step_s": statistics.median(profiled),
        "tokens_per_s": c / step_s,
        "ops": lines,
        "other": other,
    }


def prefill(engine: Engine, prompt_tokens: int, rng: random.Random, tries: int = 3) -> dict[str, Any]:
    """One prompt alone: its first step's time (median of ``tries`` after a warm-up), the prompt
    tokens that step ran (the whole prompt unless the step budget chunks it), and each op's share
    of ``tries`` more such steps, profiled."""
    from torch.profiler import ProfilerActivity, profile

    def first_step(i: int) -> tuple[float, int]:
        rid = f"prefill-{i}-{rng.randrange(10**9)}"
        engine.add_request(rid, _prompts(1, prompt_tokens, engine.spec.vocab_size, rng)[0], SamplingParams())
        before = engine.prompt_tokens
        start = time.perf_counter()
        engine.step()
        took = (time.perf_counter() - start, engine.prompt_tokens - before)
        _drain(engine, [rid])
        return took

    runs = [first_step(i) for i in range(tries + 1)]
    seconds, tokens = statistics.median(runs[1:])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        profiled = [first_step(tries + 1 + i)[0] for i in range(tries)]
    lines, other = op_shares(prof.key_averages(), sum(profiled) * 1e6)
    return {"seconds": seconds, "tokens": tokens, "ops": lines, "other": other}


# --- the report -----------------------------------------------------------------------------
def cpu_report(engine: Engine, why: str, levels: list[int], prompt_tokens: int, steps: int) -> dict[str, Any]:
    from ..rolling_batch.ops.cpu_ceilings import measure

    rng = random.Random()  # prompts of their own each run: no prefix-cache hits
    model = engine.runner.model
    report: dict[str, Any] = {"machine": machine(engine, why)}
    ceilings = measure()
    report["ceilings"] = {"read_bytes_per_s": ceilings.read_bytes_per_s, "flops": ceilings.flops}
    read = step_bytes(model)
    report["step_bytes"] = {"bytes": read, "counted": COUNTED}
    report["decode"] = []
    for c in levels:
        row = decode_level(engine, c, prompt_tokens, steps, rng)
        row["read_bytes_per_s"] = read / row["step_s"]
        row["read_ceiling_share"] = row["read_bytes_per_s"] / ceilings.read_bytes_per_s
        report["decode"].append(row)
    elements = sum(w.weight.numel() for w in linears(model.layers))
    pre = prefill(engine, prompt_tokens, rng)
    pre["linear_elements"] = elements
    pre["flops"] = 2 * elements * pre["tokens"] / pre["seconds"]
    ceiling = ceilings.flops.get(engine.config.dtype, ceilings.flops["fp32"])
    if engine.config.dtype == "bf16":  # bf16 weights widened for FMAs run at fp32's rate
        ceiling = max(ceiling, ceilings.flops["fp32"])
    pre["ceiling_share"] = pre["flops"] / ceiling
    report["prefill"] = pre
    report["machine"]["load_average_end"] = os.getloadavg()[0]  # other processes' share of the CPU
    return report


def render(r: dict[str, Any]) -> str:
    m = r["machine"]
    out = [
        f"CPU: {m['cpu']}; torch threads {m['torch_threads']}; load average {m['load_average']:.2f} at the start, "
        f"{m['load_average_end']:.2f} at the end",
        f"{m['isa']}; torch CPU capability {m['torch_cpu_capability']}",
    ]
    if m["kernels"]:
        paths = f"quant_linear {m['quant_linear_isa']}, linear_bf16 supported {m['linear_bf16_supported']}"
        if "linear_bf16_isa" in m:
            paths += f" ({m['linear_bf16_isa']}"
            if m["linear_bf16_isa"] == "avx512_bf16":
                rows = m.get("linear_fma_rows", 0)
                paths += f"; FMA tiles from {rows} rows" if rows else "; vdpbf16ps only"
            paths += ")"
        out.append(f"kernels: {paths}, AMX tiles {'in use' if m['amx_tiles'] else 'not in use'}")
    else:
        out.append("kernels: not built (the reference ops run)")
    out.append(f"linear weights: {', '.join(f'{k} x{v}' for k, v in m['linear_packings'].items())}")
    out.append(f"dtype {m['dtype']}: {m['dtype_why']}")
    ceil = r["ceilings"]
    flops = ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in ceil["flops"].items())
    out.append(f"ceilings: memory reads {ceil['read_bytes_per_s'] / 1e9:.1f} GB/s; matrix products {flops}")
    out.append(f"a decode step reads {r['step_bytes']['bytes'] / 1e6:.1f} MB of weights")
    for row in r["decode"]:
        out.append(
            f"\nconcurrency {row['concurrency']}: step {row['step_s'] * 1e3:.2f} ms (profiled "
            f"{row['profiled_step_s'] * 1e3:.2f}), {row['tokens_per_s']:.1f} tok/s, weights read at "
            f"{row['read_bytes_per_s'] / 1e9:.1f} GB/s = {row['read_ceiling_share']:.0%} of the ceiling"
        )
        out += _op_lines(row)
    p = r["prefill"]
    out.append(
        f"\nprefill of {p['tokens']} tokens: {p['seconds'] * 1e3:.1f} ms, {p['flops'] / 1e9:.1f} GFLOP/s "
        f"= {p['ceiling_share']:.0%} of the matrix-product ceiling (linear layers only; for bf16 the higher "
        "of bf16's and fp32's: bf16 weights can be widened for fp32 FMAs)"
    )
    if "ops" in p:
        out += _op_lines(p)
    return "\n".join(out)


def _op_lines(row: dict[str, Any]) -> list[str]:
    """A step's ops, the largest shares first, then the rest, torch's other ops and Python."""
    out = [f"  {line['share']:6.1%}  {line['op']} ({line['calls']} calls)" for line in row["ops"][:TOP]]
    if len(row["ops"]) > TOP:
        rest = row["ops"][TOP:]
        out.append(f"  {sum(x['share'] for x in rest):6.1%}  {len(rest)} more kernels and matrix products")
    o = row["other"]
    out.append(f"  {o['share']:6.1%}  {OTHER}: torch ops {o['torch_ops']:.1%}, Python {o['python']:.1%}")
    return out


def run(args: Any) -> int:
    from ..config import load_settings
    from ..model_store import resolve_model
    from ..rolling_batch.engine_config import engine_options
    from ..rolling_batch.runner.placement import placed_config

    settings = load_settings(args.model_dir)
    path = resolve_model(settings.model.model_id, settings.model_dir)
    config, why = placed_config(str(path), engine_options(settings.model, settings.engine))
    if config.device != "cpu":
        raise SystemExit(f"--cpu-report measures the CPU; this model's device is {config.device}")
    levels = [int(c) for c in (args.concurrency or "1,8,32").split(",") if c.strip()]
    config.max_num_seqs = max(config.max_num_seqs, *levels)
    engine = Engine(config)
    try:
        report = cpu_report(engine, why, levels, args.prompt_tokens, args.steps)
    finally:
        engine.close()
    report["config"] = {"model": str(path), "prompt_tokens": args.prompt_tokens, "steps": args.steps}
    print(render(report))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu-report.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"\nwrote {out / 'cpu-report.json'}")
    return 0

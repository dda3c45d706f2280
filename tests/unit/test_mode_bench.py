"""scripts/mode_bench.py: the servers it starts for each mode, and its table of ratios."""

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from lmiserve.cpu_isa import CpuIsaError, cpu_info

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mode_bench.py"
spec = importlib.util.spec_from_file_location("mode_bench", SCRIPT)
mode_bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mode_bench)


def _args(**kw):
    base = {"dtype": "bf16", "device": "cuda:0", "max_batch": 256}
    return argparse.Namespace(**{**base, **kw})


def test_each_mode_serves_the_same_model_with_its_own_setting():
    model = Path("/m")
    default = mode_bench._props(_args(), model, "default")
    assert "option.model_id=/m" in default and "option.max_rolling_batch_size=256" in default
    assert mode_bench._props(_args(), model, "deterministic") == default + ["option.deterministic=true"]
    lora = mode_bench._props(_args(), model, "lora16")
    assert lora[: len(default)] == default
    assert lora[len(default) :] == ["option.enable_lora=true", "option.max_loras=16", "option.max_lora_rank=16"]
    assert not any("model_id" in line for line in mode_bench._props(_args(max_batch=0), None, "default"))
    assert not any("max_rolling" in line for line in mode_bench._props(_args(max_batch=0), None, "default"))


def _report(levels):
    return {
        "server": [
            {
                "concurrency": c,
                "output_tokens_per_s": tps,
                "ttft_s": {"p50": ttft / 2, "p99": ttft},
                "itl_s": {"p50": ttft / 10, "p99": ttft / 5},
            }
            for c, (tps, ttft) in levels.items()
        ]
    }


def test_the_table_gives_each_mode_as_a_ratio_to_the_default_server():
    text = mode_bench.table(
        {
            "default": _report({1: (100.0, 0.05), 32: (1000.0, 0.2)}),
            "deterministic": _report({1: (90.0, 0.06), 32: (850.0, 0.3)}),
        }
    ).splitlines()
    assert text[0] == (
        "| mode | c=1 tok/s | c=32 tok/s | TTFT p99 c=1 | TTFT p99 c=32 | ITL p50 / p99 c=1 | ITL p50 / p99 c=32 |"
    )
    assert text[2] == "| default | 100.0 | 1000.0 | 50 ms | 200 ms | 5 / 10 ms | 20 / 40 ms |"
    assert text[3] == (
        "| deterministic | 90.0 (0.90x) | 850.0 (0.85x) | 60 ms (1.20x) | 300 ms (1.50x) | 6 / 12 ms | 30 / 60 ms |"
    )


def test_quantized_modes_and_a_chosen_base():
    model = Path("/m")
    default = mode_bench._props(_args(), model, "default")
    assert mode_bench._props(_args(), model, "quantize-int8") == default + ["option.quantize=int8"]
    text = mode_bench.table(
        {"quantize-none": _report({1: (80.0, 0.05)}), "default": _report({1: (100.0, 0.04)})}, "quantize-none"
    ).splitlines()
    assert text[2] == "| quantize-none | 80.0 | 50 ms | 5 / 10 ms |"
    assert text[3] == "| default | 100.0 (1.25x) | 40 ms (0.80x) | 4 / 8 ms |"
    assert set(mode_bench.CHECKPOINTS) == {"awq", "gptq", "fp8-checkpoint"}


def test_an_isa_mode_forces_the_class_and_the_peer_serves_the_same_weights(tmp_path):
    args = _args(device="cpu", port=8095, peers="/peers")
    cmd, env, url = mode_bench.server_command(args, tmp_path, Path("/m"), "isa-avx2")
    assert env["LMISERVE_CPU_ISA"] == "avx2" and url == "http://127.0.0.1:8095"
    assert cmd[1:4] == ["-m", "lmiserve", "serve"]
    cmd, env, url = mode_bench.server_command(args, tmp_path, Path("/m"), "vllm")
    assert cmd == ["bash", "/peers/serve_vllm_tuned.sh", "bfloat16"] and env["MODEL_DIR"] == "/m"
    assert url == "http://127.0.0.1:8002"


def test_a_held_peer_runs_with_torch_and_its_own_probes_at_the_class(tmp_path):
    cpu = cpu_info()
    if "avx2" not in cpu.classes[: cpu.classes.index(cpu.detected)]:
        pytest.skip("needs an x86 CPU above AVX2")
    args = _args(device="cpu", port=8095, peers="/peers")
    cmd, env, url = mode_bench.server_command(args, tmp_path, Path("/m"), "vllm-avx2")
    assert cmd == ["bash", "/peers/serve_vllm_tuned.sh", "bfloat16"] and url == "http://127.0.0.1:8002"
    assert (env["ATEN_CPU_CAPABILITY"], env["ONEDNN_MAX_CPU_ISA"], env["MKL_ENABLE_INSTRUCTIONS"]) == (
        "avx2",
        "AVX2",
        "AVX2",
    )
    probe = "import torch; print([f() for f in (torch.cpu._is_avx512_supported, torch.cpu._is_amx_tile_supported)])"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[False, False]"
    native = mode_bench.held_peer_env(cpu.detected, tmp_path)
    assert native == {}
    with pytest.raises(CpuIsaError, match="not a CPU class"):
        mode_bench.held_peer_env("avx9", tmp_path)

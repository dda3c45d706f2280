"""The CPU class: detected from /proc/cpuinfo texts of real CPUs, forced by LMISERVE_CPU_ISA (never
above what the CPU has), and what a forced class sets for torch's and oneDNN's dispatch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lmiserve import cpu_isa
from lmiserve.cpu_isa import CpuIsaError, choose, cpu_info, parse_cpuinfo, requested, torch_env

_BASE = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht"
_X86_AVX2 = _BASE + " pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand bmi1 avx2 bmi2"
_AVX512 = " avx512f avx512dq avx512cd avx512bw avx512vl"
CPUS = {
    # Skylake-SP (c5): AVX-512 without bf16
    "skylake": ("x86_64", _X86_AVX2 + _AVX512 + " clwb avx512_vnni", "avx512"),
    # Zen 3 (c6a): AVX2, no AVX-512
    "zen3": ("x86_64", _X86_AVX2 + " sha_ni clzero vaes vpclmulqdq", "avx2"),
    # Zen 4 / Genoa (c7a): AVX-512 with bf16, no AMX
    "genoa": ("x86_64", _X86_AVX2 + _AVX512 + " avx512ifma avx512_vbmi2 avx512_vnni avx512_bf16", "avx512_bf16"),
    # Sapphire Rapids (c7i): AMX
    "sapphire_rapids": (
        "x86_64",
        _X86_AVX2 + _AVX512 + " avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8",
        "amx",
    ),
    # an x86-64 without AVX2 (Sandy Bridge)
    "sandy_bridge": ("x86_64", _BASE + " pni ssse3 sse4_1 sse4_2 popcnt aes xsave avx", "portable"),
    # Graviton 3 (c7g): Neon with bf16, and SVE
    "graviton3": (
        "aarch64",
        "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc"
        " dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs paca pacg dcpodp"
        " svei8mm svebf16 i8mm bf16 dgh rng",
        "neon_bf16",
    ),
    # Graviton 2 (c6g): Neon without bf16
    "graviton2": (
        "aarch64",
        "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs",
        "neon",
    ),
}


def cpuinfo(machine: str, features: str) -> str:
    if machine == "x86_64":
        return f"processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: a CPU\nflags\t\t: {features}\nbugs\t\t: spectre_v1\n\n"
    return f"processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: {features}\nCPU implementer\t: 0x41\n\n"


@pytest.mark.parametrize("name", sorted(CPUS))
def test_detected_class(name: str) -> None:
    machine, features, want = CPUS[name]
    cpu = parse_cpuinfo(cpuinfo(machine, features), machine)
    assert cpu.detected == want
    assert cpu.sve == (name == "graviton3")


def test_unknown_machine_and_empty_text_are_portable() -> None:
    assert parse_cpuinfo("", "x86_64").detected == "portable"
    assert parse_cpuinfo(cpuinfo("x86_64", CPUS["sapphire_rapids"][1]), "riscv64").detected == "portable"


def _cpu(name: str):  # type: ignore[no-untyped-def]
    machine, features, _ = CPUS[name]
    return parse_cpuinfo(cpuinfo(machine, features), machine)


def test_a_lower_class_can_be_forced() -> None:
    spr = _cpu("sapphire_rapids")
    assert [choose(c, spr) for c in cpu_isa.X86_CLASSES] == list(cpu_isa.X86_CLASSES)
    assert choose(None, spr) == "amx"
    assert choose("neon", _cpu("graviton3")) == "neon"


@pytest.mark.parametrize(
    "name, wanted",
    [("zen3", "avx512"), ("skylake", "avx512_bf16"), ("genoa", "amx"), ("graviton2", "neon_bf16"), ("zen3", "neon")],
)
def test_forcing_a_class_the_cpu_lacks_is_refused(name: str, wanted: str) -> None:
    with pytest.raises(CpuIsaError, match=f"LMISERVE_CPU_ISA={wanted}: this CPU does not have it.*{CPUS[name][2]}"):
        choose(wanted, _cpu(name))


def test_an_unknown_class_is_refused() -> None:
    with pytest.raises(CpuIsaError, match="not a CPU class"):
        choose("sse9", _cpu("zen3"))


def test_the_environment() -> None:
    assert requested({}) is None
    assert requested({"LMISERVE_CPU_ISA": "native"}) is None
    assert requested({"LMISERVE_CPU_ISA": "AVX2"}) == "avx2"
    # the older switch is a synonym of the portable class; LMISERVE_CPU_ISA, where set, wins
    assert requested({"LMISERVE_PORTABLE_KERNELS": "1"}) == "portable"
    assert requested({"LMISERVE_PORTABLE_KERNELS": "0"}) is None
    assert requested({"LMISERVE_PORTABLE_KERNELS": "1", "LMISERVE_CPU_ISA": "avx2"}) == "avx2"


def test_torch_and_onednn_follow_a_forced_class() -> None:
    spr = _cpu("sapphire_rapids")
    assert torch_env("amx", spr) == {}
    assert torch_env("avx2", spr) == {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    }
    assert torch_env("avx512", spr) == {
        "ATEN_CPU_CAPABILITY": "avx512",
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
    }
    assert torch_env("avx512_bf16", spr)["ONEDNN_MAX_CPU_ISA"] == "AVX512_CORE_BF16"
    assert torch_env("portable", spr) == {
        "ATEN_CPU_CAPABILITY": "default",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    }
    assert torch_env("portable", _cpu("graviton3")) == {"ATEN_CPU_CAPABILITY": "default"}


def test_apply_sets_what_is_not_set_already() -> None:
    lower = cpu_info().classes[0]
    if cpu_info().detected == lower:
        pytest.skip("this CPU has only the portable class")
    env = {"LMISERVE_CPU_ISA": lower, "ONEDNN_MAX_CPU_ISA": "AVX"}
    applied = cpu_isa.apply_torch_env(env)
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX" and "ONEDNN_MAX_CPU_ISA" not in applied
    assert env["ATEN_CPU_CAPABILITY"] == "default"
    assert cpu_isa.apply_torch_env({}) == {}


def test_each_class_has_compile_flags() -> None:
    assert set(cpu_isa.COMPILE_FLAGS) == set(cpu_isa.X86_CLASSES) | set(cpu_isa.ARM_CLASSES)
    # each x86 class's flags include the class below it
    flags = [set(cpu_isa.COMPILE_FLAGS[c]) for c in cpu_isa.X86_CLASSES]
    assert all(a < b for a, b in zip(flags, flags[1:], strict=False))


@pytest.mark.skipif(
    "avx2" not in cpu_info().classes[1 : cpu_info().classes.index(cpu_info().detected)],
    reason="this CPU has no class above avx2",
)
def test_torch_reports_the_forced_class() -> None:
    """In a process started with LMISERVE_CPU_ISA=avx2 on a CPU above it, the lmiserve command's
    start-up holds torch to AVX2."""
    code = (
        "from lmiserve.cpu_isa import apply_torch_env; apply_torch_env(); import torch;"
        "print(torch.backends.cpu.get_cpu_capability())"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
    }
    env["LMISERVE_CPU_ISA"] = "avx2"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "AVX2"


def test_the_command_refuses_a_class_the_cpu_lacks() -> None:
    missing = next((c for c in ("neon", "avx2") if c not in cpu_info().classes), None)
    assert missing is not None
    env = {**os.environ, "LMISERVE_CPU_ISA": missing}
    out = subprocess.run(
        [sys.executable, "-m", "lmiserve", "config", "show", "--model-dir", "/nonexistent"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert f"LMISERVE_CPU_ISA={missing}: this CPU does not have it" in out.stderr


def test_this_process_follows_the_class_in_use() -> None:
    """Under a forced class (``LMISERVE_CPU_ISA=avx2 pytest ...``) torch's kernels in the test
    process are held to it: the conftest sets the variables before torch is imported."""
    import torch

    aten = torch_env(cpu_isa.isa_class(), cpu_info()).get("ATEN_CPU_CAPABILITY")
    if aten is None or os.environ.get("ATEN_CPU_CAPABILITY") != aten:
        pytest.skip("no class forced below this CPU's (or ATEN_CPU_CAPABILITY set by hand)")
    assert torch.backends.cpu.get_cpu_capability().lower() == aten

"""The CPU's instruction-set class: which one this CPU has, which one is used, and what that means
for the C++ kernels' compile flags and for torch's and oneDNN's own dispatch.

The classes are ordered, each a superset of the one before it:

- x86: ``portable`` < ``avx2`` < ``avx512`` (AVX-512 F/BW/VL/DQ) < ``avx512_bf16`` < ``amx``
  (AMX tiles with bf16, over AVX512_BF16);
- Arm (aarch64): ``portable`` < ``neon`` (Advanced SIMD) < ``neon_bf16`` (with the bf16
  instructions); SVE is noted where the CPU has it, but no class needs it.

The class in use is the CPU's (detected from ``/proc/cpuinfo``) unless ``LMISERVE_CPU_ISA`` names
one (``native`` or unset: the detected one); a lower class of the same family can be forced, so
that the code paths of an older CPU run, and are tested, on a newer one; a class the CPU lacks is
refused. ``LMISERVE_PORTABLE_KERNELS=1`` is a synonym of ``LMISERVE_CPU_ISA=portable``.

Only the standard library: this is read before torch is imported.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

ENV = "LMISERVE_CPU_ISA"
PORTABLE_ENV = "LMISERVE_PORTABLE_KERNELS"

X86_CLASSES = ("portable", "avx2", "avx512", "avx512_bf16", "amx")
ARM_CLASSES = ("portable", "neon", "neon_bf16")

_AVX2 = ["-mavx2", "-mfma", "-mf16c", "-mbmi2"]
_AVX512 = [*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"]
_AVX512_BF16 = [*_AVX512, "-mavx512bf16"]
COMPILE_FLAGS: dict[str, list[str]] = {
    "portable": [],
    "avx2": _AVX2,
    "avx512": _AVX512,
    "avx512_bf16": _AVX512_BF16,
    "amx": [*_AVX512_BF16, "-mamx-tile", "-mamx-bf16", "-mamx-int8"],
    "neon": ["-march=armv8-a+simd"],
    "neon_bf16": ["-march=armv8.2-a+bf16+fp16"],
}
"""The dispatch table: the compiler flags each class's build of the C++ kernels is made with (the
sources choose their code paths from the macros these define: ``__AVX2__``, ``__AVX512F__``,
``__AVX512BF16__``, ``__AMX_TILE__``...)."""

# what each x86 class needs in /proc/cpuinfo's flags, on top of the class below it
_X86_NEEDS = {
    "avx2": {"avx2", "fma", "f16c", "bmi2"},
    "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"},
    "avx512_bf16": {"avx512_bf16"},
    "amx": {"amx_tile", "amx_bf16"},
}
_ARM_NEEDS = {"neon": {"asimd"}, "neon_bf16": {"bf16"}}

# torch's (ATen's) and oneDNN's own names for the level a forced class holds them to
_ATEN = {"portable": "default", "avx2": "avx2", "avx512": "avx512", "avx512_bf16": "avx512", "amx": "avx512"}
_MKL = {"portable": "SSE4_2", "avx2": "AVX2", "avx512": "AVX512", "avx512_bf16": "AVX512", "amx": "AVX512"}
_ONEDNN = {
    "portable": "SSE41",
    "avx2": "AVX2",
    "avx512": "AVX512_CORE",
    "avx512_bf16": "AVX512_CORE_BF16",
    "amx": "AVX512_CORE_AMX",
}


class CpuIsaError(ValueError):
    """A forced class that is unknown, or that this CPU does not have."""


@dataclass(frozen=True)
class CpuInfo:
    """What the CPU has: its family (``x86``, ``arm`` or ``other``), its features (cpuinfo's
    ``flags`` or ``Features``) and the highest class they make up."""

    family: str
    features: frozenset[str]
    detected: str

    @property
    def classes(self) -> tuple[str, ...]:
        """The classes of this CPU's family, lowest first."""
        return {"x86": X86_CLASSES, "arm": ARM_CLASSES}.get(self.family, ("portable",))

    @property
    def sve(self) -> bool:
        return self.family == "arm" and "sve" in self.features

    def describe(self) -> str:
        extra = ", and SVE" if self.sve else ""
        return f"{self.family} CPU that has the {self.detected} class{extra}"


@functools.cache
def cpu_model_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def family_of(machine: str) -> str:
    machine = machine.lower()
    if machine in ("x86_64", "amd64", "i686", "i386"):
        return "x86"
    if machine in ("aarch64", "arm64"):
        return "arm"
    return "other"


def parse_cpuinfo(text: str, machine: str) -> CpuInfo:
    """The CPU described by ``/proc/cpuinfo``'s TEXT on a MACHINE (``platform.machine()``)."""
    family = family_of(machine)
    key = {"x86": "flags", "arm": "Features"}.get(family)
    features: frozenset[str] = frozenset()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if key is not None and name.strip() == key:
            features = frozenset(value.split())
            break
    needs = {"x86": _X86_NEEDS, "arm": _ARM_NEEDS}.get(family, {})
    detected = "portable"
    for cls in needs:  # in order: each class needs the ones before it
        if not needs[cls] <= features:
            break
        detected = cls
    return CpuInfo(family, features, detected)


@functools.cache
def cpu_info() -> CpuInfo:
    """This CPU (read once)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    return parse_cpuinfo(text, platform.machine())


def requested(environ: Mapping[str, str]) -> str | None:
    """The class the environment forces, or None for the detected one."""
    value = environ.get(ENV, "").strip().lower()
    if value and value != "native":
        return value
    if environ.get(PORTABLE_ENV) == "1":
        return "portable"
    return None


def choose(wanted: str | None, cpu: CpuInfo) -> str:
    """The class to use: WANTED (a forced class) if this CPU has it, else the detected one."""
    if wanted is None:
        return cpu.detected
    known = set(X86_CLASSES) | set(ARM_CLASSES)
    if wanted not in known:
        raise CpuIsaError(f"{ENV}={wanted} is not a CPU class; the classes: native, {', '.join(sorted(known))}")
    classes = cpu.classes
    if wanted not in classes or classes.index(wanted) > classes.index(cpu.detected):
        raise CpuIsaError(
            f"{ENV}={wanted}: this CPU does not have it; it is an {cpu.describe()}"
            f" (it can run {', '.join(classes[: classes.index(cpu.detected) + 1])})"
        )
    return wanted


def isa_class(environ: Mapping[str, str] | None = None) -> str:
    """The class in use here: the forced one (``LMISERVE_CPU_ISA``) or the detected one."""
    return choose(requested(os.environ if environ is None else environ), cpu_info())


def is_forced(environ: Mapping[str, str] | None = None) -> bool:
    return requested(os.environ if environ is None else environ) is not None


def compile_flags(cls: str) -> list[str]:
    """The flags the C++ kernels are built with for CLS (tuned for this CPU, where the compiler
    knows how: on x86 and Arm)."""
    cpu = cpu_info()
    tune = ["-mtune=native"] if cpu.family in ("x86", "arm") else []
    # AVX512_VNNI (Ice Lake, Cascade Lake and every AVX512_BF16 CPU; not Skylake): the int8
    # activations' products, where this CPU has them (the kernels are built where they run)
    vnni = ["-mavx512vnni"] if cls in ("avx512", "avx512_bf16", "amx") and "avx512_vnni" in cpu.features else []
    return [*COMPILE_FLAGS[cls], *vnni, *tune]


def torch_env(cls: str, cpu: CpuInfo) -> dict[str, str]:
    """The environment that holds torch's kernels (``ATEN_CPU_CAPABILITY``), oneDNN's
    (``ONEDNN_MAX_CPU_ISA``) and MKL's (``MKL_ENABLE_INSTRUCTIONS``: torch's fp32 matrix products)
    to CLS, where it is below what the CPU has; nothing otherwise."""
    if cls == cpu.detected:
        return {}
    if cpu.family == "x86":
        return {
            "ATEN_CPU_CAPABILITY": _ATEN[cls],
            "ONEDNN_MAX_CPU_ISA": _ONEDNN[cls],
            "MKL_ENABLE_INSTRUCTIONS": _MKL[cls],
        }
    if cls == "portable":
        return {"ATEN_CPU_CAPABILITY": "default"}
    return {}


def apply_torch_env(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set (unless already set) the torch and oneDNN variables of the class in use, in ENVIRON
    (``os.environ``: then before torch is imported, and inherited by the processes started after).
    Raises CpuIsaError for a forced class this CPU lacks. Returns what was set."""
    environ = os.environ if environ is None else environ
    wanted = torch_env(isa_class(environ), cpu_info())
    applied = {}
    for name, value in wanted.items():
        if name not in environ:
            environ[name] = value
            applied[name] = value
    if applied and environ is os.environ and "torch" in sys.modules:
        print(f"lmiserve: {applied} set after torch was imported; torch keeps its own choice", file=sys.stderr)
    return applied


def describe(environ: Mapping[str, str] | None = None) -> str:
    """One line: the class in use, whether detected or forced, and what the CPU has."""
    environ = os.environ if environ is None else environ
    cpu = cpu_info()
    how = "detected"
    if is_forced(environ):
        how = (
            f"forced by {ENV}"
            if environ.get(ENV, "").strip().lower() not in ("", "native")
            else f"forced by {PORTABLE_ENV}=1"
        )
    return f"CPU class {isa_class(environ)} ({how}; this is an {cpu.describe()})"


def main(argv: list[str]) -> int:
    """``python -m lmiserve.cpu_isa [CLASS]``: the class in use here; with CLASS, whether this CPU
    can run it (exit status 1 and why not)."""
    if argv:
        try:
            choose(argv[0], cpu_info())
        except CpuIsaError as exc:
            print(exc)
            return 1
        print(f"{argv[0]}: this CPU has it ({cpu_info().describe()})")
        return 0
    print(describe())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

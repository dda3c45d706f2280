"""Run a few of the C++ kernels' ops, built for Arm, under qemu-user, against ATen references.

It links the objects that ``scripts/arm_build_check.sh`` compiled (``build/arm/<class>/*.o``) into
the kernels' shared library for each Arm class, against an aarch64 libtorch; builds
``scripts/arm_emulated_check.cpp`` (a C++ program: it loads the library and compares rms_norm,
swiglu, write_kv_, paged_attention_decode, linear_gguf Q4_0/Q8_0 and argmax_logsumexp with plain
ATen); and runs it with ``qemu-aarch64``. Each check prints a line; the exit status is 1 if any
failed, 77 if something it needs is missing.

Why a C++ program and not Python under qemu: the aarch64 torch wheel on PyPI is a CUDA build, whose
Python module does not import without all the CUDA libraries; libtorch_cpu needs only two of them
(cudart and cupti, small wheels). The library's one Python dependency (``moe.cpp`` includes
``torch/extension.h``, so pybind11's symbols) is met by a stub library of the same names, never
called. qemu-user 7 shows the program the host's ``/proc/cpuinfo`` and ``/sys`` CPU topology, on
which the cpuinfo library that libtorch initialises crashes (an x86 host's); so it runs in a mount
namespace (``unshare -m``, as root, or ``unshare -rm``) with an Arm ``/proc/cpuinfo`` (a
Neoverse-N1's) and a bare ``/sys/devices/system/cpu``.

Needs (paths are options):

* ``aarch64-linux-gnu-g++``/``-gcc`` (g++-aarch64-linux-gnu) and ``qemu-aarch64`` (qemu-user);
* an arm64 root with glibc, libstdc++ and libgomp, e.g.
  ``mmdebstrap --arch=arm64 --variant=extract --include=libgomp1,libstdc++6 bookworm /opt/arm64root
  http://deb.debian.org/debian``;
* the aarch64 torch wheel of the same version as torch here, unpacked (``--arm-torch``, the directory
  holding ``torch/``): ``pip download --no-deps --platform manylinux_2_28_aarch64
  --only-binary=:all: --python-version 3.11 torch==VERSION`` and ``unzip`` it;
* the CUDA runtime and CUPTI libraries its libtorch_cpu names (``--cuda-libs``), e.g. for torch
  2.13 (CUDA 13): ``pip install --no-deps --target /tmp/armcudalib --platform manylinux_2_28_aarch64
  --only-binary=:all: --python-version 3.11 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cupti==13.0.85``
  (the versions the wheel's ``cuda-toolkit`` requirement pins), then ``/tmp/armcudalib/nvidia/cu13/lib``.

::

    scripts/arm_build_check.sh
    python scripts/arm_emulated_check.py --arm-torch /tmp/armtorch --cuda-libs /tmp/armcudalib/nvidia/cu13/lib
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = 77

# a Neoverse-N1's /proc/cpuinfo, two cores (NEON, fp16, dot product; no bf16, no SVE)
CPUINFO = "".join(
    f"processor\t: {i}\nBogoMIPS\t: 50.00\n"
    "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
    " ssbs\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x3\nCPU part\t: 0xd0c\nCPU revision\t: 1\n\n"
    for i in range(2)
)

# inside the mount namespace: the Arm cpuinfo over the host's, a bare CPU directory, then the command
NAMESPACE = """set -e
mount --bind "$1" /proc/cpuinfo
mount -t tmpfs none /sys/devices/system/cpu
for f in possible present online; do echo 0-1 > /sys/devices/system/cpu/$f; done
shift
exec "$@"
"""


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    return subprocess.run(cmd, check=True, **kwargs)


def python_stub(library: Path, out: Path, cc: str) -> Path:
    """A library defining every Python symbol LIBRARY leaves undefined (functions that trap, data
    as zeros), so that it loads in a program without Python."""
    nm = subprocess.run(
        ["aarch64-linux-gnu-nm", "-D", "--undefined-only", str(library)], check=True, capture_output=True, text=True
    )
    names = sorted(
        {line.split()[-1] for line in nm.stdout.splitlines() if line.split()[-1].lstrip("_").startswith("Py")}
    )
    lines = []
    for name in names:
        if name.startswith("PyExc_") or name.endswith("_Type") or name.endswith("Struct"):
            lines.append(f"void* {name}[32];")
        else:
            lines.append(f"void {name}(void) {{ __builtin_trap(); }}")
    src = out / "pystub.c"
    src.write_text("\n".join(lines) + "\n")
    run([cc, "-shared", "-fPIC", str(src), "-o", str(out / "libpystub.so")])
    return out / "libpystub.so"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--arm-torch", default=os.environ.get("ARM_TORCH", "/tmp/armtorch"), help="unpacked aarch64 torch wheel"
    )
    ap.add_argument("--cuda-libs", default=os.environ.get("ARM_CUDA_LIBS", "/tmp/armcudalib/nvidia/cu13/lib"))
    ap.add_argument("--arm-root", default=os.environ.get("ARM_ROOT", "/opt/arm64root"), help="arm64 root (qemu -L)")
    ap.add_argument("--objects", default=str(ROOT / "build" / "arm"), help="arm_build_check.sh's output")
    ap.add_argument("--classes", nargs="*", default=["neon", "neon_bf16"])
    ap.add_argument("--cpu", default="max", help="qemu's CPU model (max: NEON, fp16, bf16, SVE...)")
    args = ap.parse_args()

    cxx, cc, qemu = "aarch64-linux-gnu-g++", "aarch64-linux-gnu-gcc", "qemu-aarch64"
    torch_dir = Path(args.arm_torch) / "torch"
    missing = [tool for tool in (cxx, cc, qemu, "unshare") if not shutil.which(tool)]
    missing += [
        str(p)
        for p in (torch_dir / "lib" / "libtorch_cpu.so", Path(args.cuda_libs), Path(args.arm_root))
        if not p.exists()
    ]
    if missing:
        print(f"arm_emulated_check: skipped, missing: {', '.join(missing)}", file=sys.stderr)
        return SKIP

    inc = ["-isystem", str(torch_dir / "include"), "-isystem", str(torch_dir / "include/torch/csrc/api/include")]
    lib = str(torch_dir / "lib")
    failed = False
    with tempfile.TemporaryDirectory(prefix="arm_emulated_") as tmp:
        work = Path(tmp)
        (work / "cpuinfo").write_text(CPUINFO)
        (work / "namespace.sh").write_text(NAMESPACE)
        driver = work / "arm_emulated_check"
        for cls in args.classes:
            objects = sorted(Path(args.objects, cls).glob("*.o"))
            if not objects:
                print(
                    f"arm_emulated_check: no objects in {args.objects}/{cls}: run scripts/arm_build_check.sh",
                    file=sys.stderr,
                )
                return SKIP
            so = work / cls / "lmiserve_cpu_kernels.so"
            so.parent.mkdir()
            run(
                [
                    cxx,
                    *map(str, objects),
                    "-shared",
                    "-fopenmp",
                    f"-L{lib}",
                    "-lc10",
                    "-ltorch_cpu",
                    "-ltorch",
                    "-o",
                    str(so),
                ]
            )
            if not driver.exists():
                python_stub(so, work, cc)
                run(
                    [cxx, "-std=c++20", "-O1", *inc, str(ROOT / "scripts" / "arm_emulated_check.cpp"), "-o", str(driver),
                     f"-L{lib}", f"-L{work}", "-Wl,--no-as-needed", "-lpystub", "-lc10", "-ltorch_cpu",
                     "-Wl,--allow-shlib-undefined", "-ldl"]
                )  # fmt: skip
            env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join([lib, args.cuda_libs, str(work)]))
            unshare = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
            cmd = [*unshare, "sh", str(work / "namespace.sh"), str(work / "cpuinfo"),
                   qemu, "-cpu", args.cpu, "-L", args.arm_root, str(driver), str(so)]  # fmt: skip
            print(f"== {cls} under {qemu} -cpu {args.cpu}", flush=True)
            result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            sys.stdout.write("".join(line + "\n" for line in result.stdout.splitlines()))
            if result.returncode:
                failed = True
                print(f"{cls}: exit status {result.returncode}\n{result.stderr[-2000:]}")
    print("arm_emulated_check: " + ("FAILED" if failed else "every check passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

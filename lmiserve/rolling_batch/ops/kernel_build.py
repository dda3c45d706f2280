"""Compiling the C++ kernel sources (``csrc/``) into a torch op library, and loading it.

torch's extension builder compiles each source on its own, and each one spends about half its
time (6.5 of some 12 s at -O3) parsing torch's headers. So whenever a library has sources to
compile, the headers they all include (``csrc/kernel_prelude.h``) are first compiled into a
precompiled header beside the build, with the very flags the sources get, and each source is
compiled after it (``-include``): the sixteen sources of the engine's kernels build in 60 s
instead of 90 on two cores. The precompiled header (about 400 MB) is deleted once the library is
built. Where the compiler cannot use it (another compiler, other flags), it parses the prelude as
text, so a build never depends on it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path

from ...file_lock import file_lock

log = logging.getLogger("lmiserve.ops")

CSRC = Path(__file__).parent / "csrc"
PRELUDE = CSRC / "kernel_prelude.h"


@contextlib.contextmanager
def build_guard(build_dir: Path) -> Iterator[None]:
    """Held while this process builds or loads the kernels in ``build_dir``. Builders take it in
    turn, and the operating system releases it when its holder dies (an ``flock``), so torch's
    build lock, found while this is held, was left by a build that was killed (an engine stopped
    while it compiled): it is removed, or every later loader would wait on it forever."""
    with file_lock(build_dir / "lmiserve-build.flock"):
        lock = build_dir / "lock"
        if lock.exists():
            log.warning("removing a kernel build lock left by an interrupted build: %s", lock)
            lock.unlink(missing_ok=True)
        yield


@functools.cache
def sources_digest() -> str:
    """A hash of every kernel source and header: what a build, or a measurement of the kernels,
    is for."""
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(CSRC.iterdir()))).hexdigest()


def torch_cflags(name: str) -> list[str]:
    """The flags torch's extension builder puts before a library's own (``extra_cflags``) when it
    compiles a source on Linux: a precompiled header is used only by a compile with the same."""
    from torch.utils.cpp_extension import include_paths

    includes = [*include_paths("cpu"), sysconfig.get_path("include", scheme="posix_prefix")]
    return [
        f"-DTORCH_EXTENSION_NAME={name}",
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        *(flag for path in includes for flag in ("-isystem", path)),
        "-fPIC",
        "-std=c++20",
    ]


def precompile_prelude(name: str, prelude: Path, cflags: Sequence[str]) -> Path | None:
    """``prelude`` compiled into its precompiled header (``<prelude>.gch``, which the compiler
    takes in its place); None where that fails (the sources then parse it)."""
    from torch.utils.cpp_extension import get_cxx_compiler

    gch = prelude.with_name(prelude.name + ".gch")
    command = [get_cxx_compiler(), *torch_cflags(name), *cflags, "-x", "c++-header", str(prelude), "-o", str(gch)]
    try:
        subprocess.run(command, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        log.info("no precompiled header for %s; its sources parse the prelude (%s)", name, str(detail)[-500:])
        gch.unlink(missing_ok=True)
        return None
    return gch


def stale(build_dir: Path) -> bool:
    """Whether the build in ``build_dir`` has anything to compile: no build yet, or ninja, asked
    for a dry run of the last build, has work to do (sources newer than their objects, as in a
    fresh checkout of the same files)."""
    ninja = shutil.which("ninja")
    if ninja is None or not (build_dir / "build.ninja").is_file():
        return True
    dry = subprocess.run([ninja, "-C", str(build_dir), "-n"], capture_output=True, text=True)
    return dry.returncode != 0 or "no work to do" not in dry.stdout


def build_library(
    name: str,
    sources: Sequence[Path],
    cflags: Sequence[str],
    ldflags: Sequence[str] = (),
    precompiled: bool = True,
) -> None:
    """Compile ``sources`` into the op library ``name`` (once: torch caches the build under its
    name) and load it. ``precompiled``: compile the prelude first when the library has sources to
    compile (worth it from about four)."""
    from torch.utils.cpp_extension import _get_build_directory, load

    # ninja may be installed next to this Python rather than on PATH
    bindir = os.path.dirname(sys.executable)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    build_dir = Path(_get_build_directory(name, False))
    with build_guard(build_dir):
        prelude = build_dir / PRELUDE.name
        text = PRELUDE.read_bytes()
        if not prelude.exists() or prelude.read_bytes() != text:
            prelude.write_bytes(text)
        gch = None
        if precompiled and stale(build_dir):
            gch = precompile_prelude(name, prelude, cflags)
        try:
            load(
                name=name,
                sources=[str(p) for p in sources],
                extra_cflags=[*cflags, "-include", str(prelude)],
                extra_ldflags=list(ldflags),
                is_python_module=False,
                verbose=False,
            )
        finally:
            if gch is not None:
                gch.unlink(missing_ok=True)

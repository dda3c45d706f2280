"""The kernels' build: the prelude is precompiled with exactly the flags torch then compiles each
source with (else the compiler would not use it), the precompiled header is not left behind, and
a prelude that does not compile leaves the build to parse it; the prelude is precompiled only for a
build with something to compile (a fresh checkout's newer sources included)."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

import pytest

from lmiserve.cpu_isa import isa_class
from lmiserve.rolling_batch.ops.cpu_kernels import kernel_cflags, library_name, load_kernels
from lmiserve.rolling_batch.ops.kernel_build import PRELUDE, precompile_prelude, stale, torch_cflags

pytestmark = pytest.mark.skipif(
    not load_kernels() or importlib.util.find_spec("ninja") is None, reason="the CPU kernels do not build here"
)


def build_dir() -> Path:
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(library_name(kernel_cflags(isa_class())), False))


def test_the_prelude_is_precompiled_with_the_flags_each_source_is_compiled_with() -> None:
    flags = kernel_cflags(isa_class())
    name = library_name(flags)
    [line] = [line for line in (build_dir() / "build.ninja").read_text().splitlines() if line.startswith("cflags =")]
    prelude = build_dir() / PRELUDE.name
    assert shlex.split(line.removeprefix("cflags =")) == [*torch_cflags(name), *flags, "-include", str(prelude)]
    assert prelude.read_bytes() == PRELUDE.read_bytes()


def test_no_precompiled_header_is_left_beside_the_built_library() -> None:
    assert list(build_dir().glob("*.so")) and not list(build_dir().glob("*.gch"))


def test_a_prelude_that_does_not_compile_leaves_no_header_and_says_so(tmp_path, caplog) -> None:
    prelude = tmp_path / PRELUDE.name
    prelude.write_text("#include <no_such_header_here.h>\n")
    caplog.set_level("INFO", logger="lmiserve.ops")
    assert precompile_prelude("lmiserve_prelude_probe", prelude, ["-O0"]) is None
    assert not list(tmp_path.glob("*.gch"))
    assert "no precompiled header for lmiserve_prelude_probe" in caplog.text
    assert "no_such_header_here.h" in caplog.text


def test_a_build_is_stale_until_built_and_again_once_a_source_is_newer(tmp_path) -> None:
    import os
    import subprocess

    assert stale(tmp_path)  # never built
    (tmp_path / "build.ninja").write_text("rule cp\n  command = cp $in $out\nbuild out.txt: cp in.txt\n")
    (tmp_path / "in.txt").write_text("source")
    assert stale(tmp_path)
    subprocess.run(["ninja", "-C", str(tmp_path)], check=True, capture_output=True)
    assert not stale(tmp_path)
    later = (tmp_path / "out.txt").stat().st_mtime + 10
    os.utime(tmp_path / "in.txt", (later, later))  # as a fresh clone's files are newer than an old build
    assert stale(tmp_path)
    assert not stale(build_dir())  # this session's kernels are built

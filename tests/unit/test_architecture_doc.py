"""docs/architecture.md stays true: every file or folder it names exists, and so does every
module it names in dotted form."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def _named_paths(text: str) -> set[str]:
    """Code spans that look like paths: ``lmiserve/...``, ``tests/...``, ``x.py``, ``dir/`` (not
    routes such as ``/ping``)."""
    spans = re.findall(r"`([^`\s]+)`", text)
    paths = {s for s in spans if "/" in s or s.endswith((".py", ".md", ".toml", ".cpp", ".h"))}
    return {s for s in paths if not s.startswith("/")}


def _resolve(name: str) -> Path | None:
    """Where a named path lives: from the repository root, or under ``lmiserve/`` (the doc
    names the package's folders without the package prefix), or under ``lmiserve/rolling_batch/``."""
    for base in (ROOT, ROOT / "lmiserve", ROOT / "lmiserve" / "rolling_batch"):
        path = base / name.rstrip("/")
        if path.exists():
            return path
    return None


def test_every_path_the_architecture_notes_name_exists():
    text = DOC.read_text()
    names = _named_paths(text)
    assert len(names) > 30, "the notes should point at the files they describe"
    missing = sorted(n for n in names if _resolve(n) is None)
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_module_the_architecture_notes_name_exists():
    text = DOC.read_text()
    modules = set(re.findall(r"`(lmiserve(?:\.[a-z_0-9]+)+)`", text))
    missing = []
    for module in modules:
        path = ROOT.joinpath(*module.split("."))
        if not (path.with_suffix(".py").exists() or (path / "__init__.py").exists()):
            missing.append(module)
    assert not missing, f"docs/architecture.md names modules that do not exist: {sorted(missing)}"

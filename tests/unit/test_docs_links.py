"""README.md and docs/*.md stay true to the tree: every relative markdown link resolves to a file
or folder that exists (anchors ignored), and every code span that names a repository path names
one that exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Where a path named in a code span may be rooted: the repository, the package (pages name its
# folders without the `lmiserve/` prefix) and the engine (`rolling_batch/` folders likewise).
BASES = (ROOT, ROOT / "lmiserve", ROOT / "lmiserve" / "rolling_batch")
# First components that name something outside the tree or made at run time.
NOT_IN_TREE = {".venv", ".venv-vllm", "..", "~", "."}

FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1", re.S | re.M)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
TICKS = re.compile(r"`+")


def _prose(text: str) -> str:
    """The page without its fenced code blocks (their commands and output are not links or spans)."""
    return FENCE.sub("", text)


def _links(text: str) -> list[str]:
    """Relative link targets, anchors dropped; web, mail and same-page links left out."""
    targets = []
    for target in LINK.findall(_prose(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        targets.append(target.partition("#")[0])
    return targets


def _spans(paragraph: str) -> list[str]:
    """The code spans of one paragraph, as CommonMark pairs them: a run of backticks opens a span
    that the next run of the same length closes; a run that nothing closes is plain text."""
    runs = list(TICKS.finditer(paragraph))
    spans, i = [], 0
    while i < len(runs):
        opening = runs[i]
        closing = next((j for j in range(i + 1, len(runs)) if len(runs[j].group()) == len(opening.group())), None)
        if closing is None:
            i += 1
            continue
        spans.append(paragraph[opening.end() : runs[closing].start()])
        i = closing + 1
    return spans


def _named_paths(text: str) -> set[str]:
    """Every word of a code span that looks like a repository path: it holds a `/`, does not start
    at the filesystem root, a home directory or a URL scheme, and its first component is an entry
    of the repository, of `lmiserve/` or of `lmiserve/rolling_batch/` (so `application/json`,
    `/opt/ml/model` or `s3://...` are not taken for paths)."""
    paths = set()
    spans = [s for paragraph in _prose(text).split("\n\n") for s in _spans(paragraph)]
    for span in spans:
        for word in span.split():
            word = word.strip("'\"()[],;:")
            if "/" not in word or word.startswith(("/", "~", "$")) or "://" in word:
                continue
            if re.search(r"[{}<>=|]", word):
                continue
            first = word.split("/", 1)[0]
            if first in NOT_IN_TREE or not first:
                continue
            if any((base / first).exists() for base in BASES):
                paths.add(word)
    return paths


def _exists(name: str) -> bool:
    for base in BASES:
        if any(ch in name for ch in "*?["):
            if any(base.glob(name.rstrip("/"))):
                return True
        elif (base / name.rstrip("/")).exists():
            return True
    return False


def test_the_pages_are_there():
    names = {p.name for p in PAGES}
    assert "README.md" in names
    assert len(PAGES) > 10, "the README's details live in docs/, one page per topic"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path):
    missing = sorted({t for t in _links(page.read_text()) if t and not (page.parent / t).exists()})
    assert not missing, f"{page.relative_to(ROOT)} links to files that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_path_exists(page: Path):
    missing = sorted(n for n in _named_paths(page.read_text()) if not _exists(n))
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_the_checks_find_what_they_look_for():
    """The patterns catch a broken link and a wrong path, and leave routes and media types alone."""
    page = (
        "See [the engine](docs/engine.md#x), [gone](docs/nowhere.md), [web](https://example.com).\n"
        "`lmiserve/server/` and `scripts/nowhere.py --flag`, `tests/unit/engine/test_ops*.py`,\n"
        "`/v1/models`, `application/json`, `s3://bucket/key`.\n"
        "| `key` | `` | see docs/not_a_span.md. | `container/serve` |\n\n"
        "```bash\nscripts/also_nowhere.py\n```\n"
        "1. a step\n\n   ```properties\n   `scripts/indented_nowhere.py`\n   ```\n"
    )
    assert _links(page) == ["docs/engine.md", "docs/nowhere.md"]
    named = _named_paths(page)
    assert named == {"lmiserve/server/", "scripts/nowhere.py", "tests/unit/engine/test_ops*.py", "container/serve"}
    assert [n for n in sorted(named) if not _exists(n)] == ["scripts/nowhere.py"]

"""What a pip-audit report means for CI (scripts/dependency_audit.py)."""

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "dependency_audit.py"
spec = importlib.util.spec_from_file_location("dependency_audit", SCRIPT)
audit = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = audit
spec.loader.exec_module(audit)

SKIPPED = {
    "name": "torch",
    "version": "2.0",
    "skip_reason": "Dependency not found on PyPI and could not be audited: torch",
}
CLEAN = {"name": "httpx", "version": "0.28.1", "vulns": []}
VULNERABLE = {
    "name": "jinja2",
    "version": "3.1.0",
    "vulns": [{"id": "GHSA-aaaa-bbbb-cccc", "aliases": ["CVE-2099-1"], "fix_versions": ["3.1.9"]}],
}


def test_unreachable_database_skips_without_failing():
    outcome = audit.decide({"dependencies": [SKIPPED, dict(SKIPPED, name="numpy")]}, {})
    assert outcome.status == 0 and "SKIPPED" in outcome.message and "could not be reached" in outcome.message


def test_clean_environment_passes():
    outcome = audit.decide({"dependencies": [CLEAN, SKIPPED]}, {})
    assert outcome.status == 0
    assert outcome.message.startswith("1 package(s) audited, 1 skipped, 0 vulnerability(ies)")


def test_vulnerability_fails_unless_ignored_with_a_reason():
    outcome = audit.decide({"dependencies": [CLEAN, VULNERABLE]}, {})
    assert outcome.status == 1 and "jinja2 3.1.0: GHSA-aaaa-bbbb-cccc (fixed in 3.1.9)" in outcome.message
    ignores, problems = audit.read_ignores("# comment\nCVE-2099-1  sandbox not used: templates are ours\n")
    assert problems == []
    outcome = audit.decide({"dependencies": [CLEAN, VULNERABLE]}, ignores)
    assert outcome.status == 0 and "ignored: sandbox not used" in outcome.message


def test_ignore_entry_needs_a_reason():
    _, problems = audit.read_ignores("GHSA-aaaa-bbbb-cccc\n")
    assert problems and "no reason" in problems[0]


def test_checked_in_ignore_file_is_valid():
    assert audit.read_ignores(audit.IGNORE_FILE.read_text())[1] == []

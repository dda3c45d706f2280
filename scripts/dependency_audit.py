"""Audit the installed Python environment for known vulnerabilities with pip-audit.

    .venv/bin/python scripts/dependency_audit.py

Exit status 1 when a vulnerability is found that ``.ci/pip-audit-ignore.txt`` does not list (one
``ID  reason`` a line; an entry without a reason is itself an error). When the vulnerability
database cannot be reached, nothing could be audited: the script says so and exits 0, so that
an offline CI run is not failed by the audit alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IGNORE_FILE = ROOT / ".ci" / "pip-audit-ignore.txt"
NOT_ON_INDEX = "Dependency not found on PyPI"


@dataclass
class Outcome:
    status: int
    message: str


def read_ignores(text: str) -> tuple[dict[str, str], list[str]]:
    """(vulnerability id -> reason, problems) from the ignore file's text."""
    ignores: dict[str, str] = {}
    problems: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        vuln_id, _, reason = line.partition(" ")
        if not reason.strip():
            problems.append(f"line {n}: {vuln_id} has no reason; write why it is safe to ignore")
        ignores[vuln_id] = reason.strip()
    return ignores, problems


def decide(report: dict, ignores: dict[str, str]) -> Outcome:
    """What a pip-audit JSON report means for CI."""
    deps = report.get("dependencies", [])
    audited = [d for d in deps if not d.get("skip_reason")]
    if not audited:
        reasons = {d["skip_reason"].split(":")[0] for d in deps if d.get("skip_reason")}
        return Outcome(
            0,
            "dependency audit SKIPPED: the vulnerability database could not be reached, no package was audited"
            + (f" ({'; '.join(sorted(reasons))})" if reasons else ""),
        )
    found, ignored = [], []
    for dep in audited:
        for vuln in dep.get("vulns", []):
            ids = [vuln["id"], *vuln.get("aliases", [])]
            line = f"{dep['name']} {dep['version']}: {vuln['id']} (fixed in {', '.join(vuln.get('fix_versions') or ['-'])})"
            if any(i in ignores for i in ids):
                ignored.append(f"{line} ignored: {next(ignores[i] for i in ids if i in ignores)}")
            else:
                found.append(line)
    skipped = len(deps) - len(audited)
    summary = (
        f"{len(audited)} package(s) audited, {skipped} skipped, {len(found)} vulnerability(ies), {len(ignored)} ignored"
    )
    lines = [summary, *ignored, *found]
    if found:
        lines.append(f"upgrade these, or list them in {IGNORE_FILE.relative_to(ROOT)} with a reason")
    return Outcome(1 if found else 0, "\n".join(lines))


def run_pip_audit() -> dict | None:
    pip_audit = Path(sys.executable).with_name("pip-audit")
    cmd = [str(pip_audit), "--local", "--format", "json", "--progress-spinner", "off"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"dependency audit SKIPPED: pip-audit could not run ({exc})")
        return None
    try:
        return json.loads(done.stdout)
    except ValueError:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"dependency audit SKIPPED: pip-audit gave no report (exit {done.returncode}): {last}")
        return None


def main() -> int:
    ignores, problems = read_ignores(IGNORE_FILE.read_text() if IGNORE_FILE.exists() else "")
    if problems:
        print("\n".join(f"{IGNORE_FILE.name} {p}" for p in problems))
        return 1
    report = run_pip_audit()
    if report is None:
        return 0
    outcome = decide(report, ignores)
    print(outcome.message)
    return outcome.status


if __name__ == "__main__":
    sys.exit(main())

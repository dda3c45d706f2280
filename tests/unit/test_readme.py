"""The generated tables of docs/configuration.md (the settings, the device defaults, the environment
aliases) are current, and live there rather than in the README."""

from pathlib import Path

from lmiserve.config.docs import (
    ALIAS_END,
    ALIAS_START,
    DEVICE_END,
    DEVICE_START,
    DOC,
    END,
    START,
    alias_table,
    device_defaults_table,
    markdown_table,
    update,
)

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION = ROOT / DOC
README = ROOT / "README.md"
FIX = "run: python -m lmiserve.config.docs --update docs/configuration.md"


def _between(text: str, start: str, end: str) -> str:
    assert start in text and end in text, f"{DOC} lost its markers {start} ... {end}"
    return text.partition(start)[2].partition(end)[0].strip()


def test_configuration_tables_are_current():
    text = CONFIGURATION.read_text()
    assert update(text) == text, FIX
    assert _between(text, START, END) == markdown_table(), FIX
    assert _between(text, ALIAS_START, ALIAS_END) == alias_table(), FIX


def test_device_defaults_are_current():
    fragment = _between(CONFIGURATION.read_text(), DEVICE_START, DEVICE_END)
    assert fragment == device_defaults_table(), FIX


def test_the_readme_links_to_the_tables_rather_than_holding_them():
    text = README.read_text()
    assert not any(marker in text for marker in (START, DEVICE_START, ALIAS_START))
    assert "docs/configuration.md" in text

from pathlib import Path

from lmiserve.config.docs import DEVICE_END, DEVICE_START, device_defaults_table, update

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_configuration_table_is_current():
    text = README.read_text()
    assert update(text) == text, "run: python -m lmiserve.config.docs --update README.md"


def test_readme_device_defaults_are_current():
    text = README.read_text()
    fragment = text.partition(DEVICE_START)[2].partition(DEVICE_END)[0].strip()
    assert fragment == device_defaults_table(), "run: python -m lmiserve.config.docs --update README.md"

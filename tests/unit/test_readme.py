from pathlib import Path

from lmiserve.config.docs import update

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_configuration_table_is_current():
    text = README.read_text()
    assert update(text) == text, "run: python -m lmiserve.config.docs --update README.md"

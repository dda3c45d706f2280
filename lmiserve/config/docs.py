"""The configuration tables of ``docs/configuration.md``, generated from the setting declarations
and the device defaults.

``python -m lmiserve.config.docs --update`` (run from the repository root; or ``--update FILE``)
rewrites them between their marker comments; without ``--update`` it prints the settings table.
"""

from __future__ import annotations

from dataclasses import fields

from .device_defaults import DEVICE_DEFAULTS, DEVICE_NAMES, DeviceDefaults, in_words
from .fields import describe_allowed
from .loader import SPECS, SPECS_BY_FIELD

DOC = "docs/configuration.md"
START = "<!-- config-table:start -->"
END = "<!-- config-table:end -->"
ALIAS_START = "<!-- env-aliases:start -->"
ALIAS_END = "<!-- env-aliases:end -->"
DEVICE_START = "<!-- device-defaults:start -->"
DEVICE_END = "<!-- device-defaults:end -->"


def _default(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    return f"`{value}`"


def markdown_table() -> str:
    rows = [
        "| key | environment | default | allowed | meaning |",
        "|---|---|---|---|---|",
    ]
    for spec in SPECS:
        env = [f"`{spec.env}`"] + [f"`{a.name}`" + (" (MB)" if a.scale != 1 else "") for a in spec.aliases]
        if spec.cli:
            env.append(f"`{spec.cli}`")
        keys = " / ".join(f"`{k}`" for k in (spec.key, *spec.key_aliases))
        rows.append(
            f"| {keys} | {', '.join(env)} | {_default(spec.default)} | {describe_allowed(spec.info)} | {spec.doc} |"
        )
    return "\n".join(rows)


def alias_table() -> str:
    """The SageMaker / LMI environment variables that set a key under another name."""
    rows = ["| variable | sets | meaning |", "|---|---|---|"]
    for spec in SPECS:
        for alias in spec.aliases:
            unit = " (in MB)" if alias.scale != 1 else ""
            rows.append(f"| `{alias.name}` | `{spec.key}`{unit} | {spec.doc} |")
    return "\n".join(rows)


def device_defaults_table() -> str:
    """What the engine settings left empty mean on each kind of device (:mod:`.device_defaults`)."""
    rows = [
        "| setting | " + " | ".join(DEVICE_NAMES.values()) + " | what for |",
        "|---|" + "---|" * len(DEVICE_NAMES) + "---|",
    ]
    for f in fields(DeviceDefaults):
        values = " | ".join(in_words(DEVICE_DEFAULTS[kind], f.name) for kind in DEVICE_NAMES)
        rows.append(f"| `{SPECS_BY_FIELD['engine', f.name].key}` | {values} | {f.metadata['why']} |")
    return "\n".join(rows)


def _replace(text: str, start: str, end: str, table: str) -> str:
    if start not in text:
        return text
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    return f"{head}{start}\n{table}\n{end}{tail}"


def update(text: str) -> str:
    """``text`` with the tables between the markers replaced by the current ones."""
    text = _replace(text, START, END, markdown_table())
    text = _replace(text, DEVICE_START, DEVICE_END, device_defaults_table())
    return _replace(text, ALIAS_START, ALIAS_END, alias_table())


if __name__ == "__main__":
    import sys
    from pathlib import Path

    if len(sys.argv) in (2, 3) and sys.argv[1] == "--update":
        path = Path(sys.argv[2] if len(sys.argv) == 3 else DOC)
        path.write_text(update(path.read_text()))
    else:
        print(markdown_table())

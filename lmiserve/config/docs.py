"""The README's configuration table, generated from the setting declarations."""

from __future__ import annotations

from .fields import describe_allowed
from .loader import SPECS

START = "<!-- config-table:start -->"
END = "<!-- config-table:end -->"


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


def update(text: str) -> str:
    """``text`` with the table between the markers replaced by the current one."""
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{markdown_table()}\n{END}{tail}"


if __name__ == "__main__":
    import sys
    from pathlib import Path

    if len(sys.argv) == 3 and sys.argv[1] == "--update":
        path = Path(sys.argv[2])
        path.write_text(update(path.read_text()))
    else:
        print(markdown_table())

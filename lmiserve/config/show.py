"""``lmiserve config show``: every resolved setting and where its value came from."""

from __future__ import annotations

from .loader import SPECS, Settings


def _text(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def render(settings: Settings) -> str:
    rows = [("KEY", "VALUE", "SOURCE")]
    for spec in SPECS:
        value, source = settings.value(spec.key), str(settings.sources[spec.key])
        if spec.key == "model_name" and value is None:
            value, source = settings.model_name, "derived from the model directory"
        rows.append((spec.key, _text(value), source))
    for key, value in settings.unknown.items():
        rows.append((key, value, "not a known key; passed to the handler" if key.startswith("option.") else "ignored"))
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = [
        f"model {settings.model_name!r} in {settings.model_dir}",
        f"properties file: {settings.properties_file or 'none'}",
        "",
    ]
    for key, value, source in rows:
        lines.append(f"{key:<{widths[0]}}  {value:<{widths[1]}}  {source}")
    if settings.warnings:
        lines.append("")
        lines.extend(f"warning: {w}" for w in settings.warnings)
    return "\n".join(lines)

"""Which spec reader an architecture name takes: every family the engine runs, by the name a
Hugging Face config gives in ``architectures`` (torch-free, like :mod:`.spec`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .spec import FAMILY_ARCHITECTURES, ModelSpec, UnsupportedModel, read_config
from .variants import VARIANT_ARCHITECTURES
from .vision_specs import VISION_SPEC_ARCHITECTURES

ARCHITECTURES: dict[str, Callable[[dict[str, Any]], ModelSpec]] = {
    **FAMILY_ARCHITECTURES,
    **VARIANT_ARCHITECTURES,
    **VISION_SPEC_ARCHITECTURES,
}


def spec_from_config(config: dict[str, Any]) -> ModelSpec:
    architectures = config.get("architectures") or []
    for name in architectures:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name](config)
    known = ", ".join(sorted(ARCHITECTURES))
    raise UnsupportedModel(
        f"architecture {architectures or config.get('model_type')} is not supported (supported: {known})"
    )


def supported(model_dir: Path) -> bool:
    try:
        spec_from_config(read_config(model_dir))
        return True
    except (UnsupportedModel, KeyError, OSError, ValueError):
        return False

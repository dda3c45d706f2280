"""A model's end-of-sequence tokens, as its files name them."""

from __future__ import annotations

import json
from pathlib import Path


def eos_token_ids(model_dir: Path, spec_eos: tuple[int, ...]) -> tuple[int, ...]:
    """The config's end-of-sequence ids and generation_config.json's, in that order."""
    ids = list(spec_eos)
    gen = Path(model_dir) / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        for t in [eos] if isinstance(eos, int) else eos or []:
            if t not in ids:
                ids.append(t)
    return tuple(ids)

"""Loading a model's tokenizer in the API process without torch where that is the same tokenizer.

``AutoTokenizer`` reads the model's configuration through transformers' modelling utilities,
which import torch (about 350 MB of the API process's memory). A model whose
``tokenizer_config.json`` declares the generic ``TokenizersBackend`` (a ``tokenizer.json``), with
no code of its own, and whose family ``AutoTokenizer`` leaves on that declaration (Llama, SmolLM,
Qwen3; a test checks each against ``AutoTokenizer``) is loaded as ``TokenizersBackend`` directly.
Every other model goes through ``AutoTokenizer``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GENERIC = "TokenizersBackend"
DECLARATION_KEPT = frozenset({"llama", "qwen3"})
"""Model types for which ``AutoTokenizer`` builds the generic class the tokenizer config declares
(Qwen2, for one, is switched to its own tokenizer class)."""


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def direct_class(path: Path) -> str | None:
    """The class to load without ``AutoTokenizer``, or None when only it can tell."""
    tokenizer_config = _json(Path(path) / "tokenizer_config.json")
    model_type = _json(Path(path) / "config.json").get("model_type")
    if tokenizer_config.get("tokenizer_class") != GENERIC or "auto_map" in tokenizer_config:
        return None
    if model_type not in DECLARATION_KEPT or not (Path(path) / "tokenizer.json").is_file():
        return None
    return GENERIC


def load_tokenizer(path: Path, trust_remote_code: bool = False) -> Any:
    import transformers

    if not trust_remote_code and direct_class(path) == GENERIC:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(path)
    return transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)

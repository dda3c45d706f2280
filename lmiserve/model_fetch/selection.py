"""Which of a Hub repository's files a model needs.

- A repository with ``config.json``: the configuration, generation configuration, tokenizer and
  chat-template files (every top-level ``.json``, ``.txt``, ``.model``, ``.jinja``, ``.tiktoken`` and
  ``.py``, and a sentence-transformers model's module configurations), and the weights in one format:
  safetensors when there are any, else PyTorch ``.bin``; never both, and never ``.pth``, ONNX,
  TensorFlow or Flax copies beside them.
- A GGUF repository (or ``option.gguf_file`` / a ``:QUANT`` suffix): one ``.gguf`` file, named by
  ``option.gguf_file``, else the one whose name carries the quantization (``Q4_K_M``), else
  ``Q4_K_M`` as llama.cpp picks, else the first by name. Vision projectors (``mmproj``) are not
  candidates.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from .errors import FetchError

SMALL_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".tiktoken", ".py")
DEFAULT_QUANT = "Q4_K_M"
"""llama.cpp's choice when a repository id names no quantization."""
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$")


def _top_level(name: str) -> bool:
    return "/" not in name


def _module_config(name: str) -> bool:
    """A sentence-transformers module's configuration (``1_Pooling/config.json``)."""
    parts = PurePosixPath(name).parts
    return len(parts) == 2 and re.match(r"^\d+_", parts[0]) is not None and parts[1].endswith(".json")


def is_gguf_repo(names: list[str]) -> bool:
    return "config.json" not in names and any(n.endswith(".gguf") for n in names)


def model_files(names: list[str], model_id: str) -> list[str]:
    """The files of a Hugging Face-layout repository the model needs."""
    small = [n for n in names if (_top_level(n) and n.endswith(SMALL_SUFFIXES)) or _module_config(n)]
    safetensors = [n for n in names if _top_level(n) and n.endswith(".safetensors")]
    weights = safetensors or [n for n in names if _top_level(n) and n.endswith(".bin")]
    if not weights:
        raise FetchError(
            f"{model_id}: the repository has no safetensors or PyTorch .bin weights at its top level "
            f"(files: {', '.join(sorted(names)[:12])}{' ...' if len(names) > 12 else ''})"
        )
    return sorted(set(small + weights))


def gguf_file(names: list[str], model_id: str, wanted: str | None, quant: str | None) -> str:
    """The one GGUF file to fetch."""
    ggufs = sorted(n for n in names if n.endswith(".gguf") and "mmproj" not in n.lower())
    if wanted:
        if wanted in names:
            return wanted
        raise FetchError(f"{model_id}: option.gguf_file={wanted} is not in the repository (GGUF files: {_list(ggufs)})")
    if not ggufs:
        raise FetchError(f"{model_id}: the repository has no .gguf file")
    tag = quant or DEFAULT_QUANT
    matches = [n for n in ggufs if re.search(rf"(^|[^A-Za-z0-9]){re.escape(tag)}([^A-Za-z0-9_]|$)", n, re.I)]
    if not matches and quant:
        raise FetchError(f"{model_id}: no GGUF file for quantization {quant} (GGUF files: {_list(ggufs)})")
    chosen = (matches or ggufs)[0]
    if _SPLIT.search(chosen):
        raise FetchError(
            f"{model_id}: {chosen} is one part of a split GGUF file, which lmiserve does not join; "
            "name a single-file quantization with option.gguf_file or a :QUANT suffix"
        )
    return chosen


def _list(names: list[str]) -> str:
    return ", ".join(names) or "none"

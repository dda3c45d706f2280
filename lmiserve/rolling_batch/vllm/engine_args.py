"""vLLM's engine arguments from lmiserve's settings.

lmiserve's own keys come first (``option.tensor_parallel_degree`` → ``tensor_parallel_size``,
``option.pipeline_parallel_degree`` → ``pipeline_parallel_size``, ...). Any other
``option.<name>`` that names one of vLLM's engine arguments is passed to vLLM as it is, typed by
vLLM's own command-line parser, as DJL's LMI passes them (``option.distributed_executor_backend=ray``,
``option.enforce_eager=true``). vLLM's spelling of a setting lmiserve names otherwise is refused
when the two disagree (lmiserve's value counts even when it is the default, as in DJL); where
lmiserve's is unset, vLLM's name is taken. Speculative decoding (``option.speculative_config``, or
LMI's ``option.speculative_draft_model`` and ``option.speculative_length``) reaches vLLM as its own
``speculative_config``, with a draft named by a Hub id or ``s3://`` already fetched.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path
from typing import Any

from ...config import Settings
from ...devices import TORCH_DTYPE_NAMES
from ..process.client import EngineStartError
from .params import TYPICAL_P_PROCESSOR, field_names

RENAMED = {
    "tensor_parallel_size": "option.tensor_parallel_degree",
    "pipeline_parallel_size": "option.pipeline_parallel_degree",
    "max_num_seqs": "option.max_rolling_batch_size",
    "max_num_batched_tokens": "option.max_rolling_batch_prefill_tokens",
}
"""vLLM's names of arguments lmiserve sets from settings of its own."""


def _tensor_parallel(degree: int | str) -> int:
    if degree != "max":
        return int(degree)
    import torch

    return max(1, torch.cuda.device_count())


def lmiserve_kwargs(settings: Settings, model_path: Path) -> dict[str, Any]:
    """The arguments lmiserve's own settings give (vLLM's defaults where ours are unset)."""
    model, engine = settings.model, settings.engine
    kw: dict[str, Any] = {
        "model": str(model_path),
        "tokenizer": str(model_path),
        "dtype": TORCH_DTYPE_NAMES.get(model.dtype, model.dtype),
        "trust_remote_code": model.trust_remote_code,
        "tensor_parallel_size": _tensor_parallel(model.tensor_parallel_degree),
        "pipeline_parallel_size": model.pipeline_parallel_degree,
        "gpu_memory_utilization": engine.gpu_memory_utilization,
        "max_num_seqs": engine.max_rolling_batch_size,
        "enable_prefix_caching": engine.enable_prefix_caching,
        "enforce_eager": engine.enforce_eager,
        "enable_log_requests": False,
        "disable_log_requests": True,
        # typical_p, which vLLM does not sample with: lmiserve's filter as an engine logits processor
        "logits_processors": [TYPICAL_P_PROCESSOR],
    }
    if model.max_model_len is not None:
        kw["max_model_len"] = model.max_model_len
    if engine.max_rolling_batch_prefill_tokens is not None:
        kw["max_num_batched_tokens"] = engine.max_rolling_batch_prefill_tokens
    if engine.block_size is not None:
        kw["block_size"] = engine.block_size
    if engine.kv_cache_memory is not None:
        kw["kv_cache_memory_bytes"] = engine.kv_cache_memory
    if engine.async_scheduling != "auto":  # auto: vLLM's own default
        kw["async_scheduling"] = engine.async_scheduling == "true"
    speculative = engine.speculative
    if speculative is not None:
        kw["speculative_config"] = speculative.for_vllm()
    return kw


def _passed_options(settings: Settings, known: frozenset[str]) -> dict[str, str]:
    """``option.<vLLM engine argument>`` keys that are not lmiserve settings."""
    found = {}
    for key, value in settings.unknown.items():
        name = key.removeprefix("option.")
        if key.startswith("option.") and name in known:
            found[name] = value
    return found


def _parser(args_cls: type) -> argparse.ArgumentParser | None:
    add = getattr(args_cls, "add_cli_args", None)
    if add is None:
        return None
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]
    except ImportError:
        return None
    return add(FlexibleArgumentParser())


def _literal(value: str) -> Any:
    """A value typed without vLLM's parser: booleans, integers and numbers, else the text."""
    low = value.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(value)
    return value


def typed_options(options: dict[str, str], args_cls: type) -> dict[str, Any]:
    """The values of ``options`` (vLLM argument name → text) typed as vLLM's CLI would type them."""
    if not options:
        return {}
    parser = _parser(args_cls)
    if parser is None:
        return {name: _literal(value) for name, value in options.items()}
    typed = {}
    for name, value in options.items():  # one at a time, to say which one vLLM refuses
        flag = "--" + name.replace("_", "-")
        low = value.strip().lower()
        argv = ([flag] if low == "true" else [f"--no-{flag[2:]}"]) if low in ("true", "false") else [flag, value]
        try:
            with contextlib.redirect_stderr(io.StringIO()) as err:
                parsed = vars(parser.parse_args(argv))
        except (SystemExit, argparse.ArgumentError, ValueError) as exc:
            text = " ".join(err.getvalue().split())
            detail = text.rsplit("error: ", 1)[-1] if text else str(exc)  # argparse's reason, not its usage
            raise EngineStartError(f"option.{name}={value} is not a valid vLLM engine argument: {detail}") from None
        typed[name] = parsed.get(name, _literal(value))
    return typed


def engine_kwargs(settings: Settings, model_path: Path, args_cls: type | None = None) -> dict[str, Any]:
    """vLLM ``AsyncEngineArgs`` keywords: lmiserve's settings, then the options passed through
    (when ``args_cls``, vLLM's class, is given)."""
    kw = lmiserve_kwargs(settings, model_path)
    if args_cls is None:
        return kw
    passed = typed_options(_passed_options(settings, field_names(args_cls)), args_cls)
    for name, value in passed.items():
        ours = RENAMED.get(name)
        if ours is not None and name in kw and kw[name] != value:
            raise EngineStartError(
                f"option.{name}={value} disagrees with {ours}={kw[name]}; set {ours} only (lmiserve's name for it)"
            )
    kw.update(passed)
    if TYPICAL_P_PROCESSOR not in (kw.get("logits_processors") or []):  # a user's own list keeps ours too
        kw["logits_processors"] = [*(kw.get("logits_processors") or []), TYPICAL_P_PROCESSOR]
    return kw


def taken(kwargs: dict[str, Any], args_cls: type) -> tuple[dict[str, Any], list[str]]:
    """The keywords the installed vLLM's ``args_cls`` takes, and the names it does not (left to
    its defaults: lmiserve sets a few that older or newer vLLMs lack)."""
    known = field_names(args_cls)
    return {k: v for k, v in kwargs.items() if k in known}, sorted(k for k in kwargs if k not in known)

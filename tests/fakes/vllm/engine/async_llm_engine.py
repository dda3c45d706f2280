"""AsyncLLMEngine: from_engine_args, generate (an async iterator of RequestOutput), abort, shutdown."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import os
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..outputs import CompletionOutput, Logprob, RequestOutput
from ..sampling_params import RequestOutputKind, SamplingParams
from ..v1.engine.exceptions import EngineDeadError

SPECIAL_TOKENS = 4
TOKEN_LOGPROB = -0.5
"""A generated token's log-probability is ``TOKEN_LOGPROB - (token % 4) / 8``."""
PROMPT_LOGPROB = -1.0


def _env_int(name: str) -> int:
    return int(os.environ.get(name, "0") or 0)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in value]
    return value


def record(event: str, **data: Any) -> None:
    path = os.environ.get("FAKE_VLLM_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"event": event, "time": time.time(), **_plain(data)}) + "\n")


class AsyncLLMEngine:
    def __init__(self, args: Any):
        config = json.loads((Path(args.model) / "config.json").read_text())
        self.vocab_size = int(config["vocab_size"])
        eos = config.get("eos_token_id")
        self.eos_token_id = eos[0] if isinstance(eos, list) else eos
        max_len = args.max_model_len or config.get("max_position_embeddings", 2048)
        dtype = {"auto": "float32", "float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}[args.dtype]
        self.model_config = SimpleNamespace(max_model_len=max_len, dtype=f"torch.{dtype}")
        self.vllm_config = SimpleNamespace(
            model_config=self.model_config,
            scheduler_config=SimpleNamespace(
                max_num_seqs=args.max_num_seqs or 256, max_num_batched_tokens=args.max_num_batched_tokens or 2048
            ),
            cache_config=SimpleNamespace(block_size=args.block_size or 16, num_gpu_blocks=1000),
        )
        self.delay = float(os.environ.get("FAKE_VLLM_DELAY", "0") or 0)
        self.eos_after = _env_int("FAKE_VLLM_EOS_AFTER")
        self.die_after = _env_int("FAKE_VLLM_DIE_AFTER")
        self.errored = False
        self.dead_error: BaseException | None = None
        self.served = 0
        self.running: set[str] = set()
        self.aborted: set[str] = set()
        record("engine_args", args=args)

    @classmethod
    def from_engine_args(cls, args: Any) -> AsyncLLMEngine:
        failure = os.environ.get("FAKE_VLLM_FAIL_START")
        if failure:
            raise RuntimeError(failure)
        hold = os.environ.get("FAKE_VLLM_HOLD_START")
        while hold and os.path.exists(hold):
            time.sleep(0.05)
        return cls(args)

    def _token(self, base: int, i: int) -> int:
        span = self.vocab_size - SPECIAL_TOKENS
        return SPECIAL_TOKENS + (base + i) % span

    def _alternatives(self, token: int, chosen: float, k: int) -> dict[int, Logprob]:
        entries = {token: Logprob(chosen, 1)}
        span = self.vocab_size - SPECIAL_TOKENS
        for j in range(1, k + 1):
            entries[SPECIAL_TOKENS + (token - SPECIAL_TOKENS + j) % span] = Logprob(chosen - j, j + 1)
        return entries

    def _check(self, ids: list[int], sp: SamplingParams, request_id: str) -> None:
        if not isinstance(sp, SamplingParams):
            raise TypeError("sampling_params must be a SamplingParams")
        if request_id in self.running:
            raise ValueError(f"request id {request_id} is already running")
        if len(ids) >= self.model_config.max_model_len:
            raise ValueError(f"the prompt (length {len(ids)}) is longer than the maximum model length")
        regex = getattr(sp.structured_outputs, "regex", None)
        if regex is not None:
            try:
                re.compile(regex)
            except re.error as exc:
                raise ValueError(f"Failed to transform regex into a grammar: {exc}") from None

    async def generate(self, prompt: dict, sampling_params: SamplingParams, request_id: str):
        if self.errored:
            raise EngineDeadError()
        ids = list(prompt["prompt_token_ids"])
        sp = sampling_params
        self._check(ids, sp, request_id)
        record("generate", request_id=request_id, prompt_token_ids=ids, params=sp)
        self.served += 1
        dies = bool(self.die_after) and self.served >= self.die_after
        self.running.add(request_id)
        delta = sp.output_kind == RequestOutputKind.DELTA
        sampling = sp.temperature > 0
        base = sum(ids) + ((sp.seed or 0) if sampling else 0)
        tokens: list[int] = []
        logprobs: list[dict[int, Logprob]] = []
        cumulative = 0.0
        prompt_lps = None
        if sp.prompt_logprobs is not None:
            prompt_lps = [None] + [self._alternatives(t, PROMPT_LOGPROB, sp.prompt_logprobs) for t in ids[1:]]
        stops = set(sp.stop_token_ids or [])
        try:
            for i in range(sp.max_tokens or 16):
                await asyncio.sleep(self.delay)
                if dies and i == 1:
                    self.errored = True
                    self.dead_error = EngineDeadError()
                if self.errored:
                    raise EngineDeadError()
                if request_id in self.aborted:
                    return
                token = self._token(base, i)
                reason, stop_reason = None, None
                if self.eos_after and i + 1 == self.eos_after and not sp.ignore_eos and i + 1 >= sp.min_tokens:
                    token, reason = self.eos_token_id, "stop"
                elif token in stops and i + 1 >= sp.min_tokens:
                    reason, stop_reason = "stop", token
                elif i + 1 >= (sp.max_tokens or 16) or len(ids) + i + 1 >= self.model_config.max_model_len:
                    reason = "length"
                tokens.append(token)
                if sp.logprobs is not None:
                    chosen = TOKEN_LOGPROB - (token % 4) / 8
                    logprobs.append(self._alternatives(token, chosen, sp.logprobs))
                    cumulative += chosen
                new = slice(i, i + 1) if delta else slice(0, i + 1)
                completion = CompletionOutput(
                    index=0,
                    text="",
                    token_ids=tokens[new],
                    cumulative_logprob=cumulative if sp.logprobs is not None else None,
                    logprobs=logprobs[new] if sp.logprobs is not None else None,
                    finish_reason=reason,
                    stop_reason=stop_reason,
                )
                yield RequestOutput(
                    request_id=request_id,
                    prompt=None,
                    prompt_token_ids=ids,
                    prompt_logprobs=prompt_lps if (i == 0 or not delta) else None,
                    outputs=[completion],
                    finished=reason is not None,
                    num_cached_tokens=0,
                )
                if reason is not None:
                    return
        except (asyncio.CancelledError, GeneratorExit):
            record("closed", request_id=request_id)
            self._abort(request_id)
            raise
        finally:
            self.running.discard(request_id)

    def _abort(self, request_id: str) -> None:
        if request_id in self.running:
            self.aborted.add(request_id)

    async def abort(self, request_id: str) -> None:
        record("abort", request_id=request_id)
        self._abort(request_id)

    def shutdown(self) -> None:
        record("shutdown")

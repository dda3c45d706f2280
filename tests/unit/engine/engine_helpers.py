"""Driving the engine in-process and comparing with transformers."""

from __future__ import annotations

import torch

from lmiserve.rolling_batch.core.engine import Engine, EngineConfig
from lmiserve.wire import SamplingParams

ASYNC_SCHEDULING = "false"
"""``option.async_scheduling`` of the engines :func:`make_engine` builds (the ``scheduling``
fixture runs a test both ways)."""


def make_engine(model_dir, **overrides) -> Engine:
    cfg = dict(
        model_dir=model_dir,
        dtype="fp32",
        device="cpu",
        max_num_seqs=8,
        max_num_batched_tokens=24,
        max_model_len=256,
        block_size=16,
        kv_cache_bytes=None,
        async_scheduling=ASYNC_SCHEDULING,
    )
    cfg.update(overrides)
    return Engine(EngineConfig(**cfg))


def fail_request(engine: Engine, request_id: str, after: int = 2) -> None:
    """An injected fault: every forward pass that holds ``request_id`` once it has generated
    ``after`` tokens raises ``RuntimeError("injected fault")``."""
    forward = engine.runner._forward

    def failing(out, *args):  # type: ignore[no-untyped-def]
        if any(item.seq.request_id == request_id and item.seq.num_generated >= after for item in out.scheduled):
            raise RuntimeError("injected fault")
        return forward(out, *args)

    engine.runner._forward = failing


def staggered(prompts: list[list[int]], lengths: list[int]) -> dict[int, list[tuple[str, list[int], SamplingParams]]]:
    """Four requests "a" to "d" arriving at steps 0, 2, 5 and 5, each for its number of tokens."""
    at = (0, 2, 5, 5)
    arrivals: dict[int, list[tuple[str, list[int], SamplingParams]]] = {}
    for rid, prompt, n, step in zip("abcd", prompts, lengths, at):
        arrivals.setdefault(step, []).append((rid, prompt, SamplingParams(max_new_tokens=n)))
    return arrivals


def run(engine: Engine, arrivals: dict[int, list[tuple[str, list[int], SamplingParams]]], max_steps: int = 2000):
    """Add requests at the given steps; return {request_id: {index: [token ids]}} and the deltas."""
    tokens: dict[str, dict[int, list[int]]] = {}
    finish: dict[str, dict[int, str]] = {}
    deltas = []
    step = 0
    while step < max_steps:
        for rid, prompt, params in arrivals.get(step, []):
            engine.add_request(rid, prompt, params)
            tokens[rid] = {}
            finish[rid] = {}
        if not engine.has_work() and step > max(arrivals):
            break
        for d in engine.step():
            deltas.append(d)
            tokens.setdefault(d.request_id, {}).setdefault(d.index, []).extend(d.token_ids)
            if d.finish_reason:
                finish.setdefault(d.request_id, {})[d.index] = d.finish_reason
        step += 1
    return tokens, finish, deltas


def hf_greedy(model_dir, prompt_ids: list[int], max_new: int) -> list[int]:

    model = _hf(model_dir)
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new, do_sample=False)
    gen = out[0, len(prompt_ids) :].tolist()
    eos = model.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos or [])
    for i, t in enumerate(gen):
        if t in eos:
            return gen[: i + 1]
    return gen


_cache: dict = {}


def _hf(model_dir):
    from tests.tiny_models import reference_model

    key = str(model_dir)
    if key not in _cache:
        _cache[key] = reference_model(model_dir)
    return _cache[key]


def run_pictures(engine: Engine, requests: dict, max_new: int) -> dict[str, list[int]]:
    """Requests ``{id: (prompt ids, pictures and clips)}`` added at once (each a run of the model's
    image or video token in its prompt), run to the end; ``{id: generated ids}``."""
    from tests.tiny_video import media_inputs

    rows = engine.runner.images
    video_token = rows.token_ids[1] if rows is not None and len(rows.token_ids) > 1 else -1
    for rid, (ids, media) in requests.items():
        inputs = media_inputs(ids, media, engine.spec.image_token_id, video_token)
        engine.add_request(rid, ids, SamplingParams(max_new_tokens=max_new), images=inputs)
    tokens: dict[str, list[int]] = {rid: [] for rid in requests}
    while engine.has_work():
        for d in engine.step():
            tokens[d.request_id].extend(d.token_ids)
    return tokens

"""What the engine reports about itself (part of :mod:`.wire`'s messages)."""

from __future__ import annotations

import msgspec


class EngineStats(msgspec.Struct, kw_only=True):
    running: int
    waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    prefix_cache_hit_tokens: int
    preemptions: int
    prompt_tokens: int
    generated_tokens: int
    step_seconds: float
    adapters_loaded: int = 0
    """LoRA adapters whose weights are in host memory."""
    adapter_loads: int = 0
    """Times an adapter's weights were read from its directory (at registration or again after
    being unloaded)."""
    graph_steps: int = 0
    """Engine steps replayed from a captured device graph (cumulative)."""
    eager_steps: int = 0
    """Engine steps run eagerly, kernel by kernel (cumulative)."""
    kernel_compiles: int = 0
    """Device kernels compiled since the engine said it was ready (each one stalls every
    stream while it compiles; the warm-up is meant to leave none)."""
    expired_in_queue: int = 0
    """Requests whose deadline passed before they were scheduled (never computed; cumulative)."""
    oom_failures: int = 0
    """Requests ended because memory ran out in their step (the engine carried on; cumulative)."""
    nonfinite_sequences: int = 0
    """Sequences ended because the model gave NaN or inf logits for them (cumulative)."""
    prefill_tokens_per_s: float = 0.0
    """Prompt tokens computed per second of step time, smoothed over recent steps (0: not yet measured)."""
    decode_step_seconds: float = 0.0
    """Seconds per step in which sequences decode (prompts computed beside them included): what a
    running sequence's next token takes at the current load, smoothed over recent steps (0: not
    yet measured)."""
    idle_prefill_tokens_per_s: float = 0.0
    """Prompt tokens per second of the steps in which nothing decodes (the prompt runs whole),
    smoothed (0: not yet measured)."""
    decode_step_prefill_tokens: int = 0
    """Prompt tokens a step that also decodes may take at the current load (0: no limit below the
    step's budget)."""
    decode_curve: list[tuple[float, float]] = []
    """(batch, seconds) of steps in which only sequences decode, by batch (the engine's
    ``StepSpeeds.decode_curve``; empty: none measured)."""
    spec_proposed_tokens: int = 0
    """Tokens proposed by speculative decoding and checked by the model (cumulative)."""
    spec_accepted_tokens: int = 0
    """Of those, the tokens the model accepted (cumulative)."""
    spec_drafts: int = 0
    """Proposals checked: a sequence's run of proposed tokens in one step (cumulative). Mean accepted
    length, the tokens a checked proposal yields with the model's own token: ``1 + accepted / drafts``."""

"""Admission control of an engine model: refuse at once what the engine cannot serve in time.

Three limits decide whether a new request goes to the engine:

- **the queue limit**: the requests in flight may not exceed ``max_rolling_batch_size +
  job_queue_size`` (reason ``queue_full``);
- **the predicted delay** (``option.predictive_admission``): a request predicted to end after its
  deadline is refused (reason ``predicted_delay``) instead of being admitted to miss it, slowing
  every other request on the way;
- **the first token's wait** (``option.max_first_token_wait``, with the predicted delay; 0: none): a
  request whose first token is predicted later than that many seconds after it arrives is refused
  (reason ``first_token_wait``), whether it has a deadline or not. The bound is the operator's own,
  so no reserve is kept from it. It weighs only the newcomer's own first token: the requests
  queued ahead of it are served first, so admitting it moves theirs back only through the longer
  steps of a larger batch, which the prediction of their first tokens does not scale.

The prediction, from the engine's latest statistics and this process's ledger::

    first_token = prefill(prompt tokens queued ahead + this prompt)
                + steps until enough batch slots free * decode_step_seconds
    total       = first_token + expected tokens * decode_step_seconds * max(1, batch / running)

Prompt tokens queued ahead are those of the requests this process admitted whose first token has
not come yet (the ledger: it sees a burst that arrived between two engine steps, which the
engine has not reported), plus, when the engine reports more waiting sequences than that (other
API processes share it), as many more prompts of the same mean length. Slots are needed when the
sequences running, queued ahead and this request's exceed ``max_rolling_batch_size``: the k-th
slot frees after the k-th smallest number of tokens the running sequences are expected to still
generate; beyond one batch, every further batch of queued requests takes their mean expected
length. A sequence is expected to generate the typical length of the sequences that ended here
before it (a moving average; stop tokens end most sequences long before ``max_new_tokens``),
never more than its ``max_new_tokens``; until one has ended, all of ``max_new_tokens``. A
sequence already past the typical length may end any step: it is expected to free its slot now,
so that a refusal is never for a wait longer than what the past suggests.

``prefill(tokens)`` is :func:`.engine_load.prefill_seconds`: whole at the idle prompt speed on an
idle engine, in the engine's decode-step chunks beside running sequences.

A decode step takes longer the more sequences it runs: ``batch`` is the sequences running and
queued ahead with this request's (at most ``max_rolling_batch_size``), and the step time the
engine measured at its ``running`` batch is scaled along the engine's decode curve
(:func:`.engine_load.step_scale`: how decode-only steps grew with the batch on this model and
device; in proportion to the batch while the curve has fewer than two points, a bound from
above). That is what keeps an overloaded engine from admitting more than it can finish in time:
past that point each admission would stretch every step. A speed the engine has not measured
yet (0) adds nothing.

A request that would end in time itself is refused still when the step it stretches would make a
request already admitted miss its deadline, one that would have made it otherwise (its expected
tokens still to come, at the step time with and without the newcomer). That is what holds the
deadlines of the admitted under a flood: each admission, taken alone, is in time, but together
they would stretch every step past what the first ones were admitted for.

Both deadline checks keep ``RESERVE`` (15%) of each deadline in hand. Until a request has ended
here, how long requests run is not known (``max_new_tokens`` is only a bound: a chat request without
``max_tokens`` may have thousands), so only the first token is weighed. ``Retry-After`` is
``ceil(total - deadline)`` (for a stretched request in flight, the time until it is expected to
end; for the first token's wait, ``ceil(first_token - bound)``), at least 1 second: about when
enough of the work ahead will have ended.

**Fairness.** Each request may name its tenant. When any limit would refuse a request, a
tenant holding fewer than its fair share (the queue limit divided by the tenants with requests in
flight, this one included) of this process's requests is admitted still: the refusals fall on the
tenants above their share. A tenant below its share never holds more than that share, so the
requests in flight stay bounded.

Everything here is arithmetic on what is already known: deciding never waits on the engine.
"""

from __future__ import annotations

import math
import time
from collections.abc import Container
from dataclasses import dataclass

from .engine_load import EngineLoad, prefill_seconds, step_scale

RESERVE = 0.15
"""The share of a deadline that admission keeps for what its prediction cannot see: steps that
grow after the decision, the API process's own work on a busy host."""
TYPICAL_WEIGHT = 0.1
"""Weight of each ended request in the typical length."""
QUEUE_FULL = "queue_full"
PREDICTED_DELAY = "predicted_delay"
FIRST_TOKEN_WAIT = "first_token_wait"


@dataclass
class _Entry:
    prompt_tokens: int
    max_new_tokens: int
    width: int
    """Sequences the request runs (``n``, ``best_of``, beams): batch slots it takes."""
    tenant: str | None
    deadline: float | None = None
    """``time.monotonic()`` by which it should end (None: no deadline)."""
    generated: int = 0
    started: bool = False

    def owed(self, typical: float | None) -> float:
        """Tokens each of its sequences is expected to still generate (``typical``: the length
        sequences ended at so far; None: not known yet, all of ``max_new_tokens``)."""
        done = self.generated / self.width
        expected = self.max_new_tokens if typical is None else min(self.max_new_tokens, typical)
        return max(0.0, expected - done)


@dataclass(frozen=True)
class Prediction:
    first_token_s: float
    total_s: float


@dataclass(frozen=True)
class Decision:
    admit: bool
    reason: str = ""
    """Why a request is refused: ``queue_full``, ``predicted_delay`` or ``first_token_wait``."""
    retry_after: int = 0
    prediction: Prediction | None = None
    detail: str = ""


class AdmissionControl:
    """The ledger of this process's requests in flight, and the admission decision."""

    def __init__(self, batch_size: int, limit: int, predictive: bool = True, first_token_wait: float = 0.0):
        self.batch_size = max(1, batch_size)
        self.limit = max(1, limit)
        self.predictive = predictive
        self.first_token_wait = max(0.0, first_token_wait)
        """Seconds a request's first token may be predicted to take (0: no bound)."""
        self._entries: dict[str, _Entry] = {}
        self.typical_tokens: float | None = None
        """Moving average of the tokens a sequence generated, over the requests that ended here."""

    # --- the ledger ------------------------------------------------------------------------
    def admitted(
        self,
        request_id: str,
        prompt_tokens: int,
        max_new_tokens: int,
        width: int = 1,
        tenant: str | None = None,
        deadline: float | None = None,
    ) -> None:
        self._entries[request_id] = _Entry(prompt_tokens, max_new_tokens, max(1, width), tenant, deadline)

    def progressed(self, request_id: str, tokens: int) -> None:
        """The engine sent tokens of the request: it has started."""
        entry = self._entries.get(request_id)
        if entry is not None:
            entry.started = True
            entry.generated += tokens

    def forget(self, request_id: str) -> None:
        entry = self._entries.pop(request_id, None)
        if entry is not None and entry.started:
            length = entry.generated / entry.width
            typical = self.typical_tokens
            self.typical_tokens = length if typical is None else typical + TYPICAL_WEIGHT * (length - typical)

    def prune(self, live: Container[str]) -> None:
        """Forget the requests that are no longer in flight (``live``: the ids still are)."""
        for request_id in [r for r in self._entries if r not in live]:
            self.forget(request_id)

    def __len__(self) -> int:
        return len(self._entries)

    def tenant_requests(self, tenant: str | None) -> int:
        return sum(1 for e in self._entries.values() if e.tenant == tenant)

    # --- the prediction --------------------------------------------------------------------
    def predict(self, prompt_tokens: int, max_new_tokens: int, load: EngineLoad, width: int = 1) -> Prediction:
        """Seconds until a new request's first token, and until its last, were it admitted now."""
        queued = [e for e in self._entries.values() if not e.started]
        started = [e for e in self._entries.values() if e.started]
        own_queued = sum(e.width for e in queued)
        running, queued_seqs = self._running_and_queued(load)
        queued_tokens = sum(e.prompt_tokens for e in queued)
        mean_prompt = queued_tokens / len(queued) if queued else prompt_tokens
        queued_tokens += (queued_seqs - own_queued) * mean_prompt
        step = load.decode_step_seconds
        prefill_s = prefill_seconds(queued_tokens + prompt_tokens, running, load)
        need = running + queued_seqs + max(1, width) - self.batch_size
        slot_s = 0.0
        if need > 0 and step > 0:
            typical = self.typical_tokens
            owed = [e.owed(typical) for e in started for _ in range(e.width)]
            guess = sum(owed) / len(owed) if owed else min(max_new_tokens, typical or max_new_tokens)
            owed = sorted(owed + [guess] * (running - len(owed)))
            if need <= len(owed):
                steps = owed[need - 1]
            else:
                lengths = [e.max_new_tokens for e in queued] or [max_new_tokens]
                mean_new = sum(min(n, typical or n) for n in lengths) / len(lengths)
                steps = (owed[-1] if owed else 0.0) + math.ceil((need - len(owed)) / self.batch_size) * mean_new
            slot_s = steps * step
        first = prefill_s + slot_s
        typical = self.typical_tokens
        expected = max_new_tokens if typical is None else min(max_new_tokens, typical)
        batch = min(self.batch_size, running + queued_seqs + max(1, width))
        step_then = step * step_scale(load, batch, running)
        return Prediction(first_token_s=first, total_s=first + expected * step_then)

    def stretched(self, load: EngineLoad, width: int = 1, now: float | None = None) -> float | None:
        """Seconds until the first request in flight that another ``width`` sequences would make
        miss its deadline is expected to end (None: none would)."""
        step = load.decode_step_seconds
        running, queued = self._running_and_queued(load)
        if step <= 0 or running <= 0:
            return None
        now = time.monotonic() if now is None else now
        batch = min(self.batch_size, running + queued)
        step_now = step * step_scale(load, batch, running)
        step_then = step * step_scale(load, min(self.batch_size, batch + max(1, width)), running)
        victims = []
        for e in self._entries.values():
            if e.deadline is None:
                continue
            owed = e.owed(self.typical_tokens)
            slack = (e.deadline - now) * (1 - RESERVE)
            if owed * step_now <= slack < owed * step_then:
                victims.append(owed * step_now)
        return min(victims) if victims else None

    def _running_and_queued(self, load: EngineLoad) -> tuple[int, int]:
        """Sequences running and queued ahead: what the engine reported, or what this ledger knows
        when that is more (the engine's report is a step old, or from before a restart)."""
        started = sum(e.width for e in self._entries.values() if e.started)
        queued = sum(e.width for e in self._entries.values() if not e.started)
        return max(load.running, started), max(load.waiting, queued)

    def _first_slot_s(self, load: EngineLoad) -> float:
        """Seconds until a running sequence is predicted to end (0: not known)."""
        owed = [e.owed(self.typical_tokens) for e in self._entries.values() if e.started]
        return min(owed) * load.decode_step_seconds if owed else 0.0

    # --- the decision ----------------------------------------------------------------------
    def decide(
        self,
        prompt_tokens: int,
        max_new_tokens: int,
        budget: float | None,
        load: EngineLoad,
        in_flight: int | None = None,
        width: int = 1,
        tenant: str | None = None,
    ) -> Decision:
        """Admit or refuse a request of ``prompt_tokens`` that may take ``budget`` seconds (None:
        no deadline). ``in_flight``: the requests on the engine, when more than this ledger
        knows (other API processes share the engine)."""
        in_flight = max(len(self._entries), in_flight or 0)
        refusal = self._refusal(prompt_tokens, max_new_tokens, budget, load, in_flight, width)
        if refusal.admit or self._below_share(tenant):
            return Decision(True, prediction=refusal.prediction)
        return refusal

    def _refusal(
        self,
        prompt_tokens: int,
        max_new_tokens: int,
        budget: float | None,
        load: EngineLoad,
        in_flight: int,
        width: int,
    ) -> Decision:
        if in_flight >= self.limit:
            wait = self._first_slot_s(load)
            return Decision(
                False,
                QUEUE_FULL,
                max(1, math.ceil(wait)),
                detail=f"{in_flight} requests in flight, as many as max_rolling_batch_size + job_queue_size allow",
            )
        bound = self.first_token_wait
        if not self.predictive or (budget is None and not bound):
            return Decision(True)
        prediction = self.predict(prompt_tokens, max_new_tokens, load, width)
        if budget is None:
            return self._first_token_refusal(prediction) or Decision(True, prediction=prediction)
        # until a request has ended here, how long requests run is not known: max_new_tokens is a
        # bound (a chat request without max_tokens may have thousands), so only the first token counts
        known = self.typical_tokens is not None
        late = (prediction.total_s if known else prediction.first_token_s) - budget * (1 - RESERVE)
        if late <= 0:
            slow = self._first_token_refusal(prediction)
            if slow is not None:
                return slow
            victim = self.stretched(load, width) if known else None
            if victim is None:
                return Decision(True, prediction=prediction)
            return Decision(
                False,
                PREDICTED_DELAY,
                max(1, math.ceil(victim)),
                prediction,
                "the longer steps it would cause are predicted to make a request in flight miss its deadline",
            )
        return Decision(
            False,
            PREDICTED_DELAY,
            max(1, math.ceil(late)),
            prediction,
            f"it is predicted to end in {prediction.total_s:.1f} s (first token in "
            f"{prediction.first_token_s:.1f} s), after its deadline of {budget:g} s",
        )

    def _first_token_refusal(self, prediction: Prediction) -> Decision | None:
        """The refusal of a request whose first token is predicted past ``first_token_wait`` (None:
        within it, or no bound)."""
        bound = self.first_token_wait
        over = prediction.first_token_s - bound
        if not bound or over <= 0:
            return None
        return Decision(
            False,
            FIRST_TOKEN_WAIT,
            max(1, math.ceil(over)),
            prediction,
            f"its first token is predicted in {prediction.first_token_s:.2f} s, later than "
            f"option.max_first_token_wait ({bound:g} s)",
        )

    def _below_share(self, tenant: str | None) -> bool:
        """``tenant`` holds fewer requests in flight than the queue limit shared among the tenants."""
        if tenant is None:
            return False
        tenants = {e.tenant for e in self._entries.values() if e.tenant is not None} | {tenant}
        if len(tenants) < 2:
            return False
        return self.tenant_requests(tenant) < self.limit / len(tenants)

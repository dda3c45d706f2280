"""A request's admission into the engine: checked against what the engine can run, and made into
its :class:`~..scheduling.sequence.Group` (a beam search's first beam, or its ``best_of``
sequences), with the tokens it already generated before the engine that ran it died in place
(:mod:`..runner.replay`), its grammar state past them and its LoRA adapter held."""

from __future__ import annotations

from ... import wire
from ..lora.engine_adapters import EngineAdapters
from ..runner import replay
from ..runner.guided import GuidedDecoder
from ..runner.image_rows import ImageRows
from ..scheduling.sequence import Group, Sequence
from .beam_search import BeamSearch


class RequestRejected(ValueError):
    """The engine cannot take this request (the API layer should have refused it first)."""


class Admission:
    """Requests made into groups for an engine with this vocabulary, ``max_model_len``, grammar
    decoder and adapters."""

    def __init__(
        self,
        vocab_size: int,
        max_model_len: int,
        guided: GuidedDecoder,
        lora: EngineAdapters,
        images: ImageRows | None = None,
    ):
        self.images = images
        """The vision model's step inputs, which check a request's pictures (None: text only)."""
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.guided = guided
        self.lora = lora

    def group(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: wire.SamplingParams,
        adapter: str,
        output_ids: list[int] | tuple[int, ...],
        cumulative_logprob: float,
        deadline: float,
        images: list[wire.ImageInput] | tuple[wire.ImageInput, ...] = (),
    ) -> Group:
        """The request's group, or :class:`RequestRejected` with the reason."""
        if not prompt_ids:
            raise RequestRejected("the prompt is empty")
        if len(prompt_ids) >= self.max_model_len:
            raise RequestRejected(f"the prompt has {len(prompt_ids)} tokens; max_model_len is {self.max_model_len}")
        if max(prompt_ids) >= self.vocab_size or min(prompt_ids) < 0:
            raise RequestRejected("the prompt holds token ids outside the vocabulary")
        if params.num_beams > 1 and params.n > params.num_beams:
            raise RequestRejected(f"n ({params.n}) must not exceed num_beams ({params.num_beams})")
        if images or self.images is not None and any(t in prompt_ids for t in self.images.token_ids):
            why = "this model takes no images" if self.images is None else self.images.check(prompt_ids, list(images))
            if why:
                raise RequestRejected(why)
        group = Group(request_id, params, deadline=deadline, images=tuple(images))
        if images and self.images is not None:
            group.rope = self.images.rope(len(prompt_ids), list(images))
            group.whole_images = self.images.bidirectional
        try:
            if output_ids:
                replay.check(prompt_ids, output_ids, params, self.vocab_size, self.max_model_len)
            if params.guided is not None:
                self.guided.check(params.guided)
        except ValueError as exc:
            raise RequestRejected(str(exc)) from None
        if params.num_beams > 1:
            BeamSearch.start(group, prompt_ids)
        else:
            for index in range(max(params.best_of, params.n, 1)):
                group.sequences.append(Sequence(group, index, list(prompt_ids), len(prompt_ids)))
        if output_ids:
            seq = group.leader
            seq.token_ids.extend(output_ids)
            seq.num_replayed = len(output_ids)
            seq.cumulative_logprob = cumulative_logprob
        try:
            if output_ids and params.guided is not None:
                self.guided.start(group.leader)  # its grammar state past the replayed tokens
            if adapter:
                group.adapter = self.lora.use(adapter)
        except ValueError as exc:
            self.guided.forget(group.leader)
            raise RequestRejected(str(exc)) from None
        return group

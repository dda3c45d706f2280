"""The built-in text-generation handler (``option.rolling_batch=disable``).

Serves LMI's dynamic-batch schema with transformers ``generate``: every prompt of every
request in a dynamic batch becomes one row of a single padded ``generate`` call (streaming
requests share a second call that runs as they are read).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..devices import resolve_device, resolve_dtype, torch_dtype
from ..errors import BadRequest, ValidationFailed
from ..formatters import json_wire, lmi_dynamic
from ..model_store import resolve_model
from .hf_generate import BatchGenerator, GenRow, RowResult, StepToken
from .inputs import Input
from .outputs import Output, fan_out
from .service import service_handle

log = logging.getLogger("lmiserve.text_generation")


@dataclass
class _Request:
    index: int
    prompts: list[str]
    params: lmi_dynamic.DynamicParameters
    rows: list[GenRow]
    stream: bool


def _truthy(value: str | None) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


class TextGenerationService:
    def __init__(self, properties: dict[str, str]):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        started = time.monotonic()
        model_dir = Path(properties.get("model_dir", "."))
        path = resolve_model(properties.get("model_id"), model_dir)
        self.device = resolve_device(properties.get("device", "auto"))
        dtype, why = resolve_dtype(properties.get("dtype", "auto"), self.device)
        trust = _truthy(properties.get("trust_remote_code"))
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype), trust_remote_code=trust)
        self.model.to(self.device).eval()
        config = self.model.config
        eos = config.eos_token_id if config.eos_token_id is not None else self.tokenizer.eos_token_id
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in eos_ids:
            eos_ids.append(self.tokenizer.eos_token_id)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else (eos_ids or [0])[0]
        # LMI parameters decide how to sample; ignore sampling defaults shipped with the weights
        self.model.generation_config = GenerationConfig(eos_token_id=eos_ids, pad_token_id=pad)
        limit = getattr(config, "max_position_embeddings", None) or 2048
        configured = properties.get("max_model_len")
        self.max_model_len = int(configured) if configured else int(limit)
        self.enable_streaming = _truthy(properties.get("enable_streaming"))
        self.generator = BatchGenerator(self.model, self.tokenizer, eos_ids, pad)
        if self.device == "cpu":
            log.info("torch uses %d threads", torch.get_num_threads())
        log.info(
            "loaded %s on %s as %s (%s) in %.1f s; max_model_len %d",
            path,
            self.device,
            dtype,
            why,
            time.monotonic() - started,
            self.max_model_len,
        )

    # --- requests -----------------------------------------------------------------------
    def _prepare(self, index: int, item: Input) -> _Request:
        request = lmi_dynamic.parse_request(item.get_as_bytes())
        params = request.parameters
        rows = []
        for prompt in request.prompts:
            ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
            if not ids:
                raise ValidationFailed("inputs: a prompt must not be empty")
            if len(ids) + params.max_new_tokens > self.max_model_len:
                raise ValidationFailed(
                    f"the prompt has {len(ids)} tokens and max_new_tokens is {params.max_new_tokens}: "
                    f"more than max_model_len ({self.max_model_len})"
                )
            rows.append(GenRow(ids, params))
        stream = request.stream if request.stream is not None else self.enable_streaming
        if stream and params.details and len(rows) > 1:
            raise ValidationFailed("parameters.details: a streamed answer with details takes one prompt")
        return _Request(index, request.prompts, params, rows, stream)

    def handle(self, inputs: Input) -> Output:
        output = Output()
        requests: list[_Request] = []
        for index, item in enumerate(inputs.get_batches()):
            try:
                requests.append(self._prepare(index, item))
            except (BadRequest, ValidationFailed) as exc:
                # LMI's dynamic-batch schema: every error is 424 {"code", "message", "error"}
                output.error(exc.detail, batch_index=index)
        direct = [r for r in requests if not r.stream]
        streamed = [r for r in requests if r.stream]
        if direct:
            self._answer(direct, output)
        if streamed:
            sources = fan_out(self._stream(streamed), len(streamed))
            for request, source in zip(streamed, sources):
                output.add_stream_content(source, batch_index=request.index)
                output.add_property("Content-Type", lmi_dynamic.STREAM_CONTENT_TYPE, batch_index=request.index)
        return output

    def _answer(self, requests: list[_Request], output: Output) -> None:
        rows = [row for r in requests for row in r.rows]
        try:
            prefills = self._prefills(rows)
            results = self.generator.run(rows)
        except Exception as exc:  # noqa: BLE001 - the requests of this call fail, the worker lives on
            log.exception("generation failed")
            for r in requests:
                output.error(f"generation failed: {type(exc).__name__}: {exc}", batch_index=r.index)
            return
        start = 0
        for r in requests:
            mine: list[RowResult] = results[start : start + len(r.rows)]
            start += len(r.rows)
            texts = [self._full(p, res.text, r.params) for p, res in zip(r.prompts, mine)]
            if r.params.details:
                answers = [
                    lmi_dynamic.detailed_answer(
                        text,
                        res.finish_reason,
                        [_token(t) for t in res.tokens],
                        prefills.get(start - len(mine) + i),
                        [self._top(t) for t in res.tokens] if r.params.top_n_tokens else None,
                    )
                    for i, (text, res) in enumerate(zip(texts, mine))
                ]
                output.add(json_wire.dumps(answers), batch_index=r.index)
            else:
                output.add(lmi_dynamic.format_response(texts), batch_index=r.index)
            output.add_property("Content-Type", lmi_dynamic.CONTENT_TYPE, batch_index=r.index)

    def _prefills(self, rows: list[GenRow]) -> dict[int, list[dict[str, Any]]]:
        """The prompt tokens of each row that asked for them (``decoder_input_details`` with
        ``details``), with their log-probabilities, by row."""
        out = {}
        for i, row in enumerate(rows):
            if row.params.details and row.params.decoder_input_details:
                values = self.generator.prompt_logprobs(row.prompt_ids)
                out[i] = [
                    lmi_dynamic.token_object(t, self.tokenizer.decode([t]), lp) for t, lp in zip(row.prompt_ids, values)
                ]
        return out

    @staticmethod
    def _full(prompt: str, text: str, params: lmi_dynamic.DynamicParameters) -> str:
        return prompt + text if params.return_full_text else text

    def _stream(self, requests: list[_Request]) -> Iterator[list[bytes | None]]:
        """Per step, one jsonlines line per request (None when it has nothing new)."""
        rows = [row for r in requests for row in r.rows]
        steps: queue.Queue[tuple[str, Any]] = queue.Queue()
        prefills: dict[int, list[dict[str, Any]]] = {}

        def work() -> None:
            try:
                prefills.update(self._prefills(rows))  # before the first step is read
                steps.put(("done", self.generator.run(rows, on_step=lambda d: steps.put(("step", d)))))
            except BaseException as exc:  # noqa: BLE001 - handed to the reader
                steps.put(("error", exc))

        threading.Thread(target=work, name="generate", daemon=True).start()
        first = [True] * len(rows)
        made = [0] * len(rows)
        full = [""] * len(rows)
        while True:
            kind, payload = steps.get()
            if kind == "error":
                raise payload
            if kind == "done":
                return
            lines: list[bytes | None] = []
            start = 0
            for r in requests:
                deltas = payload[start : start + len(r.rows)]
                if r.params.details:  # one row (see _prepare)
                    lines.append(self._detailed_line(r, deltas[0], start, made, full, prefills.get(start)))
                    start += 1
                    continue
                texts = []
                for offset, step in enumerate(deltas):
                    delta = None if step is None else step.text
                    row = start + offset
                    text = delta or ""
                    if first[row] and delta is not None and r.params.return_full_text:
                        text = r.prompts[offset] + text
                    first[row] = first[row] and delta is None
                    texts.append(text)
                start += len(r.rows)
                lines.append(lmi_dynamic.format_stream_line(texts) if any(texts) else None)
            yield lines

    def _detailed_line(  # noqa: PLR0913 - one row's running state
        self,
        r: _Request,
        step: StepToken | None,
        row: int,
        made: list[int],
        full: list[str],
        prefill: list[dict[str, Any]] | None,
    ) -> bytes | None:
        if step is None:
            return None
        made[row] += 1
        full[row] += step.text
        text = self._full(r.prompts[0], full[row], r.params) if step.finish_reason is not None else None
        top = self._top(step) if r.params.top_n_tokens else None
        return lmi_dynamic.detailed_stream_line(_token(step), text, step.finish_reason, made[row], prefill, top)

    def _top(self, step: StepToken) -> list[dict[str, Any]]:
        return [lmi_dynamic.token_object(t, self.tokenizer.decode([t]), lp) for t, lp in step.top or []]


def _token(step: StepToken) -> dict[str, Any]:
    return lmi_dynamic.token_object(step.id, step.text, step.logprob)


handle = service_handle(TextGenerationService)
"""DJL's entry point: the first call (the model's properties) builds the service."""

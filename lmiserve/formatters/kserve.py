"""KServe V2 (Open Inference Protocol) for text generation: tensors in, tensors out.

An inference request carries a BYTES ``text_input`` tensor, one prompt per element; the
answer is a BYTES ``text_output`` tensor of the same shape, one generated text per prompt.
Generation parameters come from the request's ``parameters``, then the ``text_input``
tensor's ``parameters``, then optional one-element input tensors named after a parameter
(``max_tokens``, ``temperature``, ``stop_words``..., or ``sampling_parameters``: a JSON
object); later sources win. Generation parameters of other servers that these routes do not apply
(``n``, ``best_of``, ``logprobs``, ``details``...: :data:`NOT_APPLIED`) are refused by name; other
unknown parameters (the protocol's own, such as ``binary_data_output``) are ignored, unknown
inputs are refused.

REST bodies may use the binary tensor extension: with ``Inference-Header-Content-Length: N``
the first N bytes are the JSON header and the rest holds the tensors whose ``parameters``
give a ``binary_data_size``. BYTES elements travel as a 4-byte little-endian length and the
bytes, the layout of gRPC's ``raw_input_contents`` too. The generate extension takes
``{"text_input", "parameters"}`` and answers ``{"model_name", "model_version", "text_output"}``
(``generate_stream``: one SSE event per piece of text).
"""

from __future__ import annotations

import csv
import uuid
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictStr, model_validator

from ..errors import BadRequest
from ..generation.request import GenerationRequest
from ..wire import SamplingParams
from .kserve_tensors import (  # noqa: F401 - the tensor types belong to this protocol's API
    BYTES,
    CONTENTS_FIELD,
    DATATYPES,
    MAX_U64,
    InferRequest,
    InferResponse,
    OutputTensor,
    RequestedOutput,
    Tensor,
    decode_bytes,
    decode_raw,
    encode_bytes,
    encode_raw,
    flatten,
    make_tensor,
)
from .validation import validated

SERVER_NAME = "lmiserve"
EXTENSIONS = ("generate", "binary_tensor_data")
MODEL_VERSION = "1"


def new_request_id() -> str:
    return uuid.uuid4().hex


PLATFORM = "pytorch_torchscript"
"""The only PyTorch name among the platforms the protocol allows (``<framework>_<format>``); the field
is for information only."""
TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
HEADER_LENGTH = "Inference-Header-Content-Length"
SSE = "text/event-stream"
DEFAULT_MAX_TOKENS = 16
MAX_I32 = 2**31 - 1


# --- requests ----------------------------------------------------------------------------


def split_binary(body: bytes, header_length: str | None) -> tuple[dict[str, Any], bytes]:
    """A REST body as its JSON header and binary section (empty without the extension)."""
    size = len(body)
    if header_length is not None:
        if not header_length.strip().isdigit() or int(header_length) > len(body):
            raise BadRequest(f"{HEADER_LENGTH} must be a byte count within the body (got {header_length!r})")
        size = int(header_length)
    try:
        data = orjson.loads(body[:size])
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("the inference request must be a JSON object with 'inputs'")
    return data, body[size:]


def object_field(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"{what} must be an object")
    return value


def parse_infer(data: dict[str, Any], binary: bytes = b"") -> InferRequest:
    """A REST inference request (already parsed JSON), its binary tensors taken from ``binary``."""
    inputs = data.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise BadRequest("'inputs' must be a non-empty list of tensors")
    request_id = data.get("id", "")
    if not isinstance(request_id, str):
        raise BadRequest("'id' must be a string")
    tensors, offset = [], 0
    for item in inputs:
        item = object_field(item, "each input")
        name, params = item.get("name"), object_field(item.get("parameters"), "input parameters")
        size = params.pop("binary_data_size", None)
        if size is not None:
            if type(size) is not int or size < 0 or offset + size > len(binary):
                raise BadRequest(f"input {name!r}: binary_data_size {size!r} runs past the binary data")
            elements = decode_raw(str(item.get("datatype")), binary[offset : offset + size], str(name))
            offset += size
        elif "data" in item:
            elements = flatten(item["data"])
        else:
            raise BadRequest(f"input {name!r} has no 'data'")
        tensors.append(make_tensor(name, item.get("datatype"), item.get("shape"), elements, params))
    if offset != len(binary):
        raise BadRequest(f"{len(binary) - offset} bytes of binary data belong to no input")
    outputs = data.get("outputs")
    if outputs is not None and not isinstance(outputs, list):
        raise BadRequest("'outputs' must be a list")
    requested = None
    if outputs:
        requested = []
        for o in outputs:
            o = object_field(o, "each output")
            if not isinstance(o.get("name"), str):
                raise BadRequest("every requested output needs a 'name'")
            requested.append(RequestedOutput(o["name"], object_field(o.get("parameters"), "output parameters")))
    return InferRequest(request_id, tensors, object_field(data.get("parameters"), "'parameters'"), requested)


_ALIASES = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "random_seed": "seed",
    "stop_words": "stop",
    "stop_sequences": "stop",
    "adapter": "lora_name",
    "adapter_id": "lora_name",
}


class GenerateParameters(BaseModel):
    """The generation parameters this server applies (:data:`NOT_APPLIED` is refused, others ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    max_tokens: int = Field(DEFAULT_MAX_TOKENS, ge=1, le=MAX_I32)
    min_tokens: int = Field(0, ge=0, le=MAX_I32)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, le=MAX_I32)
    min_p: float = Field(0.0, ge=0, le=1)
    typical_p: float = Field(1.0, gt=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    seed: int | None = Field(None, ge=0, le=MAX_U64)
    do_sample: bool | None = None
    stop: tuple[StrictStr, ...] = ()
    bad_words: tuple[StrictStr, ...] = ()
    """Texts the output never contains (TensorRT-LLM's Triton input: a list, or one string of
    comma-separated words)."""
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    return_full_text: bool = False
    lora_name: StrictStr | None = None
    """The LoRA adapter to generate with (the name Triton's vLLM backend reads; ``adapter`` and
    ``adapter_id`` are the same); empty: the base model."""

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if v is not None}
        for alias, name in _ALIASES.items():
            if alias in data:
                data.setdefault(name, data.pop(alias))
        if "exclude_input_in_output" in data:
            data.setdefault("return_full_text", not data.pop("exclude_input_in_output"))
        if isinstance(data.get("stop"), str):
            data["stop"] = [data["stop"]]
        if isinstance(data.get("stop"), list):
            data["stop"] = [s for s in data["stop"] if s != ""]
        if isinstance(data.get("bad_words"), str):
            data["bad_words"] = next(csv.reader([data["bad_words"]]), [])
        if isinstance(data.get("bad_words"), list):
            data["bad_words"] = [w for w in data["bad_words"] if w != ""]
        return data

    @property
    def sampling(self) -> bool:
        """Temperature 0 is greedy; otherwise ``do_sample``, or sampling when any sampling
        parameter is given."""
        if self.temperature == 0:
            return False
        if self.do_sample is not None:
            return self.do_sample
        return self.temperature is not None or self.top_p is not None or (self.top_k or 0) > 0

    def request(self, prompt: str) -> GenerationRequest:
        sampling = self.sampling
        return GenerationRequest(
            prompt=prompt,
            params=SamplingParams(
                max_new_tokens=self.max_tokens,
                do_sample=sampling,
                temperature=self.temperature if sampling and self.temperature else 1.0,
                top_k=max(self.top_k or 0, 0),
                top_p=self.top_p or 1.0,
                min_p=self.min_p,
                typical_p=self.typical_p,
                repetition_penalty=self.repetition_penalty,
                presence_penalty=self.presence_penalty,
                frequency_penalty=self.frequency_penalty,
                seed=None if self.seed is None else self.seed % 2**63,
                stop_token_ids=list(self.stop_token_ids),
                ignore_eos=self.ignore_eos,
                min_new_tokens=self.min_tokens,
                bad_words=list(self.bad_words),
            ),
            stop=list(self.stop),
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            adapter=self.lora_name or None,
        )


PARAMETER_INPUTS = frozenset(GenerateParameters.model_fields) | {
    *_ALIASES,
    "exclude_input_in_output",
    "stream",
}


NOT_APPLIED = frozenset({
    "n", "best_of", "logprobs", "prompt_logprobs", "details", "decoder_input_details", "top_n_tokens",
    "use_beam_search", "num_beams", "beam_width", "length_penalty", "early_stopping", "return_log_probs",
    "return_context_logits", "return_generation_logits", "return_perf_metrics", "guided_decoding",
    "structured_outputs", "response_format", "grammar", "watermark", "truncate", "truncate_prompt_tokens",
    "num_return_sequences", "output_log_probs",
})  # fmt: skip
"""Generation parameters of other servers' V2 routes (vLLM's, TensorRT-LLM's and TGI's) that these
routes do not apply: refused by name, never ignored (one text per prompt, no log-probabilities)."""


def parameters(merged: dict[str, Any]) -> GenerateParameters:
    """The generation parameters; one this server does not apply is a 400 naming it."""
    refused = sorted(k for k, v in merged.items() if k in NOT_APPLIED and v is not None)
    if refused:
        raise BadRequest(
            f"parameters.{refused[0]}: not applied by this server's KServe V2 routes, which answer one text "
            f"a prompt (refused: {', '.join(refused)})"
        )
    return validated(GenerateParameters, merged, "parameters.")


def server_metadata(version: str) -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": version, "extensions": list(EXTENSIONS)}


def model_metadata(name: str, generates_text: bool) -> dict[str, Any]:
    """A model's metadata; models served by a custom handler list no tensors."""
    if not generates_text:
        return {"name": name, "versions": [MODEL_VERSION], "platform": PLATFORM, "inputs": [], "outputs": []}
    return {
        "name": name,
        "versions": [MODEL_VERSION],
        "platform": PLATFORM,
        "inputs": [{"name": TEXT_INPUT, "datatype": BYTES, "shape": [-1]}],
        "outputs": [{"name": TEXT_OUTPUT, "datatype": BYTES, "shape": [-1]}],
    }

"""vLLM's structured output fields on the OpenAI routes, as one engine constraint.

``structured_outputs`` holds exactly one of ``json`` (a JSON schema, as an object or a JSON
string), ``regex``, ``choice`` (a list of strings), ``grammar`` (EBNF as xgrammar reads it),
``json_object`` (true) or ``structural_tag`` (xgrammar's structural tag). vLLM's older top-level
fields ``guided_json``, ``guided_regex``, ``guided_choice`` and ``guided_grammar`` say the same;
``guided_decoding_backend`` (a string) and ``guided_whitespace_pattern`` are accepted and ignored.

A request constrains its output one way: two of these fields, or one of them with a non-text
``response_format`` or a forced tool call, is refused, naming the fields.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, model_validator

from ..wire import GuidedDecoding

CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
GUIDED_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
"""vLLM's older top-level fields and the ``structured_outputs`` key each stands for."""


def constraint(key: str, value: Any, where: str) -> GuidedDecoding:
    """The engine's constraint for one ``structured_outputs`` key (``where`` names the field in errors)."""
    if key == "json":
        schema = value
        if isinstance(value, str):
            try:
                schema = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where} is not valid JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise ValueError(f"{where} must be a JSON schema object")
        return GuidedDecoding("json_schema", json.dumps(schema))
    if key in ("regex", "grammar"):
        if not value:
            raise ValueError(f"{where} must not be empty")
        return GuidedDecoding(key, value)
    if key == "choice":
        if not value:
            raise ValueError(f"{where} must hold at least one choice")
        return GuidedDecoding("choice", json.dumps(list(value)))
    if key == "json_object":
        if value is not True:
            raise ValueError(f"{where} must be true (leave it out for no constraint)")
        return GuidedDecoding("json_object")
    if key == "structural_tag":
        return GuidedDecoding("structural_tag", value if isinstance(value, str) else json.dumps(value))
    raise ValueError(f"{where}: unknown constraint")


class StructuredOutputs(BaseModel):
    """vLLM's ``structured_outputs`` object."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    schema_: dict[str, Any] | StrictStr | None = Field(None, alias="json")
    regex: StrictStr | None = None
    choice: list[StrictStr] | None = None
    grammar: StrictStr | None = None
    json_object: StrictBool | None = None
    structural_tag: StrictStr | dict[str, Any] | None = None
    # accepted as vLLM does; our JSON grammars never allow whitespace between tokens anyway
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    def given(self) -> dict[str, Any]:
        """The constraint keys that are set, with their values."""
        values = {"json": self.schema_, **{k: getattr(self, k) for k in CONSTRAINTS if k != "json"}}
        return {k: v for k, v in values.items() if v is not None}

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = self.given()
        if len(given) > 1:
            raise ValueError(f"takes one constraint, not {' and '.join(given)}")
        if not given:
            raise ValueError(f"needs one of {', '.join(CONSTRAINTS)}")
        self.guided()  # a value that cannot be a constraint fails here
        return self

    def guided(self) -> GuidedDecoding:
        ((key, value),) = self.given().items()
        return constraint(key, value, key)


class StructuredOutputFields(BaseModel):
    """The request fields above, for the OpenAI request models to inherit.

    A subclass names its own fields that constrain the output too in :meth:`other_constraints`."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | StrictStr | None = None
    guided_regex: StrictStr | None = None
    guided_choice: list[StrictStr] | None = None
    guided_grammar: StrictStr | None = None
    guided_decoding_backend: StrictStr | None = None
    guided_whitespace_pattern: StrictStr | None = None

    def other_constraints(self) -> list[str]:
        """The request's other fields that constrain its output (``response_format``, ``tool_choice``)."""
        return []

    def constraint_fields(self) -> list[str]:
        """Every field of the request that constrains its output."""
        named = self.other_constraints()
        if self.structured_outputs is not None:
            named.append("structured_outputs")
        return named + [name for name in GUIDED_FIELDS if getattr(self, name) is not None]

    @model_validator(mode="after")
    def _one_constraint(self) -> StructuredOutputFields:
        named = self.constraint_fields()
        if len(named) > 1:
            listed = ", ".join(named[:-1]) + " and " + named[-1]
            raise ValueError(f"{listed} each constrain the output; send only one of them")
        self.structured_guided()  # a value that cannot be a constraint fails here
        return self

    def structured_guided(self) -> GuidedDecoding | None:
        """The constraint ``structured_outputs`` or a ``guided_*`` field asks for, if any."""
        if self.structured_outputs is not None:
            return self.structured_outputs.guided()
        for name, key in GUIDED_FIELDS.items():
            value = getattr(self, name)
            if value is not None:
                return constraint(key, value, name)
        return None

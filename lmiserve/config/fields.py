"""One declaration per setting: its ``serving.properties`` key, environment names and CLI flag.

A setting is a pydantic field whose ``json_schema_extra`` carries its metadata. Everything
else (the environment mapping, ``config show``, the table in ``docs/configuration.md``, error messages) is
derived from these declarations.
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic.fields import FieldInfo

MIB = 1024 * 1024


@dataclass(frozen=True)
class EnvAlias:
    """An environment variable that sets a key under another name, optionally scaled."""

    name: str
    scale: int = 1


@dataclass(frozen=True)
class KeySpec:
    """Everything known about one configuration key."""

    key: str
    area: str
    field_name: str
    info: FieldInfo
    model: type[BaseModel]
    env: str
    aliases: tuple[EnvAlias, ...] = ()
    key_aliases: tuple[str, ...] = ()
    cli: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def doc(self) -> str:
        return self.info.description or ""

    @property
    def default(self) -> Any:
        return self.info.get_default(call_default_factory=True)


class Area(BaseModel):
    """One area of the settings (server, model, engine): a frozen pydantic model of settings."""

    model_config = ConfigDict(extra="forbid", validate_default=False, frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _blank_is_unset(cls, v: object, info: ValidationInfo) -> object:
        """Blank text leaves an :func:`optional_setting` unset (None)."""
        if isinstance(v, str) and not v.strip() and _extra(cls.model_fields[str(info.field_name)]).get("optional"):
            return None
        return v


def _extra(info: FieldInfo) -> dict[str, Any]:
    return info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}


def setting(
    default: Any,
    key: str,
    doc: str,
    *,
    env_aliases: tuple[EnvAlias | str, ...] = (),
    key_aliases: tuple[str, ...] = (),
    cli: str | None = None,
    allowed: str | None = None,
    **constraints: Any,
) -> Any:
    """Declare a setting: a pydantic ``Field`` tagged with its key and aliases.

    ``allowed`` overrides the description of accepted values derived from the type.
    """
    aliases = tuple(a if isinstance(a, EnvAlias) else EnvAlias(a) for a in env_aliases)
    extra = {"key": key, "env_aliases": aliases, "key_aliases": key_aliases, "cli": cli, "allowed": allowed}
    return Field(default, description=doc, json_schema_extra=extra, **constraints)  # type: ignore[arg-type]


def optional_setting(key: str, doc: str, **kwargs: Any) -> Any:
    """Declare a setting that is unset (None) unless given a value; blank text leaves it unset."""
    info = setting(None, key, doc, **kwargs)
    info.json_schema_extra["optional"] = True
    return info


def env_name(key: str) -> str:
    """``option.entryPoint`` -> ``OPTION_ENTRYPOINT``; ``job_queue_size`` -> ``SERVING_JOB_QUEUE_SIZE``."""
    if key.startswith("option."):
        return "OPTION_" + key[len("option.") :].upper()
    return "SERVING_" + key.upper()


def normalize_key(key: str) -> str:
    """Case- and punctuation-insensitive form used to match env names to keys."""
    return re.sub(r"[^a-z0-9]", "", key.lower())


def key_specs(area: str, model: type[BaseModel]) -> list[KeySpec]:
    specs = []
    for name, info in model.model_fields.items():
        extra = info.json_schema_extra
        if not isinstance(extra, dict) or "key" not in extra:
            continue
        key = str(extra["key"])
        specs.append(
            KeySpec(
                key=key,
                area=area,
                field_name=name,
                info=info,
                model=model,
                env=env_name(key),
                aliases=tuple(extra.get("env_aliases") or ()),  # type: ignore[arg-type]
                key_aliases=tuple(extra.get("key_aliases") or ()),  # type: ignore[arg-type]
                cli=extra.get("cli"),  # type: ignore[arg-type]
            )
        )
    return specs


def _describe_type(tp: Any) -> list[str]:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return [", ".join(str(v) for v in typing.get_args(tp))]
    if origin in (typing.Union, types.UnionType):
        parts: list[str] = []
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            parts.extend(_describe_type(arg))
        return parts
    if tp is bool:
        return ["true or false"]
    if tp is int:
        return ["an integer"]
    if tp is float:
        return ["a number"]
    if tp is str:
        return ["a string"]
    return [getattr(tp, "__name__", str(tp))]


def describe_allowed(info: FieldInfo) -> str:
    """Human description of what a field accepts, from its type and bounds."""
    extra = _extra(info)
    if extra.get("allowed"):
        return str(extra["allowed"])
    parts = _describe_type(info.annotation)
    bounds = []
    for meta in info.metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(meta, attr, None)
            if value is not None:
                bounds.append(f"{sym} {value}")
    text = " or ".join(parts)
    if bounds:
        text += " " + " and ".join(bounds)
    return text


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}


def parse_size(value: object) -> int:
    """``2GiB``, ``512MiB``, ``1.5GB`` or a number of bytes."""
    if isinstance(value, int):
        return value
    match = _SIZE.match(str(value))
    if not match or (match.group(2) or "").lower() not in _UNITS:
        raise ValueError("not a size")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])

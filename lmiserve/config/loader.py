"""Resolve ``serving.properties``, the environment and CLI flags into validated settings.

Precedence, as DJL Serving documents it: a key set in ``serving.properties`` wins over the
environment, which fills in only the keys the file is silent on (there ``OPTION_*`` /
``SERVING_*`` win over the LMI/SageMaker alias variables ``HF_MODEL_ID``,
``SAGEMAKER_BIND_TO_PORT``...); CLI flags win over both. Every resolved value remembers where
it came from, for ``lmiserve config show``.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .fields import KeySpec, describe_allowed, key_specs, normalize_key
from .properties import read_properties
from .schema import AREAS, OTHER_BACKENDS, EngineSettings, MediaSettings, ModelSettings, ServerSettings

PROPERTIES_FILE = "serving.properties"


class ConfigError(ValueError):
    """A setting has a value that is not allowed; the message is one line for the user."""


@dataclass(frozen=True)
class Source:
    kind: str  # default | file | env | cli
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.detail}".strip()


@dataclass
class Settings:
    server: ServerSettings
    model: ModelSettings
    engine: EngineSettings
    model_dir: Path
    properties_file: Path | None
    model_name: str
    sources: dict[str, Source] = field(default_factory=dict)
    raw: dict[str, str] = field(default_factory=dict)
    unknown: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    media: MediaSettings = field(default_factory=MediaSettings)

    def area(self, name: str) -> Any:
        return getattr(self, name)

    def value(self, key: str) -> Any:
        spec = SPECS_BY_KEY[key]
        return getattr(self.area(spec.area), spec.field_name)

    def handler_properties(self) -> dict[str, str]:
        """The model's properties as a handler sees them: ``option.`` stripped, values as strings."""
        props: dict[str, str] = {}
        for spec in SPECS:
            if spec.area == "server":
                continue
            value = self.value(spec.key)
            if value is not None:
                props[_handler_key(spec.key)] = _to_text(value)
        for key, value in self.unknown.items():
            props[_handler_key(key)] = value
        props["model_dir"] = str(self.model_dir)
        props["model_name"] = self.model_name
        return props


def _handler_key(key: str) -> str:
    return key[len("option.") :] if key.startswith("option.") else key


def _to_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


SPECS: list[KeySpec] = [spec for area, model in AREAS.items() for spec in key_specs(area, model)]
SPECS_BY_KEY: dict[str, KeySpec] = {spec.key: spec for spec in SPECS}
SPECS_BY_FIELD: dict[tuple[str, str], KeySpec] = {(spec.area, spec.field_name): spec for spec in SPECS}
"""By area and field name: ``("engine", "block_size")`` -> ``option.block_size``."""
_BY_NORMALIZED: dict[str, KeySpec] = {}
for _spec in SPECS:
    _BY_NORMALIZED[normalize_key(_spec.key)] = _spec
    for _alias in _spec.key_aliases:
        _BY_NORMALIZED[normalize_key(_alias)] = _spec


def canonical_key(key: str) -> str | None:
    """The known key a spelling refers to (case and punctuation insensitive), or None."""
    spec = _BY_NORMALIZED.get(normalize_key(key))
    if spec is None:
        return None
    # an option key must be written with its prefix, a server key without (or as an accepted alias)
    is_option = key.lower().startswith("option.")
    if any(form.startswith("option.") == is_option for form in (spec.key, *spec.key_aliases)):
        return spec.key
    return None


def nearest_key(key: str) -> str | None:
    candidates = [spec.key for spec in SPECS] + [a for spec in SPECS for a in spec.key_aliases]
    match = difflib.get_close_matches(key, candidates, n=1, cutoff=0.75)
    if not match:
        lowered = {c.lower(): c for c in candidates}
        match = difflib.get_close_matches(key.lower(), list(lowered), n=1, cutoff=0.75)
        match = [lowered[m] for m in match]
    if not match:
        return None
    return canonical_key(match[0]) or match[0]


def _env_layers(
    env: Mapping[str, str],
) -> tuple[dict[str, tuple[str, Source]], dict[str, tuple[str, Source]], list[str]]:
    """Split the environment into (alias layer, OPTION_/SERVING_ layer, warnings)."""
    aliases: dict[str, tuple[str, Source]] = {}
    for spec in SPECS:
        # later aliases in a declaration have lower priority: apply them first
        for alias in reversed(spec.aliases):
            if alias.name in env and env[alias.name].strip() != "":
                raw = env[alias.name].strip()
                if alias.scale != 1:
                    try:
                        raw = str(int(float(raw) * alias.scale))
                    except ValueError:
                        pass
                aliases[spec.key] = (raw, Source("env", alias.name))
    direct: dict[str, tuple[str, Source]] = {}
    warnings: list[str] = []
    for name, value in env.items():
        if name.startswith("OPTION_") and len(name) > len("OPTION_"):
            suffix = name[len("OPTION_") :]
            key = canonical_key("option." + suffix) or "option." + suffix.lower()
            direct[key] = (value, Source("env", name))
        elif name.startswith("SERVING_") and len(name) > len("SERVING_"):
            suffix = name[len("SERVING_") :]
            key = canonical_key(suffix)
            if key is not None:
                direct[key] = (value, Source("env", name))
            else:
                hint = nearest_key(suffix.lower())
                warnings.append(
                    f"unknown environment variable {name}" + (f" (did you mean {hint}?)" if hint else "") + "; ignored"
                )
    return aliases, direct, warnings


def _file_layer(path: Path) -> tuple[dict[str, tuple[str, Source]], list[str]]:
    layer: dict[str, tuple[str, Source]] = {}
    for key, value in read_properties(path).items():
        layer[canonical_key(key) or key] = (value, Source("file", str(path)))
    return layer, []


def _validation_message(err: ValidationError, area: str, merged: dict[str, tuple[str, Source]]) -> str:
    first = err.errors()[0]
    loc = first.get("loc") or ()
    field_name = str(loc[0]) if loc else ""
    model = AREAS[area]
    spec = SPECS_BY_FIELD.get((area, field_name))
    if spec is None:
        msg = str(first.get("msg", "invalid settings"))
        return msg.removeprefix("Value error, ")
    value, source = merged.get(spec.key, (first.get("input"), Source("default")))
    allowed = describe_allowed(model.model_fields[field_name])
    return f"invalid value for {spec.key}: {value!r} (set by {source}); allowed: {allowed}"


def default_model_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the model lives when no --model-dir is given.

    SageMaker mounts models at /opt/ml/model (or $SM_MODEL_DIR); elsewhere the current directory.
    """
    env = os.environ if env is None else env
    for candidate in (env.get("SM_MODEL_DIR"), "/opt/ml/model"):
        if candidate and Path(candidate).is_dir() and any(Path(candidate).iterdir()):
            return Path(candidate)
    return Path.cwd()


def _derive_model_name(model_dir: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", model_dir.resolve().name) or "model"
    return name


def load_settings(
    model_dir: str | Path | None = None,
    properties_file: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    cli: Mapping[str, Any] | None = None,
) -> Settings:
    """Resolve and validate every setting. Raises :class:`ConfigError` on a bad value."""
    env = dict(os.environ if env is None else env)
    directory = Path(model_dir) if model_dir is not None else default_model_dir(env)
    if not directory.is_dir():
        raise ConfigError(f"model directory {str(directory)!r} does not exist")
    props_path: Path | None
    if properties_file is not None:
        props_path = Path(properties_file)
        if not props_path.is_file():
            raise ConfigError(f"properties file {str(props_path)!r} does not exist")
    else:
        props_path = directory / PROPERTIES_FILE
        if not props_path.is_file():
            props_path = None

    warnings: list[str] = []
    merged: dict[str, tuple[str, Source]] = {}
    if props_path is not None:
        layer, w = _file_layer(props_path)
        merged.update(layer)
        warnings += w
    alias_layer, direct_layer, w = _env_layers(env)
    env_layer = {**alias_layer, **direct_layer}
    for key, entry in env_layer.items():
        if key not in merged:  # the file wins; the environment fills in what it leaves unset
            merged[key] = entry
    warnings += w
    for key, value in (cli or {}).items():
        if value is not None:
            merged[key] = (str(value), Source("cli", SPECS_BY_KEY[key].cli or key))

    rolling = merged.get("option.rolling_batch")
    if rolling is not None and rolling[0].strip().lower() in OTHER_BACKENDS:
        warnings.append(
            f"option.rolling_batch={rolling[0]} (set by {rolling[1]}): {OTHER_BACKENDS[rolling[0].strip().lower()]} "
            "is not part of lmiserve; the model starts as with option.rolling_batch=auto (lmiserve's engine where "
            "it runs the architecture, else an installed vLLM, else transformers generate)"
        )
    values: dict[str, dict[str, str]] = {area: {} for area in AREAS}
    unknown: dict[str, str] = {}
    for key, (value, source) in merged.items():
        spec = SPECS_BY_KEY.get(key)
        if spec is not None:
            values[spec.area][spec.field_name] = value
            continue
        unknown[key] = value
        hint = nearest_key(key)
        where = f"{source}"
        if key.startswith("option.") and hint is None:
            continue  # a handler's own option: passed through silently
        msg = f"unknown key {key} (set by {where})"
        msg += f"; did you mean {hint}?" if hint else ""
        msg += " It is passed to the handler unchanged." if key.startswith("option.") else " It is ignored."
        warnings.append(msg)

    built: dict[str, Any] = {}
    for area, model in AREAS.items():
        try:
            built[area] = model.model_validate(values[area])
        except ValidationError as err:
            raise ConfigError(_validation_message(err, area, merged)) from None

    sources = {spec.key: merged[spec.key][1] if spec.key in merged else Source("default") for spec in SPECS}
    model_settings: ModelSettings = built["model"]
    name = model_settings.model_name or _derive_model_name(directory)
    return Settings(
        server=built["server"],
        model=model_settings,
        engine=built["engine"],
        media=built["media"],
        model_dir=directory.resolve(),
        properties_file=props_path.resolve() if props_path else None,
        model_name=name,
        sources=sources,
        raw={k: v for k, (v, _) in merged.items()},
        unknown=unknown,
        warnings=warnings,
    )

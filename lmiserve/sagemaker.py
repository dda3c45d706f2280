"""Deploying lmiserve from the SageMaker Python SDK (``pip install 'lmiserve[sagemaker]'``).

:class:`LmiServeModel` is the SDK's ``sagemaker.model.Model`` for our image: ``serving.properties``
keys become the environment variables the container reads (``OPTION_*``, ``SERVING_*``), checked
against the keys lmiserve knows; deploying gives the endpoint the health-check and download timeouts
a large model needs, the least-outstanding-requests routing an LLM needs, and returns an
:class:`LmiServePredictor`: JSON in and out, and :meth:`LmiServePredictor.stream` for
``InvokeEndpointWithResponseStream``, one parsed JSON line at a time.

For a multi-model endpoint use the SDK's ``MultiDataModel`` with ``model=LmiServeModel(...,
multi_model=True)``; each ``model.tar.gz`` under its prefix is one model directory, invoked with
``predictor.predict(data, target_model="NAME.tar.gz")``. For inference components, pass
``endpoint_type=EndpointType.INFERENCE_COMPONENT_BASED`` and ``resources=ResourceRequirements(...)``
to :meth:`LmiServeModel.deploy`, as the SDK documents; the predictor then names its component.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from sagemaker.deserializers import JSONDeserializer
from sagemaker.iterators import LineIterator
from sagemaker.model import Model
from sagemaker.predictor import Predictor
from sagemaker.serializers import JSONSerializer

from .config.fields import env_name
from .config.loader import SPECS_BY_KEY, canonical_key, nearest_key
from .deploy.spec import DEFAULT_DOWNLOAD_TIMEOUT, DEFAULT_STARTUP_TIMEOUT

LEAST_OUTSTANDING = {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}


def serving_environment(properties: Mapping[str, Any]) -> dict[str, str]:
    """``serving.properties`` keys and values as the container's environment variables.

    A known key (any spelling of it) becomes its variable (``option.max_model_len`` ->
    ``OPTION_MAX_MODEL_LEN``); an unknown ``option.*`` key passes through to the handler as
    ``OPTION_*``; any other unknown key is refused, with the nearest known key.
    """
    env: dict[str, str] = {}
    for key, value in properties.items():
        known = canonical_key(key)
        if known is None and not key.lower().startswith("option."):
            hint = nearest_key(key)
            raise ValueError(f"unknown serving.properties key {key!r}" + (f" (did you mean {hint!r}?)" if hint else ""))
        name = env_name(known) if known in SPECS_BY_KEY else env_name("option." + key.split(".", 1)[1])
        env[name] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return env


class LmiServePredictor(Predictor):
    """A predictor for an lmiserve endpoint: JSON request and response bodies."""

    def __init__(self, endpoint_name: str, sagemaker_session: Any = None, **kwargs: Any):
        kwargs.setdefault("serializer", JSONSerializer())
        kwargs.setdefault("deserializer", JSONDeserializer())
        super().__init__(endpoint_name, sagemaker_session=sagemaker_session, **kwargs)

    def stream(self, data: Any, **kwargs: Any) -> Iterator[Any]:
        """``InvokeEndpointWithResponseStream``: each JSON line of the answer (``{"token": ...}``
        lines of LMI, ``data:``-less OpenAI chunks), parsed, as it arrives."""
        if isinstance(data, dict) and "stream" not in data:
            data = {**data, "stream": True}
        for line in self.predict_stream(data, iterator=LineIterator, **kwargs):
            text = line.decode("utf-8").strip()
            if text.startswith("data:"):  # an SSE framing, where the model is configured for it
                text = text[len("data:") :].strip()
            if text and text != "[DONE]":
                yield json.loads(text)


class LmiServeModel(Model):
    """The SDK's ``Model`` for the lmiserve image.

    ``model_data``: the ``s3://.../model.tar.gz`` of a model directory (``serving.properties`` and
    weights), an ``s3://.../prefix/`` of uncompressed files, or nothing with ``model_id`` (a Hub id
    or an ``s3://`` prefix the container downloads; ``hf_token`` for a gated repository) /
    ``serving_properties`` naming the model. ``serving_properties``: keys as in ``serving.properties``
    (``{"option.max_model_len": 4096}``); ``env`` is added last and wins.
    """

    def __init__(
        self,
        image_uri: str,
        model_data: str | dict | None = None,
        role: str | None = None,
        *,
        model_id: str | None = None,
        hf_token: str | None = None,
        serving_properties: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        multi_model: bool = False,
        predictor_cls: type = LmiServePredictor,
        **kwargs: Any,
    ):
        environment = serving_environment(serving_properties or {})
        if model_id:
            environment["HF_MODEL_ID"] = model_id
        if hf_token:
            environment["HF_TOKEN"] = hf_token
        if multi_model:
            environment["SAGEMAKER_MULTI_MODEL"] = "true"
        environment.update(env or {})
        super().__init__(
            image_uri=image_uri,
            model_data=model_data,
            role=role,
            env=environment,
            predictor_cls=predictor_cls,
            **kwargs,
        )

    def deploy(self, initial_instance_count: int | None = 1, instance_type: str | None = None, **kwargs: Any) -> Any:
        """The SDK's ``deploy``, with timeouts for loading a large model and least-outstanding-requests
        routing unless given."""
        kwargs.setdefault("container_startup_health_check_timeout", DEFAULT_STARTUP_TIMEOUT)
        kwargs.setdefault("model_data_download_timeout", DEFAULT_DOWNLOAD_TIMEOUT)
        kwargs.setdefault("routing_config", dict(LEAST_OUTSTANDING))
        return super().deploy(initial_instance_count=initial_instance_count, instance_type=instance_type, **kwargs)

"""Create, update, delete and describe an endpoint: its model, its configuration and itself.

Every deployment makes a new model and a new endpoint configuration (named after the endpoint and
the time), so an update is SageMaker's blue/green switch from one configuration to the next and the
previous one stays intact until the new fleet has taken over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import autoscaling
from .aws import Aws, DeployError, error_text, is_not_found
from .spec import (
    TAG_KEY,
    DeploymentSpec,
    deployment_config,
    endpoint_config_request,
    model_request,
    resource_name,
    spec_from_current,
)
from .waiter import wait_for_endpoint

Log = Callable[[str], None]


@dataclass
class WaitOptions:
    wait: bool = True
    poll: float = 15.0
    timeout: float | None = None  # None: the download and start-up timeouts plus 15 minutes to provision

    def limit(self, spec: DeploymentSpec) -> float:
        return self.timeout if self.timeout is not None else spec.download_timeout + spec.startup_timeout + 900


def find_endpoint(sagemaker: Any, name: str) -> dict | None:
    from botocore.exceptions import ClientError

    try:
        return sagemaker.describe_endpoint(EndpointName=name)
    except ClientError as exc:
        if is_not_found(exc):
            return None
        raise


@dataclass
class Current:
    """A running endpoint: its description, configuration, model and the spec they add up to."""

    endpoint: dict
    config: dict
    model: dict
    spec: DeploymentSpec


def load_current(aws: Aws, name: str) -> Current:
    sagemaker = aws.sagemaker
    endpoint = find_endpoint(sagemaker, name)
    if endpoint is None:
        raise DeployError(f"no endpoint {name} in {aws.region}")
    config = sagemaker.describe_endpoint_config(EndpointConfigName=endpoint["EndpointConfigName"])
    model = sagemaker.describe_model(ModelName=config["ProductionVariants"][0]["ModelName"])
    try:
        spec = spec_from_current(endpoint, config, model)
    except ValueError as exc:
        raise DeployError(str(exc)) from exc
    return Current(endpoint, config, model, spec)


def _create_model_and_config(sagemaker: Any, spec: DeploymentSpec, log: Log) -> str:
    name = resource_name(spec.endpoint)
    sagemaker.create_model(**model_request(spec, name))
    log(f"created model {name} ({spec.image})")
    sagemaker.create_endpoint_config(**endpoint_config_request(spec, name, name))
    log(
        f"created endpoint configuration {name}: {spec.instance_count} x {spec.instance_type}, "
        f"start-up timeout {spec.startup_timeout}s, download timeout {spec.download_timeout}s"
    )
    return name


def create(aws: Aws, spec: DeploymentSpec, waiting: WaitOptions, log: Log = print) -> bool:
    """Create the model, the endpoint configuration and the endpoint; True once it is InService.

    The caller has checked that no endpoint has the name (before uploading anything).
    """
    sagemaker = aws.sagemaker
    config_name = _create_model_and_config(sagemaker, spec, log)
    sagemaker.create_endpoint(
        EndpointName=spec.endpoint, EndpointConfigName=config_name, Tags=[{"Key": TAG_KEY, "Value": spec.endpoint}]
    )
    log(f"creating endpoint {spec.endpoint} in {aws.region}")
    if not waiting.wait:
        log(f"not waiting; follow it with: lmiserve deploy status --endpoint {spec.endpoint}")
        return True
    described = wait_for_endpoint(sagemaker, spec.endpoint, poll=waiting.poll, timeout=waiting.limit(spec), log=log)
    if described["EndpointStatus"] == "InService":
        log(f"endpoint {spec.endpoint} is InService")
        return True
    log(f"endpoint {spec.endpoint} failed: {described.get('FailureReason', described['EndpointStatus'])}")
    log(f"remove it with: lmiserve deploy delete --endpoint {spec.endpoint}")
    return False


def update(
    aws: Aws,
    current: Current,
    spec: DeploymentSpec,
    waiting: WaitOptions,
    *,
    termination_wait: int = 0,
    canary_percent: int | None = None,
    canary_wait: int = 600,
    keep_previous: bool = False,
    log: Log = print,
) -> bool:
    """Blue/green: a new model and configuration, UpdateEndpoint, and wait until the new fleet serves."""
    sagemaker = aws.sagemaker
    name = spec.endpoint
    status = current.endpoint["EndpointStatus"]
    if status != "InService":
        raise DeployError(f"endpoint {name} is {status}; it can be updated once it is InService")
    scaling = _scaling_in_the_way(aws, current.spec, spec, log)
    deployment = deployment_config(spec, termination_wait, canary_percent, canary_wait)
    limit = waiting.timeout
    if limit is None:  # SageMaker's own limit for the deployment, and time to roll back
        limit = deployment["BlueGreenUpdatePolicy"]["MaximumExecutionTimeoutInSeconds"] + 900
    restore_scaling = scaling is not None
    try:
        config_name = _create_model_and_config(sagemaker, spec, log)
        sagemaker.update_endpoint(EndpointName=name, EndpointConfigName=config_name, DeploymentConfig=deployment)
        log(f"updating endpoint {name}: {current.endpoint['EndpointConfigName']} -> {config_name} (blue/green)")
        if not waiting.wait:
            log(f"not waiting; follow it with: lmiserve deploy status --endpoint {name}")
            if scaling is not None:  # it cannot be registered while the update runs
                restore_scaling = False
                log(f"autoscaling stays off until: lmiserve deploy autoscale --endpoint {name} ...")
            return True
        described = wait_for_endpoint(sagemaker, name, poll=waiting.poll, timeout=limit, log=log)
    finally:
        if restore_scaling:
            _restore_scaling(aws, scaling, log)
    if described["EndpointStatus"] == "InService" and described["EndpointConfigName"] == config_name:
        log(f"endpoint {name} is InService with {config_name}")
        if not keep_previous:
            _delete_config_and_models(sagemaker, current.config, log)
        return True
    log(f"update of {name} failed: {described.get('FailureReason', described['EndpointStatus'])}")
    if described["EndpointConfigName"] != config_name:
        log(f"endpoint {name} still serves {described['EndpointConfigName']}")
        _delete_config_and_models(sagemaker, sagemaker.describe_endpoint_config(EndpointConfigName=config_name), log)
    return False


def _scaling_in_the_way(
    aws: Aws, old: DeploymentSpec, new: DeploymentSpec, log: Log
) -> autoscaling.ScalingState | None:
    """An update that changes the instance type of an autoscaled variant fails: lift autoscaling for it."""
    if old.instance_type == new.instance_type and old.variant == new.variant:
        return None
    state = autoscaling.current(aws.autoscaling, old.endpoint, old.variant)
    if state is not None:
        autoscaling.disable(aws.autoscaling, state)
        log(f"autoscaling deregistered for the change of instance type ({autoscaling.describe(state)})")
    return state


def _restore_scaling(aws: Aws, state: autoscaling.ScalingState, log: Log) -> None:
    from botocore.exceptions import ClientError

    try:
        autoscaling.restore(aws.autoscaling, state)
        log(f"autoscaling restored: {autoscaling.describe(state)}")
    except ClientError as exc:  # e.g. the update is still running
        log(f"autoscaling not restored ({error_text(exc)}); once InService: lmiserve deploy autoscale ...")


def delete(aws: Aws, name: str, *, keep_config: bool = False, keep_model: bool = False, log: Log = print) -> None:
    """Delete the endpoint, then (unless kept) its configuration and its models. S3 data stays."""
    from botocore.exceptions import ClientError

    sagemaker = aws.sagemaker
    endpoint = find_endpoint(sagemaker, name)
    if endpoint is None:
        raise DeployError(f"no endpoint {name} in {aws.region}")
    try:
        config = sagemaker.describe_endpoint_config(EndpointConfigName=endpoint["EndpointConfigName"])
    except ClientError as exc:
        if not is_not_found(exc):
            raise
        config = None
    for variant in (config or {}).get("ProductionVariants", []):
        try:
            state = autoscaling.current(aws.autoscaling, name, variant["VariantName"])
            if state is not None:
                autoscaling.disable(aws.autoscaling, state)
                log(f"deregistered autoscaling of {name}/{variant['VariantName']}")
        except ClientError as exc:  # SageMaker deregisters it itself when it may
            log(f"note: autoscaling left to SageMaker ({error_text(exc)})")
    sagemaker.delete_endpoint(EndpointName=name)
    log(f"deleted endpoint {name}")
    if config is None:
        return
    _delete_config_and_models(sagemaker, config, log, keep_config=keep_config, keep_model=keep_model)


def _delete_config_and_models(
    sagemaker: Any, config: dict, log: Log, *, keep_config: bool = False, keep_model: bool = False
) -> None:
    if not keep_config:
        sagemaker.delete_endpoint_config(EndpointConfigName=config["EndpointConfigName"])
        log(f"deleted endpoint configuration {config['EndpointConfigName']}")
    if not keep_model:
        for model in sorted({v["ModelName"] for v in config["ProductionVariants"]}):
            sagemaker.delete_model(ModelName=model)
            log(f"deleted model {model}")


def status_lines(aws: Aws, name: str) -> list[str]:
    """What ``lmiserve deploy status`` prints."""
    current = load_current(aws, name)
    endpoint, spec = current.endpoint, current.spec
    running = {v["VariantName"]: v for v in endpoint.get("ProductionVariants", [])}.get(spec.variant, {})
    lines = [
        f"endpoint       {name} ({aws.region}): {endpoint['EndpointStatus']}",
        f"configuration  {endpoint['EndpointConfigName']}",
        f"variant        {spec.variant}: {spec.instance_type}, "
        f"{running.get('CurrentInstanceCount', '?')} running / {running.get('DesiredInstanceCount', '?')} desired",
        f"model          {current.model['ModelName']}",
        f"image          {spec.image}",
        f"model data     {spec.model_data or '(none: the container loads HF_MODEL_ID)'}",
        f"timeouts       start-up {spec.startup_timeout}s, model download {spec.download_timeout}s",
        f"routing        {spec.routing}",
    ]
    for key in sorted(spec.env):
        value = "***" if _secret(key) else spec.env[key]
        lines.append(f"env            {key}={value}")
    from botocore.exceptions import ClientError

    try:
        scaling = autoscaling.describe(autoscaling.current(aws.autoscaling, name, spec.variant))
    except ClientError as exc:  # a missing permission should not hide the rest
        scaling = f"unknown ({error_text(exc)})"
    lines.append(f"autoscaling    {scaling}")
    if endpoint.get("FailureReason"):
        lines.append(f"failure        {endpoint['FailureReason']}")
    return lines


def _secret(key: str) -> bool:
    return any(word in key.upper() for word in ("TOKEN", "SECRET", "PASSWORD", "KEY"))

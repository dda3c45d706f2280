"""What an endpoint is made of, and the SageMaker requests that create it.

Pure functions: a ``DeploymentSpec`` in, the exact ``CreateModel`` / ``CreateEndpointConfig`` /
``UpdateEndpoint`` parameters out, and back again from the ``Describe*`` answers (for updates that
change only a few things).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime

# Loading a large model takes a while: SageMaker's defaults are sized for small ones.
DEFAULT_STARTUP_TIMEOUT = 1800  # ContainerStartupHealthCheckTimeoutInSeconds (60..3600)
DEFAULT_DOWNLOAD_TIMEOUT = 1800  # ModelDataDownloadTimeoutInSeconds (60..3600)
DEFAULT_VARIANT = "AllTraffic"
# Requests to an LLM differ a lot in duration: send each to the instance with the fewest in flight.
ROUTING = {"least-outstanding": "LEAST_OUTSTANDING_REQUESTS", "random": "RANDOM"}
TAG_KEY = "lmiserve:endpoint"
_NAME_LIMIT = 63  # SageMaker resource names: [a-zA-Z0-9](-*[a-zA-Z0-9])*, at most 63 characters


@dataclass
class DeploymentSpec:
    endpoint: str
    image: str
    role_arn: str
    instance_type: str
    instance_count: int = 1
    model_data: str | None = None  # s3://.../model.tar.gz, or s3://.../prefix/ for uncompressed files
    env: dict[str, str] = field(default_factory=dict)
    variant: str = DEFAULT_VARIANT
    startup_timeout: int = DEFAULT_STARTUP_TIMEOUT
    download_timeout: int = DEFAULT_DOWNLOAD_TIMEOUT
    volume_size: int | None = None  # GB of EBS storage per instance (instance types without local NVMe)
    routing: str = "LEAST_OUTSTANDING_REQUESTS"

    def replace(self, **changes) -> DeploymentSpec:
        return dataclasses.replace(self, **changes)


def resource_name(endpoint: str, now: datetime | None = None) -> str:
    """A fresh model / endpoint-configuration name: the endpoint's name and a UTC timestamp."""
    now = now or datetime.now(UTC)
    stamp = now.strftime("%Y%m%d-%H%M%S-") + f"{now.microsecond // 1000:03d}"
    prefix = endpoint[: _NAME_LIMIT - len(stamp) - 1].rstrip("-")
    return f"{prefix}-{stamp}"


def is_uncompressed(model_data: str) -> bool:
    """``s3://bucket/prefix/`` (a trailing slash) names uncompressed files under a prefix."""
    return model_data.endswith("/")


def model_request(spec: DeploymentSpec, model_name: str) -> dict:
    container: dict = {"Image": spec.image, "Environment": dict(spec.env)}
    if spec.model_data and is_uncompressed(spec.model_data):
        container["ModelDataSource"] = {
            "S3DataSource": {"S3Uri": spec.model_data, "S3DataType": "S3Prefix", "CompressionType": "None"}
        }
    elif spec.model_data:
        container["ModelDataUrl"] = spec.model_data
    return {
        "ModelName": model_name,
        "ExecutionRoleArn": spec.role_arn,
        "PrimaryContainer": container,
        "Tags": [{"Key": TAG_KEY, "Value": spec.endpoint}],
    }


def endpoint_config_request(spec: DeploymentSpec, config_name: str, model_name: str) -> dict:
    variant: dict = {
        "VariantName": spec.variant,
        "ModelName": model_name,
        "InstanceType": spec.instance_type,
        "InitialInstanceCount": spec.instance_count,
        "InitialVariantWeight": 1.0,
        "ContainerStartupHealthCheckTimeoutInSeconds": spec.startup_timeout,
        "ModelDataDownloadTimeoutInSeconds": spec.download_timeout,
        "RoutingConfig": {"RoutingStrategy": spec.routing},
    }
    if spec.volume_size:
        variant["VolumeSizeInGB"] = spec.volume_size
    return {
        "EndpointConfigName": config_name,
        "ProductionVariants": [variant],
        "Tags": [{"Key": TAG_KEY, "Value": spec.endpoint}],
    }


def deployment_config(
    spec: DeploymentSpec, termination_wait: int = 0, canary_percent: int | None = None, canary_wait: int = 600
) -> dict:
    """A blue/green update: the new fleet starts beside the old one, then takes the traffic.

    All at once by default, or a canary share of the new fleet's capacity first. The time limit
    leaves room for the model download, its start-up, the canary and the termination wait.
    """
    if canary_percent is None:
        routing: dict = {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 0}
    else:
        routing = {
            "Type": "CANARY",
            "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": canary_percent},
            "WaitIntervalInSeconds": canary_wait,
        }
    budget = spec.download_timeout + spec.startup_timeout + routing["WaitIntervalInSeconds"] + termination_wait + 600
    return {
        "BlueGreenUpdatePolicy": {
            "TrafficRoutingConfiguration": routing,
            "TerminationWaitInSeconds": termination_wait,
            "MaximumExecutionTimeoutInSeconds": max(600, min(28800, budget)),
        }
    }


def spec_from_current(endpoint: dict, config: dict, model: dict) -> DeploymentSpec:
    """The spec of a running endpoint, from DescribeEndpoint, DescribeEndpointConfig and DescribeModel."""
    variants = config["ProductionVariants"]
    if len(variants) != 1:
        raise ValueError(f"endpoint {endpoint['EndpointName']} has {len(variants)} variants; only one is handled")
    variant = variants[0]
    container = model.get("PrimaryContainer") or (model.get("Containers") or [{}])[0]
    source = container.get("ModelDataSource", {}).get("S3DataSource", {})
    running = {v["VariantName"]: v for v in endpoint.get("ProductionVariants", [])}.get(variant["VariantName"], {})
    spec = DeploymentSpec(
        endpoint=endpoint["EndpointName"],
        image=container["Image"],
        role_arn=model["ExecutionRoleArn"],
        instance_type=variant["InstanceType"],
        # an autoscaled endpoint keeps the size it has now
        instance_count=running.get("DesiredInstanceCount") or variant.get("InitialInstanceCount", 1),
        model_data=container.get("ModelDataUrl") or source.get("S3Uri"),
        env=dict(container.get("Environment") or {}),
        variant=variant["VariantName"],
        startup_timeout=variant.get("ContainerStartupHealthCheckTimeoutInSeconds", DEFAULT_STARTUP_TIMEOUT),
        download_timeout=variant.get("ModelDataDownloadTimeoutInSeconds", DEFAULT_DOWNLOAD_TIMEOUT),
        volume_size=variant.get("VolumeSizeInGB"),
        routing=(variant.get("RoutingConfig") or {}).get("RoutingStrategy", "LEAST_OUTSTANDING_REQUESTS"),
    )
    return spec


def parse_env(pairs: list[str] | None) -> dict[str, str]:
    """``K=V`` strings into a dict (a later key wins). ``K=`` keeps an empty value."""
    env: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--env takes KEY=VALUE, not {pair!r}")
        env[key] = value
    return env

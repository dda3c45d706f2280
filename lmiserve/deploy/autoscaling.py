"""Instance-count autoscaling of an endpoint's variant (Application Auto Scaling, target tracking).

SageMaker's load balancer spreads requests over a variant's instances; Application Auto Scaling
changes how many there are, tracking a target of invocations per instance per minute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NAMESPACE = "sagemaker"
DIMENSION = "sagemaker:variant:DesiredInstanceCount"
METRIC = "SageMakerVariantInvocationsPerInstance"
POLICY_NAME = "lmiserve-invocations-per-instance"
# An LLM instance takes minutes to start: scale out without waiting long, scale in reluctantly.
DEFAULT_SCALE_OUT_COOLDOWN = 300
DEFAULT_SCALE_IN_COOLDOWN = 600


def resource_id(endpoint: str, variant: str) -> str:
    return f"endpoint/{endpoint}/variant/{variant}"


@dataclass
class ScalingState:
    """A variant's scalable target and its policies, as Application Auto Scaling describes them."""

    endpoint: str
    variant: str
    min_capacity: int
    max_capacity: int
    policies: list[dict] = field(default_factory=list)


def target_tracking_policy(target: float, scale_in_cooldown: int, scale_out_cooldown: int) -> dict:
    return {
        "TargetValue": float(target),
        "PredefinedMetricSpecification": {"PredefinedMetricType": METRIC},
        "ScaleInCooldown": scale_in_cooldown,
        "ScaleOutCooldown": scale_out_cooldown,
    }


def enable(
    autoscaling: Any,
    endpoint: str,
    variant: str,
    min_capacity: int,
    max_capacity: int,
    target: float,
    scale_in_cooldown: int = DEFAULT_SCALE_IN_COOLDOWN,
    scale_out_cooldown: int = DEFAULT_SCALE_OUT_COOLDOWN,
) -> str:
    """Register the variant between ``min_capacity`` and ``max_capacity`` instances and track ``target``."""
    if min_capacity < 1 or max_capacity < min_capacity:
        raise ValueError(f"need 1 <= --min <= --max, got --min {min_capacity} --max {max_capacity}")
    if target <= 0:
        raise ValueError("--target must be > 0 invocations per instance per minute")
    rid = resource_id(endpoint, variant)
    autoscaling.register_scalable_target(
        ServiceNamespace=NAMESPACE,
        ResourceId=rid,
        ScalableDimension=DIMENSION,
        MinCapacity=min_capacity,
        MaxCapacity=max_capacity,
    )
    answer = autoscaling.put_scaling_policy(
        PolicyName=POLICY_NAME,
        ServiceNamespace=NAMESPACE,
        ResourceId=rid,
        ScalableDimension=DIMENSION,
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration=target_tracking_policy(target, scale_in_cooldown, scale_out_cooldown),
    )
    return answer["PolicyARN"]


def current(autoscaling: Any, endpoint: str, variant: str) -> ScalingState | None:
    """The variant's autoscaling, or None when it has none."""
    rid = resource_id(endpoint, variant)
    targets = autoscaling.describe_scalable_targets(
        ServiceNamespace=NAMESPACE, ResourceIds=[rid], ScalableDimension=DIMENSION
    )["ScalableTargets"]
    if not targets:
        return None
    policies = autoscaling.describe_scaling_policies(
        ServiceNamespace=NAMESPACE, ResourceId=rid, ScalableDimension=DIMENSION
    )["ScalingPolicies"]
    return ScalingState(endpoint, variant, targets[0]["MinCapacity"], targets[0]["MaxCapacity"], policies)


def disable(autoscaling: Any, state: ScalingState) -> None:
    """Delete the variant's scaling policies, then deregister it."""
    rid = resource_id(state.endpoint, state.variant)
    for policy in state.policies:
        autoscaling.delete_scaling_policy(
            PolicyName=policy["PolicyName"], ServiceNamespace=NAMESPACE, ResourceId=rid, ScalableDimension=DIMENSION
        )
    autoscaling.deregister_scalable_target(ServiceNamespace=NAMESPACE, ResourceId=rid, ScalableDimension=DIMENSION)


def restore(autoscaling: Any, state: ScalingState) -> None:
    """Register the target and put back the policies that ``current`` described."""
    rid = resource_id(state.endpoint, state.variant)
    autoscaling.register_scalable_target(
        ServiceNamespace=NAMESPACE,
        ResourceId=rid,
        ScalableDimension=DIMENSION,
        MinCapacity=state.min_capacity,
        MaxCapacity=state.max_capacity,
    )
    for policy in state.policies:
        request = {
            "PolicyName": policy["PolicyName"],
            "ServiceNamespace": NAMESPACE,
            "ResourceId": rid,
            "ScalableDimension": DIMENSION,
            "PolicyType": policy["PolicyType"],
        }
        for key in ("TargetTrackingScalingPolicyConfiguration", "StepScalingPolicyConfiguration"):
            if key in policy:
                request[key] = policy[key]
        autoscaling.put_scaling_policy(**request)


def describe(state: ScalingState | None) -> str:
    if state is None:
        return "off"
    parts = [f"{state.min_capacity}..{state.max_capacity} instances"]
    for policy in state.policies:
        config = policy.get("TargetTrackingScalingPolicyConfiguration") or {}
        metric = (config.get("PredefinedMetricSpecification") or {}).get("PredefinedMetricType")
        if metric == METRIC:
            parts.append(f"target {config['TargetValue']:g} invocations per instance per minute")
        else:
            parts.append(f"policy {policy['PolicyName']} ({policy['PolicyType']})")
    return ", ".join(parts)

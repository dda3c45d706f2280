import re
from datetime import UTC, datetime

import pytest

from lmiserve.deploy.aws import role_from_assumed_role
from lmiserve.deploy.spec import (
    DeploymentSpec,
    deployment_config,
    endpoint_config_request,
    model_request,
    parse_env,
    resource_name,
    spec_from_current,
)

SPEC = DeploymentSpec(
    endpoint="llm",
    image="123456789012.dkr.ecr.us-west-2.amazonaws.com/lmiserve:0.1.0-cu124",
    role_arn="arn:aws:iam::123456789012:role/service/SageMakerRole",
    instance_type="ml.g5.12xlarge",
    instance_count=2,
    model_data="s3://bucket/lmiserve/llm/model.tar.gz",
    env={"OPTION_TENSOR_PARALLEL_DEGREE": "max"},
    volume_size=256,
)


def test_resource_names_fit_sagemaker_rules():
    now = datetime(2026, 3, 4, 5, 6, 7, 891000, tzinfo=UTC)
    assert resource_name("llm", now) == "llm-20260304-050607-891"
    long = resource_name("a-" * 40, now)
    assert len(long) <= 63 and re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*", long)


def test_tar_gz_and_uncompressed_model_data():
    assert model_request(SPEC, "m")["PrimaryContainer"] == {
        "Image": SPEC.image,
        "Environment": {"OPTION_TENSOR_PARALLEL_DEGREE": "max"},
        "ModelDataUrl": "s3://bucket/lmiserve/llm/model.tar.gz",
    }
    prefix = SPEC.replace(model_data="s3://bucket/lmiserve/llm/model/")
    assert model_request(prefix, "m")["PrimaryContainer"]["ModelDataSource"] == {
        "S3DataSource": {
            "S3Uri": "s3://bucket/lmiserve/llm/model/",
            "S3DataType": "S3Prefix",
            "CompressionType": "None",
        }
    }
    hub = SPEC.replace(model_data=None, env={"HF_MODEL_ID": "org/model"})
    assert model_request(hub, "m")["PrimaryContainer"] == {
        "Image": SPEC.image,
        "Environment": {"HF_MODEL_ID": "org/model"},
    }


def test_the_spec_comes_back_from_the_descriptions():
    for spec in (SPEC, SPEC.replace(model_data="s3://b/p/", volume_size=None, routing="RANDOM")):
        model = model_request(spec, "m") | {"ModelArn": "arn"}
        config = endpoint_config_request(spec, "c", "m")
        endpoint = {
            "EndpointName": "llm",
            "ProductionVariants": [{"VariantName": "AllTraffic", "DesiredInstanceCount": 2}],
        }
        assert spec_from_current(endpoint, config, model) == spec


def test_an_autoscaled_endpoint_keeps_its_current_size():
    config = endpoint_config_request(SPEC, "c", "m")
    endpoint = {"EndpointName": "llm", "ProductionVariants": [{"VariantName": "AllTraffic", "DesiredInstanceCount": 5}]}
    assert spec_from_current(endpoint, config, model_request(SPEC, "m")).instance_count == 5


def test_blue_green_time_budget():
    assert deployment_config(SPEC) == {
        "BlueGreenUpdatePolicy": {
            "TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 0},
            "TerminationWaitInSeconds": 0,
            "MaximumExecutionTimeoutInSeconds": 1800 + 1800 + 600,
        }
    }
    canary = deployment_config(SPEC, termination_wait=300, canary_percent=10, canary_wait=900)["BlueGreenUpdatePolicy"]
    assert canary["TrafficRoutingConfiguration"] == {
        "Type": "CANARY",
        "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 10},
        "WaitIntervalInSeconds": 900,
    }
    assert canary["MaximumExecutionTimeoutInSeconds"] == 1800 + 1800 + 900 + 300 + 600
    quick = SPEC.replace(startup_timeout=60, download_timeout=60)
    assert deployment_config(quick)["BlueGreenUpdatePolicy"]["MaximumExecutionTimeoutInSeconds"] == 720
    long = deployment_config(SPEC, termination_wait=3600, canary_percent=5, canary_wait=30000)
    assert long["BlueGreenUpdatePolicy"]["MaximumExecutionTimeoutInSeconds"] == 28800


def test_parse_env():
    assert parse_env(["A=1", "B=x=y", "A=2", "C="]) == {"A": "2", "B": "x=y", "C": ""}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_env(["NOVALUE"])


def test_role_behind_assumed_role_credentials():
    assert role_from_assumed_role("arn:aws:sts::123456789012:assumed-role/SageMakerRole/SageMaker") == (
        "aws",
        "123456789012",
        "SageMakerRole",
    )
    assert role_from_assumed_role("arn:aws-cn:sts::1:assumed-role/R/s") == ("aws-cn", "1", "R")
    assert role_from_assumed_role("arn:aws:iam::123456789012:user/alice") is None

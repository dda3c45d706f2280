"""``lmiserve deploy`` against moto's AWS emulation over HTTP on 127.0.0.1."""

import io
import re
import tarfile

import pytest

from lmiserve.cli import main

from .conftest import ACCOUNT, FAST, IMAGE, REGION, ROLE

IMAGE2 = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/lmiserve:0.2.0"
BUCKET = f"sagemaker-{REGION}-{ACCOUNT}"
STAMP = r"\d{8}-\d{6}-\d{3}"


@pytest.fixture
def model_dir(tmp_path):
    root = tmp_path / "model"
    (root / "tokenizer").mkdir(parents=True)
    (root / "serving.properties").write_text("option.rolling_batch=lmi\noption.max_model_len=4096\n")
    (root / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (root / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (root / "tokenizer" / "tokenizer.json").write_text("{}")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref")
    return root


def _deploy(model_dir, *extra):
    return main(
        ["deploy", "sagemaker", "--image", IMAGE, "--model-dir", str(model_dir), "--instance-type", "ml.g4dn.12xlarge"]
        + ["--instance-count", "2", "--endpoint", "llm", "--role", ROLE, "--env", "OPTION_TENSOR_PARALLEL_DEGREE=max"]
        + ["--env", "OPTION_MAX_ROLLING_BATCH_SIZE=64", *FAST, *extra]
    )


def _variant(model_name, count=2, instance_type="ml.g4dn.12xlarge"):
    return {
        "VariantName": "AllTraffic",
        "ModelName": model_name,
        "InstanceType": instance_type,
        "InitialInstanceCount": count,
        "InitialVariantWeight": 1.0,
        "ContainerStartupHealthCheckTimeoutInSeconds": 1800,
        "ModelDataDownloadTimeoutInSeconds": 1800,
        "RoutingConfig": {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"},
    }


def test_create_update_autoscale_delete(aws, emulator, model_dir, capsys):
    sagemaker, s3, scaling = aws.client("sagemaker"), aws.client("s3"), aws.client("application-autoscaling")

    # -- create: package, upload, model, configuration, endpoint, wait -------------------------------
    assert _deploy(model_dir) == 0
    calls = emulator.actions("SageMaker")
    out = capsys.readouterr().out
    assert "endpoint llm: Creating, 2/2 instances" in out and "endpoint llm is InService" in out

    [key] = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert re.fullmatch(rf"lmiserve/llm-{STAMP}/model\.tar\.gz", key)
    archive = tarfile.open(fileobj=io.BytesIO(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()), mode="r:gz")
    assert archive.getnames() == ["config.json", "model.safetensors", "serving.properties", "tokenizer/tokenizer.json"]
    assert archive.extractfile("model.safetensors").read() == (model_dir / "model.safetensors").read_bytes()

    endpoint = sagemaker.describe_endpoint(EndpointName="llm")
    first = endpoint["EndpointConfigName"]
    assert re.fullmatch(rf"llm-{STAMP}", first) and endpoint["EndpointStatus"] == "InService"
    model = sagemaker.describe_model(ModelName=first)
    assert model["ExecutionRoleArn"] == ROLE
    env = {"OPTION_TENSOR_PARALLEL_DEGREE": "max", "OPTION_MAX_ROLLING_BATCH_SIZE": "64"}
    assert model["PrimaryContainer"] == {"Image": IMAGE, "ModelDataUrl": f"s3://{BUCKET}/{key}", "Environment": env}
    assert sagemaker.describe_endpoint_config(EndpointConfigName=first)["ProductionVariants"] == [_variant(first)]
    assert emulator.params("SageMaker.CreateEndpointConfig") == [
        {
            "EndpointConfigName": first,
            "ProductionVariants": [_variant(first)],
            "Tags": [{"Key": "lmiserve:endpoint", "Value": "llm"}],
        }
    ]
    assert emulator.params("SageMaker.CreateEndpoint") == [
        {"EndpointName": "llm", "EndpointConfigName": first, "Tags": [{"Key": "lmiserve:endpoint", "Value": "llm"}]}
    ]
    assert calls == [
        "SageMaker.DescribeEndpoint",  # is the name free?
        "SageMaker.CreateModel",
        "SageMaker.CreateEndpointConfig",
        "SageMaker.CreateEndpoint",
        "SageMaker.DescribeEndpoint",  # Creating
        "SageMaker.DescribeEndpoint",  # InService
    ]
    emulator.calls.clear()

    # -- update: a new image and one more variable, blue/green --------------------------------------
    update = ["deploy", "update", "--endpoint", "llm", "--image", IMAGE2, "--env", "OPTION_MAX_ROLLING_BATCH_SIZE=128"]
    assert main(update + ["--termination-wait", "120", *FAST]) == 0
    calls = emulator.actions()
    out = capsys.readouterr().out
    assert "endpoint llm: Updating" in out and "is InService with llm-" in out

    endpoint = sagemaker.describe_endpoint(EndpointName="llm")
    second = endpoint["EndpointConfigName"]
    assert second != first
    blue_green = {
        "BlueGreenUpdatePolicy": {
            "TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 0},
            "TerminationWaitInSeconds": 120,
            "MaximumExecutionTimeoutInSeconds": 1800 + 1800 + 120 + 600,
        }
    }
    assert emulator.params("SageMaker.UpdateEndpoint") == [
        {"EndpointName": "llm", "EndpointConfigName": second, "DeploymentConfig": blue_green}
    ]
    assert endpoint["LastDeploymentConfig"] == blue_green
    assert sagemaker.describe_model(ModelName=second)["PrimaryContainer"] == {
        "Image": IMAGE2,
        "ModelDataUrl": f"s3://{BUCKET}/{key}",  # the model data stays where it is
        "Environment": env | {"OPTION_MAX_ROLLING_BATCH_SIZE": "128"},
    }
    assert sagemaker.describe_endpoint_config(EndpointConfigName=second)["ProductionVariants"] == [_variant(second)]
    # once the new fleet serves, the previous model and configuration go
    assert [m["ModelName"] for m in sagemaker.list_models()["Models"]] == [second]
    assert [c["EndpointConfigName"] for c in sagemaker.list_endpoint_configs()["EndpointConfigs"]] == [second]
    assert calls == [
        "SageMaker.DescribeEndpoint",
        "SageMaker.DescribeEndpointConfig",
        "SageMaker.DescribeModel",
        "SageMaker.CreateModel",
        "SageMaker.CreateEndpointConfig",
        "SageMaker.UpdateEndpoint",
        "SageMaker.DescribeEndpoint",  # Updating
        "SageMaker.DescribeEndpoint",  # InService
        "SageMaker.DeleteEndpointConfig",
        "SageMaker.DeleteModel",
    ]  # nothing uploaded again, autoscaling untouched (the instance type stays)

    # -- autoscale ------------------------------------------------------------------------------
    emulator.calls.clear()
    assert main(["deploy", "autoscale", "--endpoint", "llm", "--min", "1", "--max", "4", "--target", "30"]) == 0
    calls = emulator.actions("AnyScaleFrontendService")
    assert "1..4 instances, target 30 invocations per instance per minute" in capsys.readouterr().out
    resource = "endpoint/llm/variant/AllTraffic"
    [target] = scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert (target["ResourceId"], target["ScalableDimension"]) == (resource, "sagemaker:variant:DesiredInstanceCount")
    assert (target["MinCapacity"], target["MaxCapacity"]) == (1, 4)
    [policy] = scaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
    assert (policy["PolicyName"], policy["PolicyType"]) == (
        "lmiserve-invocations-per-instance",
        "TargetTrackingScaling",
    )
    assert policy["ResourceId"] == resource
    assert policy["TargetTrackingScalingPolicyConfiguration"] == {
        "TargetValue": 30.0,
        "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
        "ScaleInCooldown": 600,
        "ScaleOutCooldown": 300,
    }
    assert calls == [
        "AnyScaleFrontendService.RegisterScalableTarget",
        "AnyScaleFrontendService.PutScalingPolicy",
    ]

    # -- status ---------------------------------------------------------------------------------
    assert main(["deploy", "status", "--endpoint", "llm"]) == 0
    status = capsys.readouterr().out
    assert "endpoint       llm (us-west-2): InService" in status
    assert "variant        AllTraffic: ml.g4dn.12xlarge, 2 running / 2 desired" in status
    assert f"image          {IMAGE2}" in status
    assert "autoscaling    1..4 instances, target 30 invocations per instance per minute" in status
    assert "env            OPTION_MAX_ROLLING_BATCH_SIZE=128" in status

    # -- delete ---------------------------------------------------------------------------------
    emulator.calls.clear()
    assert main(["deploy", "delete", "--endpoint", "llm"]) == 0
    calls = [a for a in emulator.actions() if "Delete" in a or "Deregister" in a]
    assert sagemaker.list_endpoints()["Endpoints"] == []
    assert sagemaker.list_endpoint_configs()["EndpointConfigs"] == []
    assert sagemaker.list_models()["Models"] == []
    assert scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert scaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"] == []
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]] == [key]  # the model data stays
    assert calls == [
        "AnyScaleFrontendService.DeleteScalingPolicy",
        "AnyScaleFrontendService.DeregisterScalableTarget",
        "SageMaker.DeleteEndpoint",
        "SageMaker.DeleteEndpointConfig",
        "SageMaker.DeleteModel",
    ]

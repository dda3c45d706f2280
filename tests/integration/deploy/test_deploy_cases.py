"""``lmiserve deploy`` failure paths and options, against moto over HTTP on 127.0.0.1."""

import json

from lmiserve.cli import main

from .conftest import ACCOUNT, FAST, IMAGE, REGION, ROLE

BASE = ["--image", IMAGE, "--instance-type", "ml.g4dn.xlarge", "--endpoint", "llm", *FAST]


def _hub(*extra):
    return main(["deploy", "sagemaker", "--model-id", "org/model", "--role", ROLE, *BASE, *extra])


def test_hub_model_has_no_model_data_and_no_upload(aws, emulator):
    assert _hub("--env", "HF_TOKEN=secret", "--startup-timeout", "900", "--volume-size", "100") == 0
    sagemaker = aws.client("sagemaker")
    name = sagemaker.describe_endpoint(EndpointName="llm")["EndpointConfigName"]
    container = sagemaker.describe_model(ModelName=name)["PrimaryContainer"]
    assert container == {"Image": IMAGE, "Environment": {"HF_TOKEN": "secret", "HF_MODEL_ID": "org/model"}}
    [variant] = sagemaker.describe_endpoint_config(EndpointConfigName=name)["ProductionVariants"]
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] == 900
    assert (variant["VolumeSizeInGB"], variant["InitialInstanceCount"]) == (100, 1)
    assert not emulator.actions("rest") and not emulator.actions("query")  # no S3, no STS


def test_failed_creation_reports_the_reason(aws, emulator, capsys):
    emulator.fail_next("CannotStartContainerError. Please ensure the model container for variant AllTraffic starts")
    assert _hub() == 1
    out = capsys.readouterr().out
    assert "endpoint llm: Failed" in out
    assert "endpoint llm failed: CannotStartContainerError. Please ensure" in out
    assert "lmiserve deploy delete --endpoint llm" in out
    assert main(["deploy", "status", "--endpoint", "llm"]) == 0
    assert "failure        CannotStartContainerError" in capsys.readouterr().out


def test_an_existing_endpoint_is_not_overwritten(aws, emulator, capsys):
    assert _hub() == 0
    emulator.calls.clear()
    assert _hub() == 1
    assert "endpoint llm exists; change it with: lmiserve deploy update" in capsys.readouterr().err
    assert emulator.actions() == ["SageMaker.DescribeEndpoint"]


def test_no_wait_returns_while_creating(aws, capsys):
    assert _hub("--no-wait") == 0
    assert "follow it with: lmiserve deploy status --endpoint llm" in capsys.readouterr().out
    assert aws.client("sagemaker").describe_endpoint(EndpointName="llm")["EndpointStatus"] == "Creating"


def test_failed_update_rolls_back_and_cleans_up(aws, emulator, capsys):
    assert _hub() == 0
    sagemaker = aws.client("sagemaker")
    before = sagemaker.describe_endpoint(EndpointName="llm")["EndpointConfigName"]
    emulator.fail_next("The primary container for production variant AllTraffic did not pass the ping health check")
    assert main(["deploy", "update", "--endpoint", "llm", "--image", IMAGE + "-broken", *FAST]) == 1
    out = capsys.readouterr().out
    assert "update of llm failed: The primary container for production variant AllTraffic" in out
    assert f"endpoint llm still serves {before}" in out
    assert sagemaker.describe_endpoint(EndpointName="llm")["EndpointConfigName"] == before
    assert [m["ModelName"] for m in sagemaker.list_models()["Models"]] == [before]
    assert [c["EndpointConfigName"] for c in sagemaker.list_endpoint_configs()["EndpointConfigs"]] == [before]


def test_new_instance_type_lifts_and_restores_autoscaling(aws, emulator):
    assert _hub() == 0
    assert main(["deploy", "autoscale", "--endpoint", "llm", "--min", "2", "--max", "6", "--target", "12.5"]) == 0
    emulator.calls.clear()
    update = ["deploy", "update", "--endpoint", "llm", "--instance-type", "ml.g4dn.12xlarge", "--keep-previous"]
    previous = aws.client("sagemaker").describe_endpoint(EndpointName="llm")["EndpointConfigName"]
    assert main(update + ["--canary", "25", "--canary-wait", "300", *FAST]) == 0
    scaling_calls = emulator.actions("AnyScaleFrontendService")
    assert scaling_calls[-4:] == [
        "AnyScaleFrontendService.DeleteScalingPolicy",
        "AnyScaleFrontendService.DeregisterScalableTarget",
        "AnyScaleFrontendService.RegisterScalableTarget",
        "AnyScaleFrontendService.PutScalingPolicy",
    ]
    order = emulator.actions()
    assert order.index("AnyScaleFrontendService.DeregisterScalableTarget") < order.index("SageMaker.UpdateEndpoint")
    assert order.index("AnyScaleFrontendService.RegisterScalableTarget") > order.index("SageMaker.UpdateEndpoint")
    [update_call] = emulator.params("SageMaker.UpdateEndpoint")
    assert update_call["DeploymentConfig"]["BlueGreenUpdatePolicy"]["TrafficRoutingConfiguration"] == {
        "Type": "CANARY",
        "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 25},
        "WaitIntervalInSeconds": 300,
    }
    scaling = aws.client("application-autoscaling")
    [target] = scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert (target["MinCapacity"], target["MaxCapacity"]) == (2, 6)
    [policy] = scaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
    assert policy["TargetTrackingScalingPolicyConfiguration"]["TargetValue"] == 12.5
    sagemaker = aws.client("sagemaker")
    name = sagemaker.describe_endpoint(EndpointName="llm")["EndpointConfigName"]
    [variant] = sagemaker.describe_endpoint_config(EndpointConfigName=name)["ProductionVariants"]
    assert variant["InstanceType"] == "ml.g4dn.12xlarge"
    assert len(sagemaker.list_models()["Models"]) == 2  # --keep-previous

    assert main(["deploy", "autoscale", "--endpoint", "llm", "--off"]) == 0
    assert scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert main(["deploy", "delete", "--endpoint", "llm", "--keep-model"]) == 0
    assert len(sagemaker.list_models()["Models"]) == 2
    configs = sagemaker.list_endpoint_configs()["EndpointConfigs"]
    assert [c["EndpointConfigName"] for c in configs] == [previous]  # kept by the update's --keep-previous


def test_uncompressed_upload_to_a_named_bucket(aws, emulator, tmp_path):
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="models", CreateBucketConfiguration={"LocationConstraint": REGION})
    model_dir = tmp_path / "m"
    (model_dir / "sub").mkdir(parents=True)
    (model_dir / "serving.properties").write_text("option.rolling_batch=lmi\n")
    (model_dir / "sub" / "weights.bin").write_bytes(b"\0" * 1000)
    args = ["--model-dir", str(model_dir), "--uncompressed", "--bucket", "models", "--prefix", "team/llms"]
    assert main(["deploy", "sagemaker", "--role", ROLE, *args, *BASE]) == 0
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="models")["Contents"])
    prefix = keys[0].rsplit("/", 1)[0]
    assert prefix.startswith("team/llms/llm-")
    assert keys == [f"{prefix}/serving.properties", f"{prefix}/sub/weights.bin"]
    sagemaker = aws.client("sagemaker")
    name = sagemaker.describe_endpoint(EndpointName="llm")["EndpointConfigName"]
    assert sagemaker.describe_model(ModelName=name)["PrimaryContainer"]["ModelDataSource"] == {
        "S3DataSource": {"S3Uri": f"s3://models/{prefix}/", "S3DataType": "S3Prefix", "CompressionType": "None"}
    }


def test_model_data_in_s3_is_checked_first(aws, emulator, capsys):
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="models", CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.put_object(Bucket="models", Key="llm/model.tar.gz", Body=b"tar")
    assert main(["deploy", "sagemaker", "--role", ROLE, "--model-data", "s3://models/llm/other.tar.gz", *BASE]) == 2
    assert "no model data at s3://models/llm/other.tar.gz" in capsys.readouterr().err
    assert not emulator.actions("SageMaker.CreateModel")
    assert main(["deploy", "sagemaker", "--role", ROLE, "--model-data", "s3://models/llm/model.tar.gz", *BASE]) == 0
    name = aws.client("sagemaker").describe_endpoint(EndpointName="llm")["EndpointConfigName"]
    model = aws.client("sagemaker").describe_model(ModelName=name)
    assert model["PrimaryContainer"]["ModelDataUrl"] == "s3://models/llm/model.tar.gz"


def test_role_of_assumed_role_credentials(aws, emulator, monkeypatch):
    trust = {
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}
        ]
    }
    iam = aws.client("iam")
    role = iam.create_role(RoleName="Deployer", Path="/service-role/", AssumeRolePolicyDocument=json.dumps(trust))
    credentials = aws.client("sts").assume_role(RoleArn=role["Role"]["Arn"], RoleSessionName="ci")["Credentials"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", credentials["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", credentials["SecretAccessKey"])
    monkeypatch.setenv("AWS_SESSION_TOKEN", credentials["SessionToken"])
    assert main(["deploy", "sagemaker", "--hf-model-id", "org/model", *BASE]) == 0
    sagemaker = aws.client("sagemaker")
    name = sagemaker.describe_endpoint(EndpointName="llm")["EndpointConfigName"]
    expected = f"arn:aws:iam::{ACCOUNT}:role/service-role/Deployer"
    assert sagemaker.describe_model(ModelName=name)["ExecutionRoleArn"] == expected


def test_plain_user_credentials_need_a_role(aws, capsys, monkeypatch):
    assert main(["deploy", "sagemaker", "--hf-model-id", "org/model", *BASE]) == 1
    assert "no execution role" in capsys.readouterr().err
    monkeypatch.setenv("SAGEMAKER_ROLE_ARN", ROLE)
    assert main(["deploy", "sagemaker", "--hf-model-id", "org/model", *BASE]) == 0


def test_usage_errors(aws, capsys):
    assert main(["deploy", "sagemaker", "--hf-model-id", "x", "--role", ROLE, *BASE, "--startup-timeout", "9000"]) == 2
    assert "--startup-timeout must be within 60..3600" in capsys.readouterr().err
    assert main(["deploy", "status", "--endpoint", "nope"]) == 1
    assert "no endpoint nope in us-west-2" in capsys.readouterr().err
    assert main(["deploy", "autoscale", "--endpoint", "bad_name", "--off"]) == 2
    assert main(["deploy", "sagemaker", "--hf-model-id", "x", "--role", ROLE, *BASE, "--env", "NOEQUALS"]) == 2


def test_no_region(aws, monkeypatch, capsys):
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    assert main(["deploy", "status", "--endpoint", "llm"]) == 1
    assert "no AWS region" in capsys.readouterr().err
    assert main(["deploy", "status", "--endpoint", "llm", "--region", REGION]) == 1
    assert "no endpoint llm in us-west-2" in capsys.readouterr().err


def test_update_from_a_hub_model_to_uploaded_files(aws, emulator, tmp_path, capsys):
    assert _hub("--env", "HF_TOKEN=secret", "--env", "OPTION_DTYPE=bf16") == 0
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "serving.properties").write_text("option.rolling_batch=lmi\n")
    update = ["deploy", "update", "--endpoint", "llm", "--model-dir", str(model_dir), "--unset-env", "HF_TOKEN"]
    assert main(update + ["--bucket", "fresh", "--instance-count", "3", *FAST]) == 1
    assert "NoSuchBucket" in capsys.readouterr().err
    aws.client("s3").create_bucket(Bucket="fresh", CreateBucketConfiguration={"LocationConstraint": REGION})
    assert main(update + ["--bucket", "fresh", "--instance-count", "3", *FAST]) == 0
    sagemaker = aws.client("sagemaker")
    name = sagemaker.describe_endpoint(EndpointName="llm")["EndpointConfigName"]
    container = sagemaker.describe_model(ModelName=name)["PrimaryContainer"]
    [key] = [o["Key"] for o in aws.client("s3").list_objects_v2(Bucket="fresh")["Contents"]]
    assert container == {"Image": IMAGE, "Environment": {"OPTION_DTYPE": "bf16"}, "ModelDataUrl": f"s3://fresh/{key}"}
    [variant] = sagemaker.describe_endpoint_config(EndpointConfigName=name)["ProductionVariants"]
    assert (variant["InstanceType"], variant["InitialInstanceCount"]) == ("ml.g4dn.xlarge", 3)

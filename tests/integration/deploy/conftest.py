import boto3
import pytest

from tests.aws.moto_server import AwsEmulator

REGION = "us-west-2"
ACCOUNT = "123456789012"
IMAGE = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/lmiserve:0.1.0"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/SageMakerRole"
FAST = ["--poll-interval", "0"]  # the emulator settles after two DescribeEndpoint calls


@pytest.fixture(scope="session")
def emulator():
    server = AwsEmulator().start()
    yield server
    server.stop()


@pytest.fixture
def aws(emulator, monkeypatch, tmp_path):
    """Standard AWS configuration pointing at the emulator, fake credentials, no user config."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "SAGEMAKER_ROLE_ARN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # nothing but the emulator is ever asked
    monkeypatch.setenv("AWS_ENDPOINT_URL", emulator.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    emulator.reset()
    yield boto3.Session(region_name=REGION)
    emulator.reset()

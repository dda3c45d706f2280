"""AWS access for the deploy commands: the boto3 session, the account, the default bucket, the role.

Region, credentials and endpoints come from the standard AWS configuration (environment variables,
``~/.aws/config`` profiles, instance or container roles; ``AWS_ENDPOINT_URL`` included), with
``--region`` / ``--profile`` as overrides.
"""

from __future__ import annotations

import os
from typing import Any

ROLE_ENV = "SAGEMAKER_ROLE_ARN"


class DeployError(Exception):
    """A deployment step cannot go on; the message says why, for the user."""


def error_text(exc: BaseException) -> str:
    """A one-line account of a boto3/botocore failure."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and "Error" in response:
        error = response["Error"]
        return f"{error.get('Code', 'Error')}: {error.get('Message', '')}"
    return str(exc)


def is_not_found(exc: BaseException) -> bool:
    """SageMaker answers a missing endpoint, configuration or model with ValidationException "Could not find"."""
    error = (getattr(exc, "response", None) or {}).get("Error", {})
    return error.get("Code") == "ValidationException" and "could not find" in str(error.get("Message", "")).lower()


def _client(service: str) -> Any:
    """A property for the session's client of ``service`` (made once, on first use)."""
    return property(lambda self: self.client(service))


class Aws:
    """One boto3 session and its clients."""

    def __init__(self, region: str | None = None, profile: str | None = None) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise DeployError("the deploy commands need boto3: pip install 'lmiserve[deploy]'") from exc
        self.session = boto3.Session(region_name=region, profile_name=profile)
        if not self.session.region_name:
            raise DeployError("no AWS region: set AWS_DEFAULT_REGION (or a profile's region), or pass --region")
        self._config = Config(retries={"mode": "standard", "max_attempts": 8}, user_agent_extra="lmiserve")
        self._clients: dict[str, Any] = {}
        self._identity: dict | None = None

    @property
    def region(self) -> str:
        return self.session.region_name

    def client(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = self.session.client(service, config=self._config)
        return self._clients[service]

    sagemaker = _client("sagemaker")
    runtime = _client("sagemaker-runtime")
    autoscaling = _client("application-autoscaling")
    s3 = _client("s3")

    def identity(self) -> dict:
        if self._identity is None:
            self._identity = self.client("sts").get_caller_identity()
        return self._identity

    def default_bucket(self) -> str:
        """``sagemaker-REGION-ACCOUNT`` (the bucket SageMaker's own tools use), created when missing."""
        from botocore.exceptions import ClientError

        bucket = f"sagemaker-{self.region}-{self.identity()['Account']}"
        try:
            self.s3.head_bucket(Bucket=bucket)
            return bucket
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code not in ("404", "NoSuchBucket", "NotFound"):
                raise DeployError(f"cannot use the default bucket {bucket} ({error_text(exc)}); pass --bucket") from exc
        create: dict[str, Any] = {"Bucket": bucket}
        if self.region != "us-east-1":
            create["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        self.s3.create_bucket(**create)
        return bucket

    def execution_role(self, explicit: str | None) -> str:
        """The role SageMaker runs the endpoint with.

        ``--role``, else ``$SAGEMAKER_ROLE_ARN``, else the IAM role behind the current credentials when
        they are an assumed role (a SageMaker notebook or Studio, a CI job with a role).
        """
        if explicit:
            return explicit
        if os.environ.get(ROLE_ENV):
            return os.environ[ROLE_ENV]
        arn = self.identity()["Arn"]
        role = role_from_assumed_role(arn)
        if role is None:
            raise DeployError(
                f"no execution role: the credentials are {arn}, not a role; "
                f"pass --role ARN (a role SageMaker may assume) or set {ROLE_ENV}"
            )
        from botocore.exceptions import ClientError

        partition, account, name = role
        try:  # the role's own ARN carries its path, which the session ARN leaves out
            return self.client("iam").get_role(RoleName=name)["Role"]["Arn"]
        except ClientError:  # no iam:GetRole permission: the ARN without a path works for most roles
            return f"arn:{partition}:iam::{account}:role/{name}"


def role_from_assumed_role(arn: str) -> tuple[str, str, str] | None:
    """``arn:PARTITION:sts::ACCOUNT:assumed-role/NAME/SESSION`` -> (partition, account, name)."""
    parts = arn.split(":", 5)
    if len(parts) != 6 or parts[2] != "sts" or not parts[5].startswith("assumed-role/"):
        return None
    name = parts[5].split("/")[1]
    return parts[1], parts[4], name

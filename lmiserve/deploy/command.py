"""``lmiserve deploy ...`` and ``lmiserve invoke``: arguments, and what each subcommand does."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .autoscaling import DEFAULT_SCALE_IN_COOLDOWN, DEFAULT_SCALE_OUT_COOLDOWN
from .spec import DEFAULT_DOWNLOAD_TIMEOUT, DEFAULT_STARTUP_TIMEOUT, ROUTING


def _log(line: str) -> None:
    print(line, flush=True)


def _aws_flags() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("AWS (default: the standard AWS configuration)")
    group.add_argument("--region", help="AWS region (default: AWS_DEFAULT_REGION or the profile's region)")
    group.add_argument("--profile", help="named profile from ~/.aws/config")
    return parent


def _wait_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-wait", action="store_true", help="return once SageMaker has accepted the request")
    parser.add_argument("--poll-interval", type=float, default=15.0, metavar="S", help="seconds between checks (15)")
    parser.add_argument(
        "--wait-timeout", type=float, metavar="S", help="give up waiting after S seconds (download + start-up + 900)"
    )


def _model_flags(parser: argparse.ArgumentParser, required: bool) -> None:
    source = parser.add_mutually_exclusive_group(required=required)
    source.add_argument("--model-dir", type=Path, help="local model directory: uploaded to S3")
    source.add_argument(
        "--model-data", metavar="S3_URI", help="model already in S3: s3://.../model.tar.gz, or s3://.../prefix/"
    )
    source.add_argument(
        "--model-id",
        "--hf-model-id",
        dest="hf_model_id",
        metavar="ID",
        help="no model data: the container downloads HF_MODEL_ID (a Hub id, or s3://...); "
        "give a gated repository's token with --env HF_TOKEN=...",
    )
    parser.add_argument("--image", required=required, metavar="URI", help="the lmiserve image in ECR")
    parser.add_argument("--instance-type", required=required, metavar="T", help="e.g. ml.g5.2xlarge")
    parser.add_argument("--instance-count", type=int, default=1 if required else None, metavar="N")
    parser.add_argument(
        "--role", metavar="ARN", help="execution role (default: $SAGEMAKER_ROLE_ARN, else the caller's role)"
    )
    parser.add_argument("--env", action="append", metavar="KEY=VALUE", help="container environment (repeatable)")
    parser.add_argument("--bucket", help="bucket for --model-dir (default: sagemaker-REGION-ACCOUNT)")
    parser.add_argument("--prefix", default="lmiserve", help="key prefix for --model-dir uploads (lmiserve)")
    parser.add_argument(
        "--uncompressed", action="store_true", help="upload --model-dir's files under a prefix, not as model.tar.gz"
    )
    default = (lambda value: value) if required else (lambda value: None)
    for flag, field, value in (
        ("--startup-timeout", "ContainerStartupHealthCheckTimeoutInSeconds", DEFAULT_STARTUP_TIMEOUT),
        ("--download-timeout", "ModelDataDownloadTimeoutInSeconds", DEFAULT_DOWNLOAD_TIMEOUT),
    ):
        parser.add_argument(flag, type=int, default=default(value), metavar="S", help=f"{field}, 60..3600 ({value})")
    parser.add_argument("--volume-size", type=int, metavar="GB", help="EBS volume per instance (types without NVMe)")
    parser.add_argument(
        "--routing",
        choices=sorted(ROUTING),
        default=default("least-outstanding"),
        help="how SageMaker spreads requests over instances (least-outstanding)",
    )


def add_deploy_arguments(parser: argparse.ArgumentParser) -> None:
    aws = _aws_flags()
    sub = parser.add_subparsers(dest="deploy_command", required=True)

    create = sub.add_parser("sagemaker", parents=[aws], help="create a SageMaker endpoint serving lmiserve")
    create.add_argument("--endpoint", required=True, metavar="NAME")
    _model_flags(create, required=True)
    _wait_flags(create)

    update = sub.add_parser("update", parents=[aws], help="blue/green update: what is not given stays as it is")
    update.add_argument("--endpoint", required=True, metavar="NAME")
    _model_flags(update, required=False)
    update.add_argument("--unset-env", action="append", metavar="KEY", help="drop a container variable (repeatable)")
    update.add_argument("--termination-wait", type=int, default=0, metavar="S", help="keep the old fleet S seconds")
    update.add_argument("--canary", type=int, metavar="PERCENT", help="shift this share of capacity first")
    update.add_argument("--canary-wait", type=int, default=600, metavar="S", help="seconds on the canary (600)")
    update.add_argument(
        "--keep-previous", action="store_true", help="keep the previous model and endpoint configuration"
    )
    _wait_flags(update)

    delete = sub.add_parser("delete", parents=[aws], help="delete the endpoint, its configuration and its model")
    delete.add_argument("--endpoint", required=True, metavar="NAME")
    delete.add_argument("--keep-config", action="store_true", help="keep the endpoint configuration")
    delete.add_argument("--keep-model", action="store_true", help="keep the model")

    status = sub.add_parser("status", parents=[aws], help="the endpoint's state, configuration and autoscaling")
    status.add_argument("--endpoint", required=True, metavar="NAME")

    scale = sub.add_parser("autoscale", parents=[aws], help="target-tracking autoscaling of the instance count")
    scale.add_argument("--endpoint", required=True, metavar="NAME")
    scale.add_argument("--min", type=int, dest="min_capacity", metavar="N", help="fewest instances")
    scale.add_argument("--max", type=int, dest="max_capacity", metavar="M", help="most instances")
    scale.add_argument(
        "--target", type=float, metavar="INVOCATIONS", help="invocations per instance per minute to hold"
    )
    scale.add_argument(
        "--scale-in-cooldown",
        type=int,
        default=DEFAULT_SCALE_IN_COOLDOWN,
        metavar="S",
        help=f"seconds between removing instances ({DEFAULT_SCALE_IN_COOLDOWN})",
    )
    scale.add_argument(
        "--scale-out-cooldown",
        type=int,
        default=DEFAULT_SCALE_OUT_COOLDOWN,
        metavar="S",
        help=f"seconds between adding instances ({DEFAULT_SCALE_OUT_COOLDOWN})",
    )
    scale.add_argument("--off", action="store_true", help="remove the endpoint's autoscaling")


def add_invoke_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", required=True, metavar="NAME")
    body = parser.add_mutually_exclusive_group(required=True)
    body.add_argument("--body", help="the request body (JSON)")
    body.add_argument("--file", help="read the request body from a file ('-': standard input)")
    parser.add_argument("--stream", action="store_true", help="InvokeEndpointWithResponseStream, line by line")
    parser.add_argument("--content-type", default="application/json")
    parser.add_argument("--accept")
    parser.add_argument("--custom-attributes", help="X-Amzn-SageMaker-Custom-Attributes")
    parser.add_argument("--target-variant")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the answer's headers to stderr")


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """Add ``deploy`` and ``invoke`` to the ``lmiserve`` command."""
    deploy = sub.add_parser("deploy", help="deploy to SageMaker: create, update, autoscale, delete endpoints")
    add_deploy_arguments(deploy)
    invoke = sub.add_parser("invoke", parents=[_aws_flags()], help="call a SageMaker endpoint")
    add_invoke_arguments(invoke)


def run(args: argparse.Namespace) -> int:
    """Run ``deploy ...`` or ``invoke``; errors become one line on stderr and the exit status."""
    try:
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        print(f"lmiserve: {args.command} needs boto3: pip install 'lmiserve[deploy]'", file=sys.stderr)
        return 2
    from . import actions
    from .aws import DeployError, error_text

    try:
        if args.command == "invoke":
            return actions.invoke(args)
        return actions.deploy(args, _log)
    except ValueError as exc:
        print(f"lmiserve: {exc}", file=sys.stderr)
        return 2
    except DeployError as exc:
        print(f"lmiserve: {exc}", file=sys.stderr)
        return 1
    except (ClientError, BotoCoreError, Boto3Error) as exc:
        print(f"lmiserve: {error_text(exc)}", file=sys.stderr)
        return 1

"""What ``lmiserve deploy <subcommand>`` and ``lmiserve invoke`` do with their parsed arguments."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from . import autoscaling, endpoint
from .aws import Aws, DeployError
from .model_data import check_model_data, parse_s3_uri, upload_model_dir
from .spec import ROUTING, DeploymentSpec, parse_env, resource_name

Log = Callable[[str], None]
_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")


def deploy(args: argparse.Namespace, log: Log) -> int:
    _check_name(args.endpoint)
    aws = Aws(args.region, args.profile)
    command = args.deploy_command
    if command == "sagemaker":
        return _create(aws, args, log)
    if command == "update":
        return _update(aws, args, log)
    if command == "delete":
        endpoint.delete(aws, args.endpoint, keep_config=args.keep_config, keep_model=args.keep_model, log=log)
        return 0
    if command == "status":
        for line in endpoint.status_lines(aws, args.endpoint):
            log(line)
        return 0
    if command == "autoscale":
        return _autoscale(aws, args, log)
    raise ValueError(f"unknown deploy command {command}")  # pragma: no cover - argparse refuses it first


def _create(aws: Aws, args: argparse.Namespace, log: Log) -> int:
    if endpoint.find_endpoint(aws.sagemaker, args.endpoint) is not None:
        raise DeployError(f"endpoint {args.endpoint} exists; change it with: lmiserve deploy update --endpoint ...")
    env = parse_env(args.env)
    if args.hf_model_id:
        env["HF_MODEL_ID"] = args.hf_model_id
    role = aws.execution_role(args.role)
    spec = DeploymentSpec(
        endpoint=args.endpoint,
        image=args.image,
        role_arn=role,
        instance_type=args.instance_type,
        instance_count=args.instance_count,
        model_data=None,
        env=env,
        startup_timeout=args.startup_timeout,
        download_timeout=args.download_timeout,
        volume_size=args.volume_size,
        routing=ROUTING[args.routing],
    )
    _check_spec(spec)
    spec = spec.replace(model_data=_model_data(aws, args, log))
    return 0 if endpoint.create(aws, spec, _waiting(args), log) else 1


def _update(aws: Aws, args: argparse.Namespace, log: Log) -> int:
    current = endpoint.load_current(aws, args.endpoint)
    spec = current.spec
    env = dict(spec.env)
    env.update(parse_env(args.env))
    for key in args.unset_env or []:
        env.pop(key, None)
    changes: dict = {
        "image": args.image,
        "instance_type": args.instance_type,
        "instance_count": args.instance_count,
        "role_arn": args.role,
        "startup_timeout": args.startup_timeout,
        "download_timeout": args.download_timeout,
        "volume_size": args.volume_size,
        "routing": ROUTING[args.routing] if args.routing else None,
    }
    changes = {k: v for k, v in changes.items() if v is not None}
    if args.hf_model_id:
        env["HF_MODEL_ID"] = args.hf_model_id
        changes["model_data"] = None
    elif args.model_dir or args.model_data:
        env.pop("HF_MODEL_ID", None)
    new = spec.replace(env=env, **changes)
    if args.canary is not None and not 1 <= args.canary <= 100:
        raise ValueError("--canary is a percentage of the new fleet's capacity, 1..100")
    _check_spec(new)
    if args.model_dir or args.model_data:
        new = new.replace(model_data=_model_data(aws, args, log))
    if new == spec:
        log("nothing changed: redeploying the same settings (a re-pushed image tag is picked up)")
    ok = endpoint.update(
        aws,
        current,
        new,
        _waiting(args),
        termination_wait=args.termination_wait,
        canary_percent=args.canary,
        canary_wait=args.canary_wait,
        keep_previous=args.keep_previous,
        log=log,
    )
    return 0 if ok else 1


def _autoscale(aws: Aws, args: argparse.Namespace, log: Log) -> int:
    current = endpoint.load_current(aws, args.endpoint)
    variant = current.spec.variant
    if args.off:
        state = autoscaling.current(aws.autoscaling, args.endpoint, variant)
        if state is None:
            log(f"endpoint {args.endpoint} has no autoscaling")
        else:
            autoscaling.disable(aws.autoscaling, state)
            log(f"autoscaling of {args.endpoint}/{variant} removed ({autoscaling.describe(state)})")
        return 0
    missing = [
        flag
        for flag, value in (("--min", args.min_capacity), ("--max", args.max_capacity), ("--target", args.target))
        if value is None
    ]
    if missing:
        raise ValueError(f"autoscale needs {', '.join(missing)} (or --off)")
    autoscaling.enable(
        aws.autoscaling,
        args.endpoint,
        variant,
        args.min_capacity,
        args.max_capacity,
        args.target,
        scale_in_cooldown=args.scale_in_cooldown,
        scale_out_cooldown=args.scale_out_cooldown,
    )
    log(
        f"autoscaling {args.endpoint}/{variant}: {args.min_capacity}..{args.max_capacity} instances, "
        f"target {args.target:g} invocations per instance per minute"
    )
    return 0


def _model_data(aws: Aws, args: argparse.Namespace, log: Log) -> str | None:
    if args.model_dir:
        bucket = args.bucket or aws.default_bucket()
        prefix = f"{args.prefix.strip('/')}/{resource_name(args.endpoint)}"
        return upload_model_dir(aws.s3, args.model_dir, bucket, prefix, uncompressed=args.uncompressed, log=log)
    if args.model_data:
        parse_s3_uri(args.model_data)
        check_model_data(aws.s3, args.model_data, log)
        return args.model_data
    return None


def _waiting(args: argparse.Namespace) -> endpoint.WaitOptions:
    return endpoint.WaitOptions(wait=not args.no_wait, poll=args.poll_interval, timeout=args.wait_timeout)


def _check_name(name: str) -> None:
    if len(name) > 63 or not _NAME.match(name):
        raise ValueError(f"endpoint name {name!r}: letters, digits and single hyphens, at most 63 characters")


def _check_spec(spec: DeploymentSpec) -> None:
    if spec.instance_count < 1:
        raise ValueError("--instance-count must be >= 1")
    for flag, value in (("--startup-timeout", spec.startup_timeout), ("--download-timeout", spec.download_timeout)):
        if not 60 <= value <= 3600:
            raise ValueError(f"{flag} must be within 60..3600 seconds, not {value}")


def invoke(args: argparse.Namespace) -> int:
    from botocore.exceptions import ClientError

    from .invoke import Request, invoke_stream, stream_lines
    from .invoke import invoke as invoke_endpoint
    from .response_stream import ResponseStreamError

    if args.body is not None:
        body = args.body.encode()
    elif args.file == "-":
        body = sys.stdin.buffer.read()
    else:
        body = Path(args.file).read_bytes()
    aws = Aws(args.region, args.profile)
    request = Request(args.endpoint, body, args.content_type, args.accept, args.custom_attributes, args.target_variant)
    try:
        if args.stream:
            answer, chunks = invoke_stream(aws.runtime, request)
        else:
            answer = invoke_endpoint(aws.runtime, request)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ModelError":
            raise
        print(f"lmiserve: {_model_error(exc.response)}", file=sys.stderr)
        return 1
    _headers(answer, args.verbose)
    if args.stream:
        try:
            stream_lines(chunks, _emit)
        except ResponseStreamError as exc:
            print(f"lmiserve: the response stream failed: {exc}", file=sys.stderr)
            return 1
        return 0
    text = answer["Body"].decode("utf-8", errors="replace")
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()
    return 0


def _emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _headers(answer: dict, verbose: bool) -> None:
    if not verbose:
        return
    for key in ("ContentType", "InvokedProductionVariant", "CustomAttributes"):
        if answer.get(key):
            print(f"{key}: {answer[key]}", file=sys.stderr)


def _model_error(response: dict) -> str:
    """The container's own status and message, which SageMaker passes on in a ModelError."""
    error = response.get("Error", {})
    status = response.get("OriginalStatusCode") or error.get("OriginalStatusCode")
    message = response.get("OriginalMessage") or error.get("OriginalMessage") or error.get("Message", "")
    text = f"ModelError: the model answered {status}: {message}" if status else f"ModelError: {message}"
    log_stream = response.get("LogStreamArn") or error.get("LogStreamArn")
    return f"{text} (logs: {log_stream})" if log_stream else text

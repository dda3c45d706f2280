"""The ``lmiserve`` command."""

from __future__ import annotations

import argparse
import os
import sys

from .config import ConfigError, load_settings
from .config.loader import SPECS
from .cpu_isa import CpuIsaError, apply_torch_env


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-dir", help="model directory (default: /opt/ml/model when present, else .)")
    parser.add_argument("--properties", help="serving.properties file (default: MODEL_DIR/serving.properties)")
    for spec in SPECS:
        if spec.cli:
            parser.add_argument(
                spec.cli,
                dest="key:" + spec.key,
                metavar=spec.key.upper().replace(".", "_"),
                help=f"{spec.doc} ({spec.key})",
            )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lmiserve", description="LLM serving container in the style of SageMaker LMI."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the server")
    _add_model_flags(serve)
    config = sub.add_parser("config", help="configuration tools")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser("show", help="print the resolved settings and where each came from")
    _add_model_flags(show)
    from .bench.command import add_arguments

    bench = sub.add_parser("bench", help="load a running server at several concurrency levels and report")
    add_arguments(bench)
    from .deploy.command import add_subcommands

    add_subcommands(sub)
    return parser


def _settings(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    cli = {k[len("key:") :]: v for k, v in vars(args).items() if k.startswith("key:") and v is not None}
    return load_settings(args.model_dir, args.properties, cli=cli)


def settings_of(serve_argv: list[str]):  # type: ignore[no-untyped-def]
    """The settings ``lmiserve serve SERVE_ARGV`` resolves (the other API processes build theirs so)."""
    return _settings(_parser().parse_args(["serve", *serve_argv]))


def main(argv: list[str] | None = None) -> int:
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing is downloaded from a model hub at run time
    raw = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(raw)
    if args.command == "bench":
        from .bench.command import run as run_bench

        return run_bench(args)
    if args.command in ("deploy", "invoke"):
        from .deploy.command import run as run_deploy

        return run_deploy(args)
    try:
        # torch's and oneDNN's own kernels held to a forced CPU class, in this process and the
        # engine processes it starts: before anything imports torch
        apply_torch_env()
    except CpuIsaError as exc:
        print(f"lmiserve: {exc}", file=sys.stderr)
        return 2
    try:
        settings = _settings(args)
    except ConfigError as exc:
        print(f"lmiserve: {exc}", file=sys.stderr)
        return 2
    if args.command == "config":
        from .config.show import render

        print(render(settings))
        return 0
    from . import logs
    from .server.runner import run

    logs.configure(settings.server.log_level)
    return run(settings, raw[raw.index("serve") + 1 :])
